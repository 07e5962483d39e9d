"""How a dead worker is put in words: its exit code, the samples it held."""

from headrace.runtime.deaths import SHOWN, shown_indices
from headrace.runtime.work import Rec, how_it_ended, likely_cause, start_death_error
from headrace.runtime.worker import Task


def _rec(index: int) -> Rec:
    return Rec(position=index, index=index, task=Task(index, index, 0, None, 0, 0, False))


def test_a_negative_exit_code_is_named_as_its_signal():
    assert how_it_ended(-6) == "killed by SIGABRT"
    assert how_it_ended(-9) == "killed by SIGKILL"
    assert how_it_ended(-200) == "killed by signal 200"
    assert how_it_ended(3) == "exit code 3"
    assert how_it_ended(None) == "exit code unknown"
    assert "native code crashed" in likely_cause(-11)
    assert "out-of-memory" in likely_cause(-9)
    assert "os._exit" in likely_cause(0)


def test_the_restart_warning_lists_the_first_samples_and_counts_the_rest():
    assert shown_indices([]) == ""
    assert shown_indices([_rec(3), _rec(7)]) == ": indices [3, 7]"
    many = [_rec(i) for i in range(SHOWN + 5)]
    assert shown_indices(many) == f": indices [{', '.join(map(str, range(SHOWN)))}] and 5 more"


def test_a_worker_dying_at_start_under_spawn_points_at_the_main_guard():
    # under spawn or forkserver, a script without `if __name__ == "__main__":` made every
    # worker fail at start, and the error named only worker_init_fn or the dataset's setup
    # (a bug hunt's find)
    assert "__main__" not in str(start_death_error(0, 3, 1, "fork"))
    for method in ("spawn", "forkserver"):
        text = str(start_death_error(0, 3, None, method))
        assert f"under the '{method}' start method" in text
        assert "if __name__ == '__main__':" in text
