"""The training thread's wait for a collate thread's batch under the loader's ``timeout``
(``EpochIterator._result``), on futures whose outcome is set by hand: no threads, no sleeps."""

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from headrace.runtime.epoch import EpochIterator

LOADER = SimpleNamespace(timeout_s=1.0)  # what _result reads of the epoch


class FinishesAsTheWaitRunsOut(Future):
    """A collate call that returns just as the wait for it times out."""

    def result(self, timeout=None):
        if timeout is not None and not self.done():
            self.set_result("batch")
            raise TimeoutError()
        return super().result(timeout)


def test_a_batch_finished_as_the_wait_ran_out_is_the_batch():
    # it raised a bare TimeoutError (neither the batch nor torch's RuntimeError: a review)
    assert EpochIterator._result(LOADER, FinishesAsTheWaitRunsOut(), None) == "batch"


def test_a_collate_fns_own_timeout_error_is_its_own():
    own = Future()
    err = TimeoutError("the tokenizer server did not answer")
    own.set_exception(err)
    with pytest.raises(TimeoutError) as info:
        EpochIterator._result(LOADER, own, None)
    assert info.value is err


def test_a_collate_still_running_at_the_deadline_is_torchs_timeout():
    with pytest.raises(RuntimeError, match="timed out after 1.0 seconds"):
        EpochIterator._result(LOADER, Future(), 0.0)  # the deadline has passed


def test_a_call_cancelled_as_the_wait_ran_out_is_the_timeout():
    """loader.close() from another thread cancels queued collate calls: one cancelled as the
    wait ran out raised CancelledError out of future.exception() (a review)."""

    class CancelledAsTheWaitRunsOut(Future):
        def result(self, timeout=None):
            if timeout is not None and not self.done():
                self.cancel()
                raise TimeoutError()
            return super().result(timeout)

    with pytest.raises(RuntimeError, match="timed out"):
        EpochIterator._result(LOADER, CancelledAsTheWaitRunsOut(), None)
