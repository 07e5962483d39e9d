"""AutoPlacement (Pecan §5.1, Algorithm 1): how many workers, local and remote. Pure.

The policy sees batch times only (``bpt``, seconds per batch the training loop waited for plus
spent on, as the runtime measures them), averaged over windows of ``window`` batches (Pecan's
X); the ``unstable_windows`` windows after every change are discarded (workers starting, queues
refilling). Two window means differ when their ratio is off by at least ``threshold`` (T).

1. add remote workers while batch time improves (Cachew's autoscaling; Algorithm 1 line 2):
   the batch time it settles at is ``bpt_conv``, the model-bound time;
2. add local workers until batch time gets worse than ``bpt_conv`` by T (contention on the
   training host), then remove the last one (lines 8-10);
3. remove remote workers while the batch cost ``bpc = bpt · (c_a·n_a + c_w·n_w)`` does not rise
   (without costs: while batch time stays within T of ``bpt_conv``: fewest workers at equal
   batch time), and re-add the last one removed if it did (lines 12-14);
4. repeat 2-3 until a round changes nothing (line 15); then keep watching: a batch time that
   leaves the converged configuration's own (a running mean of its windows) by more than T in
   ``confirm_windows`` windows in a row (the workload changed phase) starts the policy again.
   One window is not enough: with windows of tens of batches rather than Pecan's 500, and the
   cheapest configuration sitting at the edge of the accelerator's rate, one window's mean
   moves by more than T (seen on the remote benchmark:
   converged at 1 local + 8 remote at 40.7 ms, one window of 44.5 ms was taken for a phase
   change and the policy climbed to 10 remote workers);
5. while watching, after ``reprobe_windows`` windows in a row without drift, try a neighbour
   again, one remote worker fewer and one more in turn, each compared with the window just
   measured: fewer is step 3 from the current configuration (re-added if batches got
   costlier); more is kept only if batches got cheaper (without costs: faster by T). A try
   that is undone doubles the wait (up to ``reprobe_max_windows``), one that is kept resets
   it. Not in Pecan's Algorithm 1, which measures each configuration once: on a busy host one
   window off by 10% (another process, not the move) ends the policy at the wrong
   configuration for good, in either direction (seen on the remote benchmark: one 53 ms window
   after the first removal kept 1 local + 10 remote where 1 + 8 sufficed; one slow window
   before a removal let it go down to 1 + 7, stalling 12%), and conditions change over a job.

:func:`observe` is the whole policy: (config, state, one batch time) -> (new state, move).
"""

from __future__ import annotations

import dataclasses
import math

SETTLED_WINDOWS = 8
"""Watch phase: the converged batch time is a running mean over about this many windows (the
first window alone was 3% off the configuration's usual batch time often enough on the remote
benchmark for ordinary windows to count as a phase change)."""


@dataclasses.dataclass(frozen=True)
class PlacementConfig:
    """AutoPlacement's parameters. Costs per hour in any currency (``None``: unknown)."""

    max_remote: int
    max_local: int
    min_local: int = 1
    window: int = 20
    """Batches averaged per measurement (Pecan's X = 500 on jobs of many thousand batches)."""
    threshold: float = 0.03
    """T: relative batch-time change that counts (Pecan: 0.03)."""
    unstable_windows: int = 1
    """Windows discarded after each change."""
    confirm_windows: int = 2
    """Watch phase: consecutive windows off the converged batch time by T, in the same
    direction, that count as a phase change."""
    reprobe_windows: int = 6
    """Watch phase: windows without drift before trying a neighbour, one remote worker fewer
    or more in turn (0: never)."""
    reprobe_max_windows: int = 48
    """Longest wait between such tries after tries that were undone (windows)."""
    local_cost: float | None = None
    """c_a: the training host per hour (n_a = 1)."""
    remote_cost: float | None = None
    """c_w: one remote worker per hour."""

    def bpc(self, bpt: float, remote: int) -> float | None:
        """Cost of one batch (currency), None without both costs."""
        if self.local_cost is None or self.remote_cost is None:
            return None
        return bpt * (self.local_cost + self.remote_cost * remote) / 3600.0


