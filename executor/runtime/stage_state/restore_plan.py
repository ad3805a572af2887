"""Rolling the whole job back to a peer-memory snapshot: who restores what from where.

When a plan leaves some stage with no live worker that holds its state (every holder
died; a worker moved in with nothing), the job goes back to the newest iteration k for
which every stage has a copy somewhere among the live workers: a worker's own stage's
host copy (peer_snapshots LocalCopies) or a snapshot it holds for another stage
(SnapshotHost). A run started from its seed (not resumed from a checkpoint) also has
every stage's state before its first step everywhere: a member rebuilds its own stage at
that origin as it built it at start, so a stage lost before any snapshot of it landed
rolls the job back to the start instead of halting it. Disk checkpoints are the third
tier (disk_tier.py): a member that can read this run's complete checkpoint of iteration
c (or the one the run resumed from) can restore its own stage at c by name, whatever
shape wrote it, so no stage is ever rebuilt from the seed while a newer copy is on disk.
Every member of the new world then ends up with its stage's state after step k: restored
from its own copy (host copy, seed or disk), or sent by one provider of its stage. Pure:
the agent gathers what each member has (one all-gather) and carries out the answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

Worker = tuple[int, int]
PER_STAGE = 3  # iterations a member reports per stage (newest first)
PER_DISK = 2  # disk checkpoints a member reports (newest first; the store keeps 2)
NONE = -2  # an empty field of a report (iteration -1 is the origin of a run from its seed)


@dataclass(frozen=True)
class Has:
    """What one member can provide: stage -> iterations (own host copies or held
    snapshots), and whether it may restore its own stage from its own copy."""
    stage: int
    copies: dict[int, tuple[int, ...]]
    # the iteration before the run's first step when the member can rebuild its own
    # stage's state there (from the seed); None for a run resumed from a checkpoint
    origin: Optional[int] = None
    # iterations of complete disk checkpoints of this run it can read (its own stage, of
    # any shape, loads from them by name)
    disk: tuple[int, ...] = ()

    def own_copies(self) -> set[int]:
        """Iterations at which it can restore its own stage without a provider."""
        return set(self.copies.get(self.stage, ())) | set(self.disk) | (
            set() if self.origin is None else {self.origin})

    def can_give(self, stage: int, k: int) -> bool:
        return k in self.copies.get(stage, ()) or (stage == self.stage and k in self.own_copies())


@dataclass(frozen=True)
class RestorePlan:
    iteration: int  # every stage goes back to its state after this step
    providers: dict[int, Worker]  # stage -> the member that sends it to those without it
    takers: dict[int, tuple[Worker, ...]]  # stage -> members that receive it
    own: tuple[Worker, ...]  # members that restore from their own copy

    def sends(self, me: Worker) -> list[tuple[int, Worker]]:
        """(stage, taker) pairs `me` sends, in a fixed order."""
        return [(s, t) for s, p in sorted(self.providers.items()) if p == me
                for t in self.takers.get(s, ())]


def encode(has: Has, stages: int) -> list[int]:
    """A member's report as fixed-width ints for World.allgather_ints."""
    out = [has.stage, NONE if has.origin is None else has.origin]
    disk = sorted(has.disk, reverse=True)[:PER_DISK]
    out += disk + [NONE] * (PER_DISK - len(disk))
    for s in range(stages):
        its = sorted(has.copies.get(s, ()), reverse=True)[:PER_STAGE]
        out += its + [NONE] * (PER_STAGE - len(its))
    return out


def decode(row: list[int], stages: int) -> Has:
    copies = {}
    at = 2 + PER_DISK
    for s in range(stages):
        its = tuple(i for i in row[at + s * PER_STAGE: at + (s + 1) * PER_STAGE] if i != NONE)
        if its:
            copies[s] = its
    disk = tuple(i for i in row[2:at] if i != NONE)
    return Has(row[0], copies, None if row[1] == NONE else row[1], disk)


def tier_of(members: dict[Worker, "Has"], k: int) -> str:
    """Where a rollback to k takes the lost stages' state from, in words (the run's output)."""
    if any(k in h.disk for h in members.values()):
        return f"the checkpoint on disk of iteration {k}"
    if any(k in its for h in members.values() for its in h.copies.values()):
        return "peer-memory snapshots"
    return "the seed (the run's start)"


def plan_restore(members: dict[Worker, Has], stages: int) -> Optional[RestorePlan]:
    """The newest iteration every stage has a copy of, and who restores it how; None when
    no iteration has a copy of every stage (the run must halt)."""
    have: dict[int, set[int]] = {s: set() for s in range(stages)}
    for h in members.values():
        for s, its in h.copies.items():
            have[s].update(its)
        if h.stage in have:
            have[h.stage].update(h.own_copies())
    common = set.intersection(*have.values()) if have else set()
    if not common:
        return None
    k = max(common)
    own = tuple(sorted(w for w, h in members.items() if h.can_give(h.stage, k)))
    providers, takers = {}, {}
    for s in range(stages):
        need = tuple(sorted(w for w, h in members.items() if h.stage == s and w not in own))
        if not need:
            continue
        # a member of the stage with its own copy first (it restores anyway), then any
        # holder; the lowest slot among equals, so every member computes the same answer
        cands = sorted(w for w, h in members.items() if h.can_give(s, k))
        same = [w for w in cands if members[w].stage == s and w in own]
        providers[s] = (same or cands)[0]
        takers[s] = need
    return RestorePlan(k, providers, takers, own)
