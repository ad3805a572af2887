"""Whether the stages lost whole can be replayed from the boundary logs, and how: pure
(the agent gathers what each member has, all-gathers, and every member computes the same
answer from the same rows).

A lost stage u replays iterations k+1..r-1 (k: the newest snapshot of u a live worker
holds, or the run's start; r: the iteration the survivors train next) when, for every one
of them, the live workers' logs hold its inputs (`inputs_of`): every micro-batch's
activation into u (u > 0) and input gradient into u (u < S-1), the gradient shares of the
weights it owns and the values of those it mirrors (tied weights), and, with the
global-norm clip on, every stage's gradient norm of it. Else the job rolls back whole
(entry_plan.py plan_restore), and `why` says what was missing. Two lost stages side by side never
replay: each one's input died with the other.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional, Sequence

from executor.runtime.replay.boundary_log import BWD, FWD, TIED_GRAD, TIED_VALUE

Worker = tuple[int, int]
WORD = 62  # micro-batches per int64 of a coverage mask (all-gathered as ints)


@dataclass(frozen=True)
class Window:
    """One lost stage's replay: iterations first..last from its snapshot at k."""
    stage: int
    k: int
    last: int

    @property
    def iterations(self) -> range:
        return range(self.k + 1, self.last + 1)


Inputs = list[tuple[int, list[int]]]  # (direction, the "micro-batches" of it needed)
WHAT = {FWD: "activation of micro-batch", BWD: "input gradient of micro-batch",
        TIED_GRAD: "tied-weight gradient share from stage", TIED_VALUE: "tied weight from stage"}


def inputs_of(u: int, stages: int, microbatches: int, tied: tuple = ((), ())) -> Inputs:
    """What one iteration of stage u takes from other stages: the activations (not the
    first stage: it reads its data), the input gradients (not the last: its loss), and
    `tied` = (the mirror stages whose gradient shares it adds, the owner stages whose
    values it copies) (runtime/steps/tied.py tied_inputs)."""
    mbs = list(range(microbatches))
    out = ([(FWD, mbs)] if u > 0 else []) + ([(BWD, mbs)] if u < stages - 1 else [])
    grads, values = tied
    return out + ([(TIED_GRAD, list(grads))] if grads else []) + \
        ([(TIED_VALUE, list(values))] if values else [])


def windows_of(lost: Sequence[int], snapshots: dict[int, set], origin: Optional[int],
               r: int) -> dict[int, Window]:
    """Each lost stage's window: from its newest copy at or before r-1 (`snapshots`:
    stage -> iterations some live worker holds) to r-1. A stage with no copy is left out
    (the job cannot replay it, nor roll back to it)."""
    out = {}
    for u in lost:
        have = {i for i in snapshots.get(u, ()) if i <= r - 1}
        if origin is not None and origin <= r - 1:
            have.add(origin)
        if have:
            out[u] = Window(u, max(have), r - 1)
    return out


