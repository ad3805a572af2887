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
    # RESHAPE's (a plan of another shape: the new stage assembled by parameter name)
    KEEP_PIECES = "KEEP_PIECES"  # the pieces of old `stage` its new stage runs, from itself
    SEND_PIECES = "SEND_PIECES"  # the pieces of old `stage` that `peer`'s new stage runs
    RECV_PIECES = "RECV_PIECES"  # the pieces `peer` provides of its old stage
    BUILD_STAGE = "BUILD_STAGE"  # its new stage, built as at the run's start (the seed)
    LOAD_PIECES = "LOAD_PIECES"  # what it kept and received, assembled by name
    LOAD_PARTS = "LOAD_PARTS"  # the disk checkpoint of iteration `it`, by name
    AGREE = "AGREE"  # every member has its new stage (one all-gather): take them
    TAKE_SHAPE = "TAKE_SHAPE"  # run the new stage from its state after step `it` on


@dataclass(frozen=True)
class EntryStep:
    op: EntryOp
    it: Optional[int] = None
    peer: Optional[Worker] = None
    peers: tuple[Worker, ...] = ()
    stage: Optional[int] = None  # KEEP_PIECES, SEND_PIECES: the old stage


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


# RESHAPE: entering a plan of another shape (reshape.py carries it out)

class ShapeMismatch(RuntimeError):
    """Members hold state of different shapes (cannot happen: a change commits on all)."""


@dataclass(frozen=True)
class ShapeRow:
    """What one member holds before a change of shape (one all-gather)."""
    shape: int  # the id of its state's shape (stage_state/shape.py shape_id)
    stages: int  # that shape's stage count
    stage: int  # its stage in it
    settled: int  # the last iteration it stepped for good (-1 when fresh)
    fresh: bool  # holds no state
    boundaries: tuple[int, ...]  # that shape's cut points (its first layer per stage)


@dataclass(frozen=True)
class ReshapeSource:
    """Where the new shape's state comes from: every old stage after step `iteration`,
    each from its `providers` member (None: every member builds its new stage itself,
    from the seed or a disk checkpoint it reads); `tier`, in words."""
    iteration: int
    providers: Optional[dict[int, Worker]]
    tier: str

    @property
    def live(self) -> bool:
        return self.tier == LIVE


LIVE = "live workers"


def old_shape(rows: dict[Worker, ShapeRow], new_shape: int) -> Optional[ShapeRow]:
    """A row of the shape the members' state has, or None when nothing moves by name
    (no member holds state, or all hold the new shape already: the plain entry)."""
    holders = [r for r in rows.values() if not r.fresh]
    ids = {r.shape for r in holders}
    if len(ids) > 1:
        raise ShapeMismatch(f"members hold state of {len(ids)} shapes")
    return None if not holders or ids == {new_shape} else holders[0]


def live_source(rows: dict[Worker, ShapeRow], stages: int) -> Optional[ReshapeSource]:
    """Every old stage held by a live member: the job goes on after the lowest iteration
    such a member settled, the lowest member of each stage provides it; else None."""
    holders = {w: r for w, r in rows.items() if not r.fresh}
    if {r.stage for r in holders.values()} != set(range(stages)):
        return None
    return ReshapeSource(min(r.settled for r in holders.values()),
                         {s: min(w for w, r in holders.items() if r.stage == s)
                          for s in range(stages)}, LIVE)


def restore_source(members: dict[Worker, Has], stages: int) -> Optional[ReshapeSource]:
    """A stage lost whole before a change of shape: every old stage goes back to the
    newest iteration all have a copy of in some tier (None: none has). A run from its
    seed has every stage before its first step anywhere, and a disk checkpoint that
    every member reads holds every stage of any shape by name: there each member builds
    its new stage itself (nothing moves)."""
    have: dict[int, set[int]] = {s: set() for s in range(stages)}
    for h in members.values():
        for s, its in h.copies.items():
            have.setdefault(s, set()).update(its)
    everywhere = set.intersection(*(set(h.disk) | ({h.origin} if h.origin is not None
                                                    else set()) for h in members.values()))
    common = set.intersection(*(have[s] | everywhere for s in range(stages)))
    if not common:
        return None
    k = max(common)
    if k in everywhere:
        return ReshapeSource(k, None, tier_of(members, k))
    return ReshapeSource(k, {s: min(w for w, h in members.items() if h.can_give(s, k))
                             for s in range(stages)}, "peer-memory snapshots")


def reshape_steps(src: ReshapeSource, me: Worker, mine: ShapeRow, done: int, origin,
                  workers: list[Worker], old_names: list[set], new_names: list[set]
                  ) -> tuple[EntryStep, ...]:
    """`me`'s steps into the new shape: its old stage at its state after step k (rolled
    back if ahead, else settled; live sources only), the pieces of every old stage its
    new stage runs kept, sent and received in one global order (no cycle of blocking
    sends), its new stage built and loaded (the pieces by name, or the disk checkpoint
    of k), then taken once every member has one; the lowest member tells the
    coordinator when the job went back."""
    k, out = src.iteration, []
    if src.live and not mine.fresh:
        out.append(EntryStep(EntryOp.ROLLBACK, k + 1) if done > k else
                   EntryStep(EntryOp.SETTLE))
    for s, p in sorted((src.providers or {}).items()):
        for t in sorted(workers):
            if not old_names[s] & new_names[t[1]]:
                continue
            if t == p == me:
                out.append(EntryStep(EntryOp.KEEP_PIECES, stage=s))
            elif me == p:
                out.append(EntryStep(EntryOp.SEND_PIECES, peer=t, stage=s))
            elif me == t:
                out.append(EntryStep(EntryOp.RECV_PIECES, peer=p))
    out.append(EntryStep(EntryOp.BUILD_STAGE))
    if src.providers is not None:
        out.append(EntryStep(EntryOp.LOAD_PIECES))
    elif k != origin:
        out.append(EntryStep(EntryOp.LOAD_PARTS, k))
    out += [EntryStep(EntryOp.RESTART_AFTER, k), EntryStep(EntryOp.AGREE),
            EntryStep(EntryOp.TAKE_SHAPE, k)]
    if not src.live and me == min(workers):
        out.append(EntryStep(EntryOp.TELL_ROLLBACK, k))
    return tuple(out)
