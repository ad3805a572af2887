"""Entering a version, decided: pure functions of what the members all-gathered, lowered
into steps that sync.py runs through the iteration's interpreter (as planner/lowering.py
lowers a plan into an iteration's steps). No I/O here: the same rows give every member
the same decision, and a test can walk every case without a process.

The rows: for each member of the new world, (last settled iteration, holds no state).
  - every stage has a member with state: RESUME at r = 1 + the lowest iteration such a
    member settled; each member's steps: roll back to r if ahead, else settle its last
    step; keep nothing of r or later; then a member with no state receives its stage's
    from the lowest member of its stage that has one, and that member sends it to each;
  - no member has state: RESTORE (below);
  - some stages have no member with state: LOST (those stages are replayed from the
    boundary logs, or the job restores, after one more gather: replayer.py); the
    survivors' own steps are RESUME's.

RESTORE, one rule over the tiers (`plan_restore`, its steps `restore_steps`): after one
more gather of what each member holds (`Has`), the job goes back to the newest iteration
k for which every stage has a copy somewhere among the live workers: a worker's own
stage's host copy (peer_snapshots LocalCopies), a snapshot it holds for another stage
(SnapshotHost), this run's complete disk checkpoints it can read (disk_tier.py: its own
stage loads from one by name, whatever shape wrote it), or, for a run started from its
seed, the run's start (a member rebuilds its own stage there as it built it at start, so
a stage lost before any snapshot of it landed rolls the job back to the start instead of
halting it; no stage is rebuilt from the seed while a newer copy is on disk). Every
member then ends up with its stage's state after step k: restored from its own copy, sent
by the member of its stage that restored its own, or fetched from the snapshot a member
of another stage holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

Worker = tuple[int, int]


class EntryOp(str, Enum):
    ROLLBACK = "ROLLBACK"  # back to the state before step `it` (its own pre-step copies)
    SETTLE = "SETTLE"  # its last step made final (a clip's redo, a tied weight's value)
    KEEP_BEFORE = "KEEP_BEFORE"  # forget copies and logs of iterations >= `it`
    RECV_STATE = "RECV_STATE"  # its stage's state from `peer`
    SEND_STATE = "SEND_STATE"  # its stage's state to each of `peers`
    # RESTORE's
    RESTORE_OWN = "RESTORE_OWN"  # its stage after step `it` from its own copy (a host
    #                              copy, the seed, a disk checkpoint)
    FETCH_SNAPSHOT = "FETCH_SNAPSHOT"  # its stage after step `it` from the peer-memory
    #                                    snapshot `peer` holds (the snapshot port)
    RESTART_AFTER = "RESTART_AFTER"  # the stepper, copies and logs go on after step `it`
    TELL_ROLLBACK = "TELL_ROLLBACK"  # the coordinator told the job went back to `it`


@dataclass(frozen=True)
class EntryStep:
    op: EntryOp
    it: Optional[int] = None
    peer: Optional[Worker] = None
    peers: tuple[Worker, ...] = ()


class EntryKind(str, Enum):
    RESUME = "resume"
    RESTORE = "restore"
    LOST = "lost"


@dataclass(frozen=True)
class EntryDecision:
    kind: EntryKind
    iteration: int  # RESUME/LOST: r, the iteration the survivors train next; RESTORE: -1
    top: int  # the newest iteration a member had settled (what a restore trains again)
    lost: tuple[int, ...] = ()  # LOST: the stages no member holds
    steps: tuple[EntryStep, ...] = field(default=())  # this member's, RESUME/LOST survivors


def plan_entry(rows: dict[Worker, tuple[int, bool]], me: Worker, done: int,
               stages: int) -> EntryDecision:
    """`rows`: member -> (last settled iteration, holds no state); `me` and its own last
    stepped iteration `done` (a step it cannot settle is still rolled back)."""
    served = {w[1] for w, (_, fresh) in rows.items() if not fresh}
    top = max(settled for settled, _ in rows.values())
    if not served:
        return EntryDecision(EntryKind.RESTORE, -1, top)
    r = min(settled for settled, fresh in rows.values() if not fresh) + 1
    lost = tuple(sorted(set(range(stages)) - served))
    kind = EntryKind.LOST if lost else EntryKind.RESUME
    steps = _resume_steps(rows, me, done, r) if me[1] not in lost else ()
    return EntryDecision(kind, r, top, lost, steps)


def _resume_steps(rows: dict, me: Worker, done: int, r: int) -> tuple[EntryStep, ...]:
    fresh = rows[me][1]
    out = []
    if not fresh:
        out.append(EntryStep(EntryOp.ROLLBACK, r) if done >= r else EntryStep(EntryOp.SETTLE))
    out.append(EntryStep(EntryOp.KEEP_BEFORE, r))
    peers = sorted(w for w in rows if w[1] == me[1])
    donors = [w for w in peers if not rows[w][1]]
    takers = tuple(w for w in peers if rows[w][1])
    if fresh:
        out.append(EntryStep(EntryOp.RECV_STATE, peer=donors[0]))
    elif takers and me == donors[0]:
        out.append(EntryStep(EntryOp.SEND_STATE, peers=takers))
    return tuple(out)


# RESTORE: who restores what from where, over the tiers

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


def restore_steps(rp: RestorePlan, members: dict[Worker, Has], me: Worker
                  ) -> tuple[EntryStep, ...]:
    """`me`'s steps of restore plan `rp`: its stage's state after step k from its own
    copy (then sent to the members of its stage without one, if it provides them), from
    the provider of its stage (sent over the world when the provider restored its own
    copy of it; else fetched from the snapshot the provider holds); then training goes
    on after k, and the lowest member tells the coordinator."""
    k, stage = rp.iteration, members[me].stage
    prov = rp.providers.get(stage)
    if me in rp.own:
        out = [EntryStep(EntryOp.RESTORE_OWN, k)]
        if prov == me:
            out.append(EntryStep(EntryOp.SEND_STATE, peers=rp.takers[stage]))
    elif prov in rp.own and members[prov].stage == stage:
        out = [EntryStep(EntryOp.RECV_STATE, peer=prov)]
    else:
        out = [EntryStep(EntryOp.FETCH_SNAPSHOT, k, peer=prov)]
    out.append(EntryStep(EntryOp.RESTART_AFTER, k))
    if me == min(members):
        out.append(EntryStep(EntryOp.TELL_ROLLBACK, k))
    return tuple(out)
