"""Warnings of an epoch that delivered no sample because ``on_error="skip"`` skipped every
one it ran: an epoch run from its start, and the rest of a resumed epoch, each said once per
loader (docs/design.md, "``on_error="skip"`` warns at the end of an epoch that delivered
nothing")."""

from __future__ import annotations

from headrace.telemetry.stats import EpochStats
from headrace.user_frame import warn

_ONCE = ("Said once per loader: loader.stats().epochs and explain() count the samples and "
         "the skipped ones of every epoch")
"""The end of the empty-epoch warnings: a loader gives each of the two once."""


class EmptyEpochWarnings:
    """A loader's warnings of epochs that delivered nothing, every sample they ran skipped
    under ``on_error="skip"`` (``Monitor.on_epoch_closed`` hands it every epoch's close).
    Two warnings, each said once per loader (the text names the epoch, so Python's default
    filter repeated it at every one; the later ones are counted by ``stats().epochs`` and
    ``explain()``): the rest of a resumed epoch that skipped all it ran, and an epoch run
    from its start that did. Apart, because they have other causes: a resume runs again the
    bad samples its state dict does not record, while an epoch of skips only is the dataset
    or a step failing. One flag for both kept the second unsaid when the first was a resumed
    rest."""

    def __init__(self) -> None:
        self.said: set[str] = set()
        """The kinds warned of: ``"resumed"`` (the rest of a resumed epoch), ``"empty"`` (an
        epoch run from its start)."""

    def epoch_closed(self, stats: EpochStats, first: str | None, delivered_before: int,
                     padded: bool) -> None:
        """Warn of the epoch of ``stats`` if it ran to its end, skipped every sample it ran
        (``first``: the first skip's message, None: not known) and is the first of its kind;
        ``delivered_before`` and ``padded`` as ``Monitor.on_epoch_closed`` takes them (a DDP
        rank's padding batches have their own warning)."""
        if not (stats.finished and stats.samples == 0 and stats.skipped_samples) or padded:
            return
        kind = "resumed" if delivered_before else "empty"
        if kind in self.said:
            return
        self.said.add(kind)
        warn_all_skipped(stats, first, delivered_before)


def warn_all_skipped(stats: EpochStats, first: str | None, delivered_before: int = 0) -> None:
    """An epoch ran to its end and delivered no sample, every one it ran skipped under
    ``on_error="skip"``: a training loop ran on an empty epoch without a word (only a log line
    said one sample was skipped). A warning, not an error: skipping is what was asked for, and
    an epoch of a few samples may hold only bad ones (docs/design.md).

    ``delivered_before``: samples the epoch delivered before its resume. The rest of a resumed
    epoch may hold only bad samples although the epoch is not empty (a state dict does not
    record skipped samples, so a resume runs them again): its warning says so, where the one of
    an empty epoch blamed the dataset or a step.

    Issued at the user's line (``next()``, whatever depth the epoch ends at), for a loader's
    first such epoch of each kind only (:class:`EmptyEpochWarnings`)."""
    if delivered_before:
        warn(
            f"headrace: epoch {stats.epoch} delivered no batch after its resume: "
            f"{stats.skipped_samples} sample(s) were skipped under Options(on_error='skip') "
            "and none reached the training loop; the epoch had delivered "
            f"{delivered_before} sample(s) before the resume. The first: "
            f"{first or '(not known)'}. A state dict does not record skipped samples, so a "
            "resume runs them again: bad samples are skipped again. If samples that worked "
            "before the resume fail in this process, the cause is what changed with it (a "
            "path, the environment, an edited step): run with on_error='raise' (the default) "
            f"to see the full error. {_ONCE}")
        return
    warn(
        f"headrace: epoch {stats.epoch} delivered no batch: {stats.skipped_samples} sample(s) "
        "were skipped under Options(on_error='skip') and none reached the training loop. "
        f"The first: {first or '(not known)'}. When every sample fails, the cause is usually "
        "the dataset or a step, not bad data: run with on_error='raise' (the default) to see "
        f"the full error. {_ONCE}")
