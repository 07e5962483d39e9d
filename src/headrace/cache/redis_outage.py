"""What a process does while its Redis server fails (``redis_backend``).

A call that fails (server gone, timeout) makes this process skip the server for its next
``SKIP_CALLS`` calls (samples run uncached meanwhile, counted by the client); the call after
that tries again and reconnects through redis-py's pool. Nothing is lost: a missed lookup is a
recomputation. Counted in calls, not seconds, so a test can restart the server and know when
the loader will be back without sleeping.

A skipped call's ``BackendDown`` names the failure that started the outage: a worker forked
while the training process skipped the server inherits the count, and its first error, the
one the loader logs, said only "failed recently" where the cause was "Connection refused".
"""

from __future__ import annotations

from headrace.cache.config import redact

SKIP_CALLS = 16
"""After a failure, calls this process answers as failed without trying the server."""


class BackendDown(ConnectionError):
    """The server failed recently; this process is not trying it again yet. The message
    names the server and the failure that started the outage."""


class Outage:
    """One process's count of the calls it still answers as failed (``left``, calls), and
    the failure that started it (``cause``: "type: message", passwords redacted)."""

    def __init__(self) -> None:
        self.left = 0
        self.cause = ""

    def check(self, where: str) -> None:
        """Raise ``BackendDown`` naming ``where`` (the server, its password redacted) while
        calls are left to skip; each such call counts one."""
        if self.left > 0:
            self.left -= 1
            raise BackendDown(f"{where} failed recently ({self.cause}); trying again in "
                              f"{self.left} calls")

    def failed(self, e: BaseException) -> None:
        """A call to the server failed with ``e``: skip the next ``SKIP_CALLS``."""
        self.left = SKIP_CALLS
        self.cause = f"{type(e).__name__}: {redact(str(e))}"
