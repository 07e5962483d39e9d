"""Whether the training process that started this worker process is still there."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any


def parent_gone(parent_pid: int) -> bool:
    """The training process ``parent_pid`` has exited.

    With ``fork`` and ``spawn`` it is this process's parent, and an unchanged parent is the
    cheap answer. With ``forkserver`` the parent is the fork server, never the training
    process: asking the parent alone made every worker of such a loader take its idle wait for
    the training process's death, exit, and remove the live cache on its way out; there, and
    once an orphan was adopted, the training process's pid itself is asked (a signal-0
    ``kill``, about a µs), and a process that exited but was not reaped yet (a zombie, about
    20 µs to read) counts as gone: a training process killed under a launcher that reads its
    output to the end before it reaps it (``subprocess.run(capture_output=True)``,
    ``communicate()``) stayed a zombie for as long as the workers held the output pipes open,
    which was for ever (torch's workers exit: their parent changed)."""
    if os.getppid() == parent_pid:
        return False
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's (a reused pid): not ours to judge
        return False
    return _exited(parent_pid)


def _exited(pid: int) -> bool:
    """Whether ``pid`` exited and waits to be reaped (``/proc``'s state ``Z``, or ``X`` while
    it is reaped); False where ``/proc`` cannot tell (another system: alive, as before)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 1:].split()[:1]  # after the name, which may hold spaces
    return state in ([b"Z"], [b"X"])


PARENT_CHECK_S = 1.0
"""Seconds between two checks, by a worker process's watchdog thread, that the training process
is still there."""


def exit_when_parent_gone(parent_pid: int, clean_up: Callable[[], Any] | None = None,
                          every_s: float = PARENT_CHECK_S) -> threading.Thread:
    """Start a daemon thread that ends this worker process (``os._exit``) within ``every_s``
    seconds of the training process ``parent_pid`` going away, after ``clean_up()``.

    The worker's own loop sees the training process go only while it waits for work. A worker
    stuck in ``worker_init_fn`` or in a long step outlived a killed training process (one found
    asleep in its ``worker_init_fn`` 10 minutes after the training process was gone, adopted by
    init, holding what it had loaded); torch's workers check only in their loop too. The
    thread sleeps between checks and takes the GIL only for them (``parent_gone``: a µs)."""

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if parent_gone(parent_pid):
                try:
                    if clean_up is not None:
                        clean_up()
                finally:
                    os._exit(0)

    t = threading.Thread(target=watch, name="headrace-parent-watch", daemon=True)
    t.start()
    return t
