"""A real ``redis-server`` for tests: free loopback port, private data dir, no persistence."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process; ``kill()`` and ``start()`` again on the same port.
    ``extra``: more command-line settings (``"--unixsocket", path``)."""

    def __init__(self, *extra: str) -> None:
        self.exe = shutil.which("redis-server")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="hr-redis-")
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.exe is not None
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "no", "--protected-mode", "yes", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # bounded: until it answers PING or the deadline
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)  # polling a process we do not control; not a synchronisation

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushdb()
