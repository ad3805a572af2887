"""Elastic membership: the roles a membership change leaves the live workers in.

A worker is known by its home slot (its id `R.S`, the slot it started in); its role says
which slot it fills now. `reassign` is what membership.py asks when the live set changes:
given the dead workers and the roles in force, it returns the roles (and moves) of the
next version, or the reason no version exists. Pure, like roles.py it builds on.

Policy (docs/design.md, "Roles"):
- ReCycle's answer to a failure is re-routing: while every stage keeps a live worker and
  no move pays for itself within the horizon, nobody changes stage and the plan is the
  plain failed set (roles stay as they are, identity for a run that never moved).
- A stage that lost every live worker takes a worker from the stage that misses it
  least; its state comes from the stage's peer-memory snapshot, or another tier (a disk
  checkpoint, the seed). With no copy in any tier the run halts.
- Fewer live workers than stages: no assignment serves every stage; membership.py pauses
  (nothing lost) or halts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from planner.control.roles import NoRolesError, choose_roles, failed_of
from planner.job import JobSpec
from planner.plan import Move, Role, home_id, home_of

Worker = tuple[int, int]
# Time units a move is weighed over in a local run (`recycle train`): such runs are short
# and their moves cost milliseconds (the spec gives no state_bytes), so any move that
# lowers the period pays.
LOCAL_HORIZON = 1e9


@dataclass(frozen=True)
class Reassigned:
    roles: Optional[tuple[Role, ...]]  # None: identity (worker R.S in slot (R, S))
    moves: tuple[Move, ...]
    failed: tuple[Worker, ...]  # the empty slots: the failed set the schedule is planned for


def slots_of(replicas: int, stages: int, dead: Iterable[Worker],
             roles: Optional[Iterable[Role]]) -> dict[str, Worker]:
    """Live worker id -> the slot it fills now."""
    dead = {tuple(w) for w in dead}
    if roles is None:
        return {home_id(r, s): (r, s) for r in range(replicas) for s in range(stages)
                if (r, s) not in dead}
    gone = {home_id(*w) for w in dead}  # ids are `R.S` (home_id): no parse per role
    return {x.worker: (x.replica, x.stage) for x in roles if x.worker not in gone}


def reassign(job: JobSpec, dead: Iterable[Worker], roles: Optional[Iterable[Role]],
             fresh: Iterable[Worker] = (), horizon: float = 0.0,
             snapshots: bool = False, restorable: Optional[bool] = None
             ) -> tuple[Optional[Reassigned], Optional[str]]:
    """The roles after a change: `dead` workers gone, `fresh` ones (a new process with no
    state) back. `snapshots`: every stage also lives in peer memory (no stage is a halt
    risk); `restorable` (default: `snapshots`): a stage lost whole has a copy in some tier
    (peer memory, a disk checkpoint, the seed). Returns (Reassigned, None) or (None, the
    reason no plan exists)."""
    restorable = snapshots if restorable is None else restorable
    D, S = job.replicas, job.stages
    dead = {tuple(w) for w in dead}
    live: dict[str, Optional[Worker]] = slots_of(D, S, dead | set(map(tuple, fresh)), roles)
    for w in fresh:
        live[home_id(*w)] = None
    try:
        a = choose_roles(job, live, horizon, snapshots=snapshots)
    except NoRolesError as exc:
        # Membership asks only with as many live workers as stages (it pauses or halts
        # otherwise); a driver that asks directly is told that no plan exists.
        return None, f"{exc}: the run halts; resume from checkpoint once workers are back"
    lost = a.snapshot_stages
    if lost and not restorable:
        return None, (f"stage {lost[0]} has no live replica and no snapshot in peer memory "
                      f"(`recycle train --snapshot-every K` keeps them): restore from checkpoint")
    shifted = [m for m in a.moves if m.from_stage is not None or m.source == "snapshot"]
    strays = [w for slot, w in a.slots.items() if live[w] is None and home_of(w) != slot]
    if roles is None and not shifted and not strays:
        # nobody changes stage: the plain failed set, as before roles existed
        gone = sorted(w for w in dead if w not in set(map(tuple, fresh)))
        return Reassigned(None, (), tuple(gone)), None
    if roles is not None and not shifted and not strays:
        kept = _kept(roles, dead, live, a.slots)
        if kept is not None:
            return Reassigned(kept, (), tuple(failed_of(list(kept), D, S))), None
    return Reassigned(tuple(a.roles), tuple(a.moves), tuple(tuple(w) for w in a.failed)), None


def _kept(roles, dead, live, chosen) -> Optional[tuple[Role, ...]]:
    """The roles in force less the dead, with fresh workers back in the slots `chosen`
    ({slot: worker}) gives them, when that leaves every worker where it was (no
    re-slotting for nothing)."""
    gone = {home_id(*w) for w in dead}
    out = [x for x in roles if x.worker not in gone and live.get(x.worker) is not None]
    taken = {(x.replica, x.stage) for x in out}
    for (d, s), w in chosen.items():
        if live[w] is None:
            if (d, s) in taken:
                return None
            out.append(Role(worker=w, replica=d, stage=s))
            taken.add((d, s))
    return tuple(sorted(out, key=lambda x: (x.replica, x.stage)))
