"""``remote/starts.py``: the cause of a remote worker that never started, and when to stop."""

import pytest

from headrace.remote.starts import MAX_START_FAILURES, StartFailures, start_cause

# what Ray 2.x said (ActorDiedError's message) for a step's module missing on the node
UNPICKLE = ("The actor died because of an error raised in its creation task, "
            "\x1b[36mray::A.__init__()\x1b[39m (pid=5848, ip=192.0.2.2, actor_id=7da7)\n  At least one of the input "
            "arguments for this task could not be computed:\nray.exceptions.RaySystemError: "
            "System error: No module named 'onlyhere2'\ntraceback: Traceback (most recent call "
            "last):\n          ^^^^^^^^^^^^^\n           ^^^^^^^^^^^^\nModuleNotFoundError: No "
            "module named 'onlyhere2'")
RAISED = ("The actor died because of an error raised in its creation task, ray::W.__init__() "
          "(pid=1)\n  File \"/x/actor.py\", line 34, in __init__\n    import torch\n  File "
          "\"/x/torch/__init__.py\", line 2, in <module>\n    raise OSError('libcuda')\n"
          "OSError: libcuda")


@pytest.mark.timeout(10)
def test_cause_names_the_remote_exception_and_where():
    cause = start_cause("ActorDiedError", UNPICKLE)
    first = cause.splitlines()[0]
    assert first.startswith("ModuleNotFoundError: No module named 'onlyhere2'")
    assert "unpickling the pipeline" in first and "\x1b" not in cause and "^" not in cause
    assert start_cause("ActorDiedError", UNPICKLE.replace("5848", "6000")) == cause  # no pid
    raised = start_cause("ActorDiedError", "Traceback (most recent call last):\n" + RAISED)
    assert raised.splitlines()[0] == "OSError: libcuda (raised on the remote worker's node in " \
        "its constructor)"
    assert "raise OSError('libcuda')" in raised  # the traceback's last frames
    died = start_cause("ActorDiedError", "The actor died unexpectedly.\n\tpid: 3\nnode lost")
    assert died == "ActorDiedError: The actor died unexpectedly. (node lost)"


@pytest.mark.timeout(10)
def test_gives_up_after_failures_in_a_row_only():
    s = StartFailures()
    assert s.failed("E: x") == (True, False)  # a new cause: reported
    assert s.failed("E: x") == (False, False)
    s.started()  # one started: the run is broken
    for _ in range(MAX_START_FAILURES - 1):
        assert s.failed("E: x") == (False, False) and not s.gave_up
    assert s.failed("E: y") == (True, True) and s.gave_up
    assert s.total == MAX_START_FAILURES + 2


@pytest.mark.timeout(10)
def test_cause_is_the_first_of_the_failures_in_a_row_until_one_starts():
    # it was the latest cause whenever that differed, and stayed after a start
    s = StartFailures()
    s.failed("E: x")
    assert s.failed("E: y") == (True, False) and s.cause == "E: x"
    s.started()
    assert s.cause is None  # explain() no longer says remote workers could not start
    assert s.failed("E: y") == (False, False)  # the latest cause: reported already
    s.failed("E: x")
    assert s.failed("E: z") == (True, True) and s.cause == "E: y"
    assert f"{MAX_START_FAILURES} in a row ended before returning a sample, the first with " \
        "E: y." in s.message("auto")


@pytest.mark.timeout(10)
def test_a_worker_starts_at_its_first_result_not_when_placed():
    # a placed worker lost before any result failed to start: it was counted started once
    # placed, which reset the count, and a failure hitting every worker after placement was
    # replaced once a second for ever
    s = StartFailures()
    for slot in range(MAX_START_FAILURES):
        s.placed(slot)
        assert s.lost(slot)  # nothing returned: the caller reports it
        s.failed("E: crash", placed=True)
    assert s.gave_up and s.ended_first == MAX_START_FAILURES and s.total == 0
    s = StartFailures()
    s.placed(1)
    s.failed("E: x")
    s.returned(1)  # a result: the failures before it are not in a row any more
    assert s.in_a_row == 0 and s.cause is None
    assert not s.lost(1)  # lost after a result: a lost worker, not a failed start


class _Handle:
    def __init__(self, ready: bool) -> None:
        self.external, self.retiring, self.ready = True, False, ready


class _Pool:
    closed = False

    def __init__(self, *ready: bool) -> None:
        self.workers = {k: _Handle(r) for k, r in enumerate(ready)}


@pytest.mark.timeout(10)
def test_required_fails_only_once_no_remote_worker_runs():
    # three replacements that died starting (a bad node) ended the epoch while eight remote
    # workers ran: required=True asks for remote workers, and it has them
    import headrace as hr
    from headrace.errors import RemoteUnavailableError
    from headrace.remote.session import RemoteSession
    from headrace.runtime.work import Fatal

    session = RemoteSession(hr.Remote(required=True))
    session.available = True  # joined (no cluster here: the rule alone)
    for _ in range(MAX_START_FAILURES):
        session.starts.failed("ModuleNotFoundError: No module named 'x'")
    assert session.starts.gave_up
    session.on_tick(_Pool(True, True))  # remote workers run: no more started, no error
    with pytest.raises(Fatal) as e:
        session.on_tick(_Pool(False))  # none runs: the cause, as an error
    assert isinstance(e.value.error, RemoteUnavailableError)
