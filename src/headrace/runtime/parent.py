"""Whether the training process that started this worker process is still there."""

from __future__ import annotations

import os


def parent_gone(parent_pid: int) -> bool:
    """The training process ``parent_pid`` has exited.

    With ``fork`` and ``spawn`` it is this process's parent, and a changed parent (the orphan
    was adopted) is the cheap answer. With ``forkserver`` the parent is the fork server, never
    the training process: asking the parent alone made every worker of such a loader take its
    idle wait for the training process's death, exit, and remove the live cache on its way out;
    there the training process's pid itself is asked (a signal-0 ``kill``, about a µs)."""
    if os.getppid() == parent_pid:
        return False
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's (a reused pid): not ours to judge
        return False
    return False