def _words(microbatches: int) -> int:
    return -(-microbatches // WORD)


def _split(mask: int, n: int) -> list[int]:
    return [(mask >> (WORD * i)) & ((1 << WORD) - 1) for i in range(n)]


def _join(words: Sequence[int]) -> int:
    return sum(w << (WORD * i) for i, w in enumerate(words))


def _fbits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bitsf(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


@dataclass
class Report:
    """What one member holds for the windows: coverage masks and iterations' norms."""
    masks: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (u, dir, it)
    norms: dict[int, tuple[float, ...]] = field(default_factory=dict)


def encode(log, wins: dict[int, Window], inputs: dict[int, Inputs], stages: int,
           microbatches: int, clip: bool) -> list[int]:
    """This member's report as fixed-width ints (`log`: its BoundaryLog)."""
    n = _words(max(microbatches, stages))
    out: list[int] = []
    for u, w in sorted(wins.items()):
        for it in w.iterations:
            for d, gs in inputs[u]:
                out += _split(log.coverage(u, d, it, gs), n)
    if clip:
        for it in _norm_iterations(wins):
            sums = log.norms.get(it)
            out += [1, *map(_fbits, sums)] if sums is not None and len(sums) == stages \
                else [0] * (1 + stages)
    return out


def decode(row: Sequence[int], wins: dict[int, Window], inputs: dict[int, Inputs],
           stages: int, microbatches: int, clip: bool) -> Report:
    n, at, rep = _words(max(microbatches, stages)), 0, Report()
    for u, w in sorted(wins.items()):
        for it in w.iterations:
            for d, _ in inputs[u]:
                rep.masks[(u, d, it)] = _join(row[at:at + n])
                at += n
    if clip:
        for it in _norm_iterations(wins):
            if row[at]:
                rep.norms[it] = tuple(_bitsf(x) for x in row[at + 1:at + 1 + stages])
            at += 1 + stages
    return rep


def _norm_iterations(wins: dict[int, Window]) -> list[int]:
    return sorted({it for w in wins.values() for it in w.iterations})


@dataclass(frozen=True)
class ReplayPlan:
    windows: dict[int, Window]
    replayers: dict[int, tuple[Worker, ...]]  # stage -> its members, who replay it
    # (stage, direction, iteration, g) -> the member whose log sends it
    sources: dict[tuple[int, int, int, int], Worker]
    norms: dict[int, tuple[float, ...]]  # iteration -> every stage's sq norm (clip)
    inputs: dict[int, Inputs] = field(default_factory=dict)  # stage -> what it takes

    def mine(self, u: int, me: Worker, microbatches: int) -> list[int]:
        """The micro-batches `me` replays of stage u: contiguous shares, in order."""
        rs = self.replayers[u]
        i = rs.index(me)
        return [g for g in range(microbatches) if g * len(rs) // microbatches == i]

    def receivers(self, key, microbatches: int) -> tuple[Worker, ...]:
        """Who needs a logged message: the replayer of its micro-batch; a tied one, every
        replayer of the stage (each steps the whole stage)."""
        u, d, _, g = key
        rs = self.replayers[u]
        return (rs[g * len(rs) // microbatches],) if d in (FWD, BWD) else rs

    def transfers(self, microbatches: int) -> list[tuple[Worker, Worker, list]]:
        """(sender, receiver, keys) for every pair with something to move, in one order
        every member walks (so blocking sends never wait on each other in a cycle)."""
        pairs: dict[tuple[Worker, Worker], list] = {}
        for key, src in sorted(self.sources.items()):
            for dst in self.receivers(key, microbatches):
                if src != dst:
                    pairs.setdefault((src, dst), []).append(key)
        return [(a, b, keys) for (a, b), keys in sorted(pairs.items())]

    @property
    def iterations(self) -> int:
        return sum(len(w.iterations) for w in self.windows.values())


def plan_replay(lost: Sequence[int], wins: dict[int, Window], inputs: dict[int, Inputs],
                members: dict[Worker, Report], stages: dict[Worker, int], microbatches: int,
                clip: bool) -> tuple[Optional[ReplayPlan], str]:
    """(the plan, "") when every lost stage can be replayed, else (None, why not)."""
    for u in lost:
        if u not in wins:
            return None, f"no live copy of stage {u}'s state"
        if u - 1 in lost or u + 1 in lost:
            return None, f"stages {u} and {u + 1 if u + 1 in lost else u - 1} were lost " \
                         f"together"
    sources: dict[tuple[int, int, int, int], Worker] = {}
    order = sorted(members)
    for u, w in sorted(wins.items()):
        for it in w.iterations:
            for d, gs in inputs[u]:
                for g in gs:
                    have = [m for m in order if members[m].masks.get((u, d, it), 0) >> g & 1]
                    if not have:
                        return None, (f"no live worker logged the {WHAT[d]} {g}, "
                                      f"iteration {it} into stage {u}")
                    sources[(u, d, it, g)] = have[0]
    norms: dict[int, tuple[float, ...]] = {}
    if clip:
        for it in _norm_iterations(wins):
            have = [members[m].norms[it] for m in order if it in members[m].norms]
            if not have:
                return None, f"no live worker kept the gradient norms of iteration {it}"
            norms[it] = have[0]
    replayers = {u: tuple(sorted(m for m, s in stages.items() if s == u)) for u in wins}
    if any(not rs for rs in replayers.values()):
        return None, "a lost stage has no member in the new plan"
    return ReplayPlan(wins, replayers, sources, norms, dict(inputs)), ""