@dataclasses.dataclass(frozen=True)
class PlacementState:
    """Where the policy is. ``local``/``remote``: worker counts it asked for."""

    local: int
    remote: int
    phase: str = "add_remote"  # add_remote | add_local | remove_remote | watch | probe_more
    conv: float = math.inf  # bpt_conv: the model-bound batch time (s)
    base: float = math.inf  # batch time before the last change (s)
    round_start: tuple[int, int] = (-1, -1)
    skip: int = 0  # windows still to discard
    acc: float = 0.0  # sum of this window's batch times so far (s)
    n: int = 0  # batches in this window so far
    last_bpt: float = math.nan  # the last window's mean (s)
    settled: float = math.inf  # batch time of the converged configuration (s; watch phase):
    # the running mean of its windows (over the last SETTLED_WINDOWS, roughly)
    settled_n: int = 0  # windows in that mean
    drift: int = 0  # watch phase: windows in a row slower (> 0) or faster (< 0) than settled
    quiet: int = 0  # watch phase: windows without drift since converging or the last try
    wait: int = 0  # watch phase: quiet windows before the next try (0: cfg.reprobe_windows)
    probing: bool = False  # this round is a watch-phase try (step 5)
    probe_more: bool = False  # watch phase: the next try adds a remote worker (else removes)


@dataclasses.dataclass(frozen=True)
class Move:
    """A change of worker counts, with why (for ``explain()``)."""

    local: int
    remote: int
    reason: str
    bpt: float  # the window mean (s) that led to it


def observe(cfg: PlacementConfig, s: PlacementState, batch_s: float
            ) -> tuple[PlacementState, Move | None]:
    """Fold one batch time (seconds) in; at the end of a window, maybe move."""
    s = dataclasses.replace(s, acc=s.acc + batch_s, n=s.n + 1)
    if s.n < cfg.window:
        return s, None
    bpt = s.acc / s.n
    s = dataclasses.replace(s, acc=0.0, n=0, last_bpt=bpt)
    if s.skip > 0:
        return dataclasses.replace(s, skip=s.skip - 1), None
    s, move = _decide(cfg, s, bpt)
    if move is not None:
        s = dataclasses.replace(s, local=s.local + move.local, remote=s.remote + move.remote,
                                skip=cfg.unstable_windows)
    return s, move


def _worse(cfg: PlacementConfig, bpt: float, ref: float) -> bool:
    return bpt > ref * (1 + cfg.threshold)


def _better(cfg: PlacementConfig, bpt: float, ref: float) -> bool:
    return bpt < ref * (1 - cfg.threshold)


def _decide(cfg: PlacementConfig, s: PlacementState, bpt: float
            ) -> tuple[PlacementState, Move | None]:
    r = dataclasses.replace
    if s.phase == "add_remote":
        if math.isinf(s.base) or _better(cfg, bpt, s.base):
            s = r(s, base=bpt, conv=min(s.conv, bpt))
            if s.remote < cfg.max_remote:
                return s, Move(0, +1, "batch time still improving: add a remote worker", bpt)
        s = r(s, conv=min(s.conv, bpt), base=bpt)
        return _start_round(cfg, s, bpt, "batch time stopped improving with remote workers")
    if s.phase == "add_local":
        if _worse(cfg, bpt, s.conv):
            s = r(s, phase="remove_remote")
            return _remove_remote(cfg, s, bpt, local=-1, base=s.conv,
                                  why="the last local worker made batches slower (contention)")
        s = r(s, conv=min(s.conv, bpt), base=bpt)
        if s.local < cfg.max_local:
            return s, Move(+1, 0, "no contention yet: add a local worker", bpt)
        s = r(s, phase="remove_remote")
        return _remove_remote(cfg, s, bpt, local=0, why="local workers at their maximum")
    if s.phase == "probe_more":
        costs = cfg.bpc(bpt, s.remote), cfg.bpc(s.base, s.remote - 1)
        if costs[0] is not None and costs[1] is not None:
            pays = costs[0] < costs[1]
        else:
            pays = _better(cfg, bpt, s.base)
        s = r(s, phase="watch", settled=math.inf, quiet=0, probing=False)
        if pays:
            return r(s, wait=0), None
        wait = min(2 * (s.wait or cfg.reprobe_windows), cfg.reprobe_max_windows)
        return r(s, wait=wait), Move(0, -1, "the added remote worker did not make batches "
                                     "cheaper: remove it; converged", bpt)
    if s.phase == "remove_remote":
        costs = cfg.bpc(bpt, s.remote), cfg.bpc(s.base, s.remote + 1)
        if costs[0] is not None and costs[1] is not None:
            rose = costs[0] > costs[1]
        else:
            rose = _worse(cfg, bpt, s.conv)
        if rose:
            return _end_round(cfg, r(s, base=bpt), bpt, remote=+1,
                              why="removing that remote worker made batches costlier: re-add it")
        s = r(s, base=bpt)
        return _remove_remote(cfg, s, bpt, local=0, why="cost did not rise")
    # watch: compared with the converged configuration's own batch time (with costs it may be
    # slower than bpt_conv on purpose): the first window after convergence, then their mean
    if math.isinf(s.settled):
        return r(s, settled=bpt, settled_n=1, drift=0), None
    drift = (max(s.drift, 0) + 1 if _worse(cfg, bpt, s.settled) else
             min(s.drift, 0) - 1 if _better(cfg, bpt, s.settled) else 0)
    n = min(s.settled_n + 1, SETTLED_WINDOWS)  # every window, drifting or not: a phase
    # change is called within confirm_windows, before the mean has followed it far
    s = r(s, drift=drift, quiet=0 if drift else s.quiet + 1,
          settled=s.settled + (bpt - s.settled) / n, settled_n=n)
    if drift == 0:
        return _maybe_reprobe(cfg, s, bpt)
    if abs(drift) < cfg.confirm_windows:
        return s, None
    s = r(s, drift=0)
    if drift > 0:
        s = r(s, phase="add_remote", base=bpt, conv=bpt)
        if s.remote < cfg.max_remote:
            return s, Move(0, +1, "batch time rose (phase change): add a remote worker", bpt)
        return _start_round(cfg, s, bpt, "batch time rose, no remote worker left")
    s = r(s, phase="remove_remote", conv=bpt, base=bpt)
    return _remove_remote(cfg, s, bpt, local=0, why="batch time fell (phase change)")


