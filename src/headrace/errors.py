"""Exceptions raised by headrace. Every error says where it happened and how to fix it."""

from __future__ import annotations

import contextlib
import pickle
import types
from typing import Any

__all__ = [
    "HeadraceError",
    "IterablePositionWarning",
    "LoaderClosedError",
    "PipelineError",
    "RemoteUnavailableError",
    "StateDictError",
    "StepError",
    "WorkerDiedError",
]


class HeadraceError(Exception):
    """Base class of every error headrace raises itself."""


class PipelineError(HeadraceError, ValueError):
    """A pipeline, step or source was declared in a way headrace cannot run."""


class StateDictError(HeadraceError, ValueError):
    """A state dict cannot be loaded into this loader (other dataset, other version, corrupt)."""


class ReplayOrderWarning(UserWarning):
    """A resumed epoch's sampler gave another order than the saved epoch's
    (``runtime/order_digest.py``): it may deliver some samples twice and others never."""


class IterablePositionWarning(UserWarning):
    """``load_state_dict()`` on a loader over an ``IterableDataset`` with a state saved part-way
    through an epoch: an IterableDataset's position cannot be restored (torch's iterator runs
    the dataset's own ``__iter__``), so the next ``iter(loader)`` starts that epoch over, as a
    resumed run does with torch's DataLoader (``runtime/iterable_dataset.py``)."""


class LoaderClosedError(HeadraceError, RuntimeError):
    """``next()`` on an iterator whose epoch ``loader.close()`` stopped part-way (the message
    says how much of the epoch was delivered and how much was not): a ``StopIteration`` there
    passed for the epoch's end, and a training loop went on without the rest."""


class RemoteUnavailableError(HeadraceError, ConnectionError):
    """The Ray cluster named by ``Remote(address=...)`` could not be joined, or no remote worker
    could start on it (the message names the address, the cause and how to fix it;
    ``Remote(required=False)`` runs on local workers instead)."""


class UnevenRanksError(HeadraceError, RuntimeError):
    """A DDP rank cannot yield the ``len(loader)`` batches every rank takes: under
    ``on_error="skip"`` it delivered no batch in the epoch, so it has none to repeat, and ending
    short would leave the other ranks waiting in their next collective forever
    (``runtime/padding.py``)."""


class WorkerDiedError(HeadraceError, RuntimeError):
    """A worker process died and the loader could not recover the samples it held, or failed
    to start (:func:`worker_start_error`: then also an instance of what ``worker_init_fn``
    raised, as torch re-raises it)."""

    def __init__(self, message: str) -> None:
        # not super(): in a class mixed with the user's exception type that would call its
        # __init__, whose arguments are the user's, not this message
        Exception.__init__(self, message)

    def __str__(self) -> str:  # the message, also when mixed with OSError (whose str() differs)
        return BaseException.__str__(self)

    def __reduce__(self):
        return (worker_start_error, (getattr(type(self), "_headrace_original", None), str(self)))


TRANSPORT_STEP = "transport"
"""The step a :class:`StepError` names when a sample ran every step but could not be sent from
its worker process to the training process (it does not pickle, /dev/shm is full:
``runtime/outbox.py``)."""


class StepError(HeadraceError):
    """A step failed on one sample.

    Attributes:
        index: the dataset index of the sample (what the sampler yielded); for
            ``collate_fn``, the batch's first (the message lists them all), ``None`` on an
            empty batch (a user ``batch_sampler`` may yield ``[]``).
        step: the name of the step that raised (``"load"`` for ``Source.load`` / ``__getitem__``,
            ``"transport"`` for a sample that could not be sent from its worker process).
        worker: the worker slot that ran it (``None`` in the main process).
        cause_type: qualified name of the original exception type.
        remote_traceback: the original traceback, formatted in the process that raised it.
    """

    def __init__(
        self,
        index: int | None,
        step: str,
        cause_type: str,
        message: str,
        remote_traceback: str = "",
        worker: int | None = None,
    ) -> None:
        self.index = index
        self.step = step
        self.worker = worker
        self.cause_type = cause_type
        self.cause_message = message
        self.remote_traceback = remote_traceback
        where = f"worker {worker}" if worker is not None else "the main process"
        what = ("a batch of no sample" if index is None
                else f"a batch (its first sample index {index})" if step == "collate_fn"
                else f"sample index {index}")  # a batch's indices follow in collate's message
        text = f"step {step!r} failed on {what} in {where}: {cause_type}: {message}"
        if remote_traceback:
            text += f"\n\nOriginal traceback:\n{remote_traceback.rstrip()}"
        if step == "collate_fn":  # on_error="skip" drops samples, never a batch: advising it
            # here changed nothing, also where it was set (a bug hunt's find)
            text += ("\n\nFix the collate_fn or the samples it is given (on_error='skip' drops "
                     "failing samples, not batches).")
        elif step != TRANSPORT_STEP:  # a transport failure's message says what to change:
            # skipping every sample that cannot be sent drops the whole epoch, silently
            text += (
                "\n\nFix the step or the sample, or pass "
                "options=headrace.Options(on_error='skip') to drop failing samples (they are "
                "counted in loader.stats())."
            )
        # not super(): in StepError[T] that would call T's __init__, whose arguments (a path
        # and a code, keyword-only ones) are the user's, not this message
        Exception.__init__(self, text)
        if isinstance(self, SyntaxError):
            self.msg = text  # what a traceback prints for a SyntaxError, not str()

    def __str__(self) -> str:  # the message, also in StepError[OSError] (whose str() would
        return BaseException.__str__(self)  # be the errno's) and StepError[KeyError] (a repr)

    def __reduce__(self):  # keep the structured fields, and the user's, across pickling
        return (
            _rebuild_step_error,
            (
                getattr(type(self), "_headrace_original", None),
                self.index,
                self.step,
                self.cause_type,
                self.cause_message,
                self.remote_traceback,
                self.worker,
                exception_attributes(self, picklable=True),
            ),
        )


