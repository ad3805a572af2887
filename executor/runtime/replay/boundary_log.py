"""What a worker sent across stage boundaries, kept in its host memory so that a stage
lost whole can be replayed alone (SWIFT's logging; docs/executor.md, "Replay of a lost
stage").

Per (stage it went into, direction, iteration, micro-batch): the activation a forward
SEND carried, or the input gradient a backward SEND carried, as sent (after the boundary
cast). Plus, per iteration, the values a stage's step takes from outside itself: every
stage's squared gradient norm (the global-norm clip), as the stepper read it, and what
tied weights exchange (a mirror's gradient share, the owner's new value).

Kept since the second-newest snapshot iteration: a replay starts from the newest
snapshot of the lost stage a live worker holds, which is the newest one unless its send
had not landed, then the one before (holders keep two). Every stage snapshots the same
iterations (cadence.py), so one window serves every boundary. A run from its seed counts
its start as a snapshot (any worker rebuilds a stage there).

The budget bounds the host memory the log takes. A tensor that would pass it is not kept
(counted in `refused`); a loss whose window then lacks a boundary falls back to the
global rollback, which the run's summary says. The window's next trim makes room again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

# What a logged message carried: an activation, an input gradient; for a weight tied
# across stages (runtime/steps/tied.py) a mirror's gradient share sent to the owner, the
# owner's stepped value sent to a mirror. A tied message's "micro-batch" is the stage that
# sent it, its value the tensors of the ties the two share, in tie order.
FWD, BWD, TIED_GRAD, TIED_VALUE = 0, 1, 2, 3
Key = tuple[int, int, int, int]  # (into stage, direction, iteration, micro-batch)


@dataclass
class LogStats:
    kept: int = 0  # tensors messages kept
    refused: int = 0  # messages not kept: the budget was full
    peak_bytes: int = 0

    def line(self) -> str:
        return (f"kept={self.kept} refused={self.refused} "
                f"peak={self.peak_bytes / 2 ** 20:.2f}MiB")


def _host(t: Tensor) -> Tensor:
    """A host copy of `t` that no later in-place change of `t` reaches."""
    if t.device.type == "cpu":
        return t.detach().clone()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t.detach(), non_blocking=True)  # read only after a later sync


def _host_value(value):
    return _host(value) if isinstance(value, Tensor) else tuple(_host(t) for t in value)


def _nbytes(value) -> int:
    ts = [value] if isinstance(value, Tensor) else list(value)
    return sum(t.numel() * t.element_size() for t in ts)


class BoundaryLog:
    def __init__(self, budget: int, origin: Optional[int] = None):
        """budget: bytes it may hold (0: off). origin: the iteration before a run from
        its seed's first step (-1), a copy every stage has; None for a resumed run."""
        self.budget = budget
        self.entries: dict[Key, object] = {}
        self.norms: dict[int, tuple[float, ...]] = {}  # iteration -> every stage's sq norm
        self.snapshots: list[int] = [] if origin is None else [origin]
        self.floor = -(2 ** 62)  # iterations <= floor are no longer kept
        self.bytes = 0
        self.stats = LogStats()

    @property
    def on(self) -> bool:
        return self.budget > 0

    # ---- what training adds ------------------------------------------------------------
    def keep(self, into: int, direction: int, it: int, g: int, value) -> None:
        """A boundary message just sent (or recomputed by a replay)."""
        if not self.on or it <= self.floor:
            return
        key = (into, direction, it, g)
        n = _nbytes(value)
        old = self.entries.pop(key, None)  # a re-sent iteration replaces its message
        if old is not None:
            self.bytes -= _nbytes(old)
        if self.bytes + n > self.budget:
            self.stats.refused += 1
            return
        self.entries[key] = _host_value(value)
        self.bytes += n
        self.stats.kept += 1
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.bytes)

    def note_norms(self, it: int, sums: Sequence[float]) -> None:
        """Every stage's squared gradient norm of iteration `it`, as the step used them."""
        if self.on and it > self.floor:
            self.norms[it] = tuple(float(x) for x in sums)

    def snapshot_at(self, it: int) -> None:
        """Every stage snapshots iteration `it`: what only older snapshots need goes."""
        if it in self.snapshots:
            return
        self.snapshots = sorted({*self.snapshots, it})[-2:]
        if len(self.snapshots) == 2:
            self._drop(lambda i: i <= self.snapshots[0])
            self.floor = max(self.floor, self.snapshots[0])

    def forget_from(self, it: int) -> None:
        """Iterations from `it` on are trained again (a rollback): their messages will be
        sent again, from the same state, so what is kept of them goes."""
        self._drop(lambda i: i >= it)

    def off(self) -> None:
        """No snapshot will come (auto chose none): no replay can start from one, and no
        snapshot would ever trim what is kept; the log empties and stops."""
        self._drop(lambda i: True)
        self.budget = 0

    def reshaped(self) -> None:
        """The job changed shape: stage numbers mean other units, and no replay reaches
        back past the change (the next snapshot is the new shape's)."""
        self._drop(lambda i: True)
        self.snapshots = []

    def rolled_back_to(self, k: int) -> None:
        """The job went back to the state after step k: the later past is trained again."""
        self.forget_from(k + 1)
        self.snapshots = [i for i in self.snapshots if i <= k]

    def _drop(self, gone) -> None:
        for key in [k for k in self.entries if gone(k[2])]:
            self.bytes -= _nbytes(self.entries.pop(key))
        for it in [i for i in self.norms if gone(i)]:
            del self.norms[it]

    # ---- what a replay reads -----------------------------------------------------------
    def has(self, into: int, direction: int, it: int, g: int) -> bool:
        return (into, direction, it, g) in self.entries

    def get(self, into: int, direction: int, it: int, g: int):
        value = self.entries[(into, direction, it, g)]
        if any(t.is_pinned() for t in ([value] if isinstance(value, Tensor) else value)):
            torch.cuda.synchronize()  # the copies were asynchronous
        return value

    def coverage(self, into: int, direction: int, it: int, gs) -> int:
        """Which of the micro-batches `gs` (a count, or which) of (into, direction, it) are
        kept here, as a bit mask."""
        mask = 0
        for g in (range(gs) if isinstance(gs, int) else gs):
            if (into, direction, it, g) in self.entries:
                mask |= 1 << g
        return mask

    def stats_line(self) -> str:
        return f"{self.stats.line()} now={self.bytes / 2 ** 20:.2f}MiB"