def _maybe_reprobe(cfg: PlacementConfig, s: PlacementState, bpt: float
                   ) -> tuple[PlacementState, Move | None]:
    """Step 5: after enough quiet windows, try one remote worker more or fewer (in turn)."""
    wait = s.wait or cfg.reprobe_windows
    if cfg.reprobe_windows <= 0 or s.quiet < wait:
        return s, None
    more = s.probe_more if 0 < s.remote < cfg.max_remote else s.remote == 0
    if more and s.remote >= cfg.max_remote:
        return s, None
    r = dataclasses.replace
    s = r(s, quiet=0, probe_more=not more, base=bpt, probing=True,
          round_start=(s.local, s.remote))
    if more:
        return r(s, phase="probe_more"), Move(
            0, +1, f"{wait} quiet windows: try one remote worker more", bpt)
    s = r(s, phase="remove_remote", conv=bpt)
    return _remove_remote(cfg, s, bpt, local=0,
                          why=f"{wait} quiet windows: try one remote worker fewer")


def _start_round(cfg: PlacementConfig, s: PlacementState, bpt: float, why: str
                 ) -> tuple[PlacementState, Move | None]:
    s = dataclasses.replace(s, phase="add_local", round_start=(s.local, s.remote))
    if s.local < cfg.max_local:
        return s, Move(+1, 0, f"{why}: add a local worker", bpt)
    s = dataclasses.replace(s, phase="remove_remote")
    return _remove_remote(cfg, s, bpt, local=0, why=f"{why}; local workers at their maximum")


def _remove_remote(cfg: PlacementConfig, s: PlacementState, bpt: float, local: int, why: str,
                   base: float | None = None) -> tuple[PlacementState, Move | None]:
    """Remove one remote worker (and apply ``local``); ``base``: the batch time the next
    window is compared with (default ``bpt``)."""
    if s.remote > 0:
        s = dataclasses.replace(s, base=bpt if base is None else base)
        return s, Move(local, -1, f"{why}: remove a remote worker", bpt)
    return _end_round(cfg, s, bpt, remote=0, why=why, local=local)


def _end_round(cfg: PlacementConfig, s: PlacementState, bpt: float, remote: int, why: str,
               local: int = 0) -> tuple[PlacementState, Move | None]:
    """Line 15: converged when the round changed nothing, else another round. A round that
    ended by re-adding the remote worker it removed, with no local worker left to add, is
    converged too: the next round would only remove that worker again, a configuration just
    measured to cost more (combined into one move with the re-add, that removal changed
    nothing, kept the costlier configuration and compared the next window with it: the count
    ratcheted down to zero)."""
    after = (s.local + local, s.remote + remote)
    if after == s.round_start or (remote > 0 and after[0] >= cfg.max_local):
        undone = s.probing and after == s.round_start
        wait = (min(2 * (s.wait or cfg.reprobe_windows), cfg.reprobe_max_windows) if undone
                else 0)
        s = dataclasses.replace(s, phase="watch", settled=math.inf, quiet=0, wait=wait,
                                probing=False)
        move = Move(local, remote, f"{why}; converged", bpt) if (local or remote) else None
        return s, move
    s = dataclasses.replace(s, phase="add_local", round_start=after, probing=False)
    if after[0] < cfg.max_local:
        return s, Move(local + 1, remote, f"{why}; next round: add a local worker", bpt)
    s = dataclasses.replace(s, phase="remove_remote")
    if after[1] > 0:
        return s, Move(local, remote - 1, f"{why}; next round: remove a remote worker", bpt)
    s = dataclasses.replace(s, phase="watch", settled=math.inf)
    return s, (Move(local, remote, why, bpt) if (local or remote) else None)