_COMBINED: dict[tuple[type, type], type] = {}


def _mixed(base: type, original: type) -> type:
    """``base`` mixed with the user's exception type ``original`` (built once), so an
    ``except original`` clause catches it; ``base`` itself where Python cannot build that
    class (layout conflicts between builtin bases)."""
    cls = _COMBINED.get((base, original))
    if cls is None:
        try:
            cls = type(f"{base.__name__}[{original.__name__}]", (base, original),
                       {"_headrace_original": original, "__module__": __name__})
        except TypeError:
            cls = base
        _COMBINED[(base, original)] = cls
    return cls


def worker_start_error(original: type[BaseException] | None, message: str) -> WorkerDiedError:
    """A worker that failed to start (``worker_init_fn`` or the dataset's setup raised):
    a :class:`WorkerDiedError` that is also an instance of ``original`` where that class can
    be built (torch re-raises a ``worker_init_fn``'s ``OSError`` as an ``OSError``)."""
    if original is not None and issubclass(original, Exception) \
            and not issubclass(original, HeadraceError):
        cls = _mixed(WorkerDiedError, original)
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - an exotic __new__ on the original type
            pass
    return WorkerDiedError(message)


def step_error_for(
    original: type[BaseException] | None,
    index: int | None,
    step: str,
    cause_type: str,
    message: str,
    remote_traceback: str = "",
    worker: int | None = None,
    instance: BaseException | None = None,
    attributes: dict[str, Any] | None = None,
) -> StepError:
    """Build a StepError that is also an instance of the original exception type when possible.

    torch's DataLoader re-raises a worker's ``ValueError`` as a ``ValueError``; users' ``except``
    clauses rely on that. We keep it: the returned error subclasses both :class:`StepError` and
    ``original`` (falling back to a plain :class:`StepError` where that class cannot be built),
    whatever arguments ``original``'s ``__init__`` takes. ``instance``: the exception itself,
    where it was raised in this process (``num_workers=0``): its attributes (``errno``,
    ``filename``, a user exception's ``path`` or ``code``) are carried over, as torch re-raises
    the object itself there; ``args`` stays headrace's message. ``attributes``: the same,
    as a worker sent them (:func:`exception_attributes`, the values that pickle; torch's
    workers send none).
    """
    err = _combined(original, index, step, cause_type, message, remote_traceback, worker)
    if instance is not None and isinstance(err, type(instance)):
        attributes = exception_attributes(instance)
    if attributes and original is not None and isinstance(err, original):
        for name, value in attributes.items():
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                setattr(err, name, value)
        if isinstance(err, SyntaxError):
            err.msg = BaseException.__str__(err)  # the message, not the original's msg
    return err


_OWN = frozenset(("index", "step", "worker", "cause_type", "cause_message", "remote_traceback"))
"""StepError's attributes: an original exception's attribute of the same name does not replace
them."""


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or where the exception's own ``__str__`` raises (a typo in a user's
    exception class) a message saying so: formatting the error must not become another error,
    which lost the sample's index and step and, in a worker, killed it."""
    try:
        return str(exc)
    except Exception as e:  # noqa: BLE001 - whatever its __str__ raises
        return f"<its message could not be formatted: __str__ raised {type(e).__name__}>"


def picklable_class(cls: type) -> type | None:
    """``cls`` where it pickles by reference (a worker sends it, and the training process's
    StepError is then also an instance of it), else None (a local class: a plain StepError)."""
    try:
        pickle.loads(pickle.dumps(cls))
        return cls
    except Exception:  # noqa: BLE001 - a local class, or one that will not load again
        return None


def exception_attributes(exc: BaseException, picklable: bool = False) -> dict[str, Any]:
    """``exc``'s attributes: its ``__dict__``, and the attributes builtin exception types keep
    in their C structures (``OSError.errno``, ``SystemExit.code``, ``UnicodeError.start``);
    never ``args``, the traceback or the chaining, nor StepError's own names. ``picklable``:
    only the values that pickle (a worker sends them to the training process)."""
    out: dict[str, Any] = {}
    for klass in reversed(type(exc).__mro__):
        if klass in (BaseException, object):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("__") or name in _OWN:
                continue
            if isinstance(attr, (types.MemberDescriptorType, types.GetSetDescriptorType)):
                with contextlib.suppress(AttributeError):
                    out[name] = getattr(exc, name)
    out.update((k, v) for k, v in vars(exc).items() if k not in _OWN)
    if picklable:
        for name in list(out):
            try:
                pickle.dumps(out[name])
            except Exception:  # noqa: BLE001 - that value stays behind
                del out[name]
    return out


def _combined(
    original: type[BaseException] | None,
    index: int | None,
    step: str,
    cause_type: str,
    message: str,
    remote_traceback: str,
    worker: int | None,
) -> StepError:
    if original is not None and issubclass(original, Exception) and original is not StepError:
        cls = _mixed(StepError, original)
        if cls is not StepError:
            try:
                return cls(index, step, cause_type, message, remote_traceback, worker)
            except Exception:  # an exotic __init__/__new__ on the original type
                pass
    return StepError(index, step, cause_type, message, remote_traceback, worker)


def _rebuild_step_error(original, index, step, cause_type, message, tb, worker,
                        attributes=None) -> StepError:
    return step_error_for(original, index, step, cause_type, message, tb, worker,
                          attributes=attributes)
