"""What a state dict must match to be resumed, and what it only reports (``runtime/checkpoint.py``'s
``parse``): a resume is refused only when it would deliver other samples; changed code or batch
settings are put in words for a warning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.errors import StateDictError
from headrace.user_frame import warn

if TYPE_CHECKING:
    from headrace.runtime.checkpoint import Identity


def check_positions(sd: dict[str, Any], ident: Identity) -> None:
    """Refuse a state dict whose epoch had other positions than this loader's: the rest of it
    would be other samples (more: those the saved epoch's ``drop_last`` left out; fewer: some
    never come). Another ``batch_size`` or ``drop_last`` that keeps the positions only groups
    the same samples otherwise (a warning, ``setting_changes``), as does any change between
    epochs. Where either side's positions are unknown (a state dict without them, a sampler
    without ``__len__``), batches per epoch are compared instead."""
    saved = sd.get("epoch_samples")
    if saved is not None and ident.positions is not None:
        if sd["in_epoch"] and saved != ident.positions:
            settings = setting_changes(sd, ident, positions=False)
            raise StateDictError(
                f"state dict was saved in an epoch of {saved} samples, this loader's epochs "
                f"have {ident.positions} ("
                + ("; ".join(settings) if settings else "the sampler differs") + "): a resume "
                + ("would deliver samples the saved epoch left out" if ident.positions > saved
                   else "would leave out samples the saved epoch had not delivered")
                + ". Resume with the saved run's "
                + ("batch_size and drop_last" if settings else "sampler")
                + ", or load the state dict between epochs")
        return
    if sd["batches_per_epoch"] != ident.batches:
        settings = setting_changes(sd, ident, positions=False)
        raise StateDictError(
            f"state dict was saved with {sd['batches_per_epoch']} batches per epoch, this loader "
            f"has {ident.batches} (" + ("; ".join(settings) if settings else
                                        "batch_size, drop_last or the sampler differ") + ")")


def check_order(sd: dict[str, Any], ident: Identity) -> None:
    """Refuse a state dict saved part-way through an epoch with another ``shuffle``: what was
    delivered is recorded by position in the saved epoch's order, and this loader's order is
    another, so the positions left hold other samples (some delivered already, while as many
    the saved epoch had left never come). Before the epoch's first batch or after its last one
    nothing of it is told by position: a warning (``setting_changes``), as between epochs."""
    then, now = sd.get("shuffle"), ident.shuffle
    if then is None or now is None or then == now or not sd["in_epoch"] \
            or sd.get("delivered_by", "position") != "position":
        return
    done, total = int(sd.get("delivered_count") or 0), sd.get("epoch_samples")
    if done == 0 or (total is not None and done >= total):
        return
    raise StateDictError(
        f"state dict was saved part-way through an epoch with shuffle={then}, this loader has "
        f"shuffle={now}: the {done} samples delivered are recorded by position in the saved "
        "epoch's order, and in this loader's order those positions hold other samples, so a "
        "resume would deliver some samples twice and never the others. Resume with "
        f"shuffle={then} to finish that epoch, or load a state dict saved between epochs")


def setting_changes(sd: dict[str, Any], ident: Identity, positions: bool = True) -> list[str]:
    """The batch settings that differ between the saved run and this loader, in words: each
    name with the saved and the present value (``positions``: also the samples per epoch)."""
    pairs: list[tuple[str, Any]] = [("batch_size", ident.batch_size),
                                    ("drop_last", ident.drop_last)]
    if None not in (sd.get("shuffle"), ident.shuffle):  # None: a sampler of another kind
        pairs.append(("shuffle", ident.shuffle))
    out = [_then_now(name, sd[name], now) for name, now in pairs
           if name in sd and sd[name] != now]
    saved = sd.get("epoch_samples")
    if positions and saved is not None and ident.positions is not None \
            and saved != ident.positions:
        out.append(f"{saved} samples per epoch then, {ident.positions} now")
    return out


def seeding_changes(sd: dict[str, Any], persistent_workers: bool) -> list[str]:
    """The settings that decide later epochs' seeds and differ between the saved run and this
    loader, in words as :func:`setting_changes` puts them: ``persistent_workers`` (torch draws
    the workers' base seed from the loader's generator once when they persist, at every epoch
    otherwise, so the epochs after the resumed one get other seeds, and a sampler drawing from
    that generator another order). Empty for a state dict that did not record it."""
    then = sd.get("persistent_workers")
    if then is None or bool(then) == persistent_workers:
        return []
    return [_then_now("persistent_workers", bool(then), persistent_workers)]


def _then_now(name: str, then: Any, now: Any) -> str:
    """A changed setting in words: ``batch_size=10 then, 11 now``."""
    return f"{name}={then!r} then, {now!r} now"


IDENTITY_VERSION = 6
"""How the state dict's ``dataset`` and ``step_code`` were computed (``identity_version``): 2
counts a callable class's every method, the modules a step calls into by content, a file
set's modification times; 3 the helpers of its module a step calls, and the immutable scalar
globals they and a callable class's methods read, by value (``pipeline/code_digest.py``); 4
a dataset without its own ``fingerprint()`` by its class's code too (a wrapper's with the
datasets it wraps), not its class name and
length alone (``pipeline/fingerprint.py``: ``source_code``), and a set literal in code by its
sorted elements (``code_digest._const_repr``); 5 every item of a container and every byte of
an array up to ``pipeline/value_digest.py``'s bounds, not the first 64 items and a sample of an
array over 1 MiB; every global a step reads, not the first 64, and a long tuple a helper reads
by value; 6 a step's and a dataset's state at any depth (no cut at six levels), a decorated
step's wrapped function's globals, a module held in a value by its source file, a generator by
its type (``pipeline/digest_scope.py``). Identities computed otherwise cannot be
compared: after an upgrade every resume said its steps and dataset had changed."""


def code_changes(sd: dict[str, Any], ident: Identity) -> list[str]:
    """What differs in code between the saved run and this loader, in words (empty: nothing,
    or a state dict whose identities were computed another way: nothing can be told)."""
    out: list[str] = []
    if sd.get("identity_version", 1) != IDENTITY_VERSION:
        return out
    if sd.get("dataset") is not None and sd["dataset"] != ident.dataset:
        out.append(f"dataset {sd['dataset']} then, {ident.dataset} now")
    saved = sd.get("step_code")
    if saved is None:
        return out
    now = ident.step_code
    changed = [n for n in now if n in saved and saved[n] != now[n]]
    added = [n for n in now if n not in saved]
    removed = [n for n in saved if n not in now]
    for what, names in (("changed", changed), ("new", added), ("gone", removed)):
        if names:
            out.append(f"steps {what}: {', '.join(names)}")
    return out


def warn_seeding_changes(state: dict[str, Any], persistent_workers: bool, later: str) -> None:
    """Warn (``UserWarning``, as ``checkpoint.parse`` does of another ``batch_size``) where the
    state dict was saved with another ``persistent_workers``: the resume goes on, and ``later``
    (the epochs that follow this loader's setting, as torch's would, in words: "The next
    epochs", or after what the resume restores) differ from the saved run's. It resumed
    silently, later epochs' samples differing."""
    changed = seeding_changes(state, bool(persistent_workers))
    if changed:
        warn(
            "headrace: resuming a state dict saved with other settings (" + "; ".join(changed)
            + "). " + later
            + " draw the workers' base seed as this loader's persistent_workers says (once "
            "when the workers persist, at every epoch otherwise, as torch), so their samples' "
            "random content, and an order drawn from the loader's generator, differ from the "
            "saved run's. Resume with the saved setting to continue that run exactly")
