"""One bit per epoch position: which samples of the epoch have been delivered."""

from __future__ import annotations

import base64
import zlib


class Bitmap:
    """A growable bitmap (bytearray), the only per-sample state the loader keeps."""

    __slots__ = ("_bits", "count")

    def __init__(self, data: bytes = b"", count: int = 0) -> None:
        self._bits = bytearray(data)
        self.count = count
        """Number of bits set."""

    def set(self, i: int) -> bool:
        """Set bit ``i``; returns False when it was already set."""
        byte, bit = divmod(i, 8)
        if byte >= len(self._bits):
            self._bits.extend(b"\x00" * (byte + 1 - len(self._bits)))
        m = 1 << bit
        if self._bits[byte] & m:
            return False
        self._bits[byte] |= m
        self.count += 1
        return True

    def clear(self, i: int) -> None:
        """Clear bit ``i`` (a batch whose delivery was interrupted: ``EpochBase.deliver``)."""
        byte, bit = divmod(i, 8)
        m = 1 << bit
        if byte < len(self._bits) and self._bits[byte] & m:
            self._bits[byte] &= ~m & 0xFF
            self.count -= 1

    def __contains__(self, i: int) -> bool:
        byte, bit = divmod(i, 8)
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << bit))

    def end(self) -> int:
        """1 + the highest bit set (0: none)."""
        bits = self._bits.rstrip(b"\x00")
        return (len(bits) - 1) * 8 + bits[-1].bit_length() if bits else 0

    def copy(self) -> Bitmap:
        return Bitmap(bytes(self._bits), self.count)

    def raw(self) -> bytes:
        """The bits: bit ``i`` is ``1 << i % 8`` of byte ``i // 8``."""
        return bytes(self._bits)

    def to_str(self) -> str:
        """Compact, JSON-friendly text (zlib + base64)."""
        return base64.b64encode(zlib.compress(bytes(self._bits))).decode("ascii")

    @classmethod
    def from_str(cls, s: str) -> Bitmap:
        data = zlib.decompress(base64.b64decode(s.encode("ascii")))
        return cls(data, sum(bin(b).count("1") for b in data))
