"""Which workers may die next without leaving a stage empty, when plans move workers
between stages (planner/control/elastic.py): the chaos schedule follows every membership
the runtime may reach, running the runtime's own pure Membership. Events of one iteration
may land in any order (two kills race to be seen first), so each order is followed."""
from __future__ import annotations

from itertools import permutations
from typing import Iterable, Optional

from planner.control.elastic import LOCAL_HORIZON
from planner.control.membership import Membership, Publish
from planner.control.roles import identity_roles
from planner.control.snapshot_holders import snapshot_holders
from planner.job import JobSpec
from planner.plan import home_of

Worker = tuple[int, int]


def _key(m: Membership):
    return (m.failed, m.roles, m.incarnations, m.moving)


class Liveness:
    def __init__(self, replicas: int, stages: int, microbatches: int, snapshots: bool = False,
                 horizon: float = LOCAL_HORIZON):
        """`snapshots`: the run keeps peer-memory snapshots, so a stage may lose every
        worker (one moves in); `horizon`: what the planner weighs moves over (the service's
        own for runs through it)."""
        job = JobSpec.uniform(replicas, stages, microbatches)  # as `recycle train` plans
        m, _ = Membership.start(replicas, stages, job=job, horizon=horizon,
                                snapshots=snapshots).first()
        self.states = [m]

    def dead(self) -> set[Worker]:
        """Workers dead in some reachable membership."""
        return set().union(*(m.failed for m in self.states))

    def stage_of(self, w: Worker, states: Optional[list] = None) -> set[int]:
        """The stages `w` may fill now (or in `states`)."""
        out = set()
        for m in self.states if states is None else states:
            slot = w if m.roles is None else next(
                ((r.replica, r.stage) for r in m.roles if r.worker == f"{w[0]}.{w[1]}"), None)
            if slot is not None and w not in m.failed:
                out.add(slot[1])
        return out

    def fillers(self, stage: int) -> set[Worker]:
        """Workers that fill `stage` in every reachable membership."""
        return {w for m in self.states for w in m.live() if self.stage_of(w) == {stage}}

    def holders(self) -> set[Worker]:
        """Workers that hold some stage's peer-memory snapshot in some reachable membership
        (planner/control/snapshot_holders.py, as every worker computes it)."""
        out = set()
        for m in self.states:
            roles = list(m.roles) if m.roles is not None else identity_roles(m.job, m.failed)
            out |= {home_of(h) for h in snapshot_holders(roles, m.stages).values() if h}
        return out

    def movers(self, states: Optional[list] = None) -> set[Worker]:
        """Workers the newest version of some reachable membership (or of `states`) moves
        to another stage, with the workers of the stages they move to (the source of
        their state)."""
        out = set()
        for m in self.states if states is None else states:
            for w in m.moving:
                out.add(w)
                out |= {v for v in m.live() if self.stage_of(v, [m]) & self.stage_of(w, [m])}
        return out

    def after(self, recovers: Iterable[Worker], kills: Iterable[Worker]) -> Optional[list]:
        """Every membership after these events in any order (recoveries first: a rejoin is
        admitted before its iteration trains); None if some order leaves no plan."""
        recovers, kills = list(recovers), list(kills)
        out: dict = {}
        for m in self.states:
            m = m.entered(m.version)  # the last iteration's moves are done by now
            for rec in permutations(recovers):
                for kil in permutations(kills):
                    x = m
                    for w in rec:
                        x, d = x.recover(w)
                        if not isinstance(d, Publish):
                            return None
                    for w in kil:
                        x, d = x.fail(w)
                        if not isinstance(d, Publish):
                            return None
                    out[_key(x)] = x
        return list(out.values())
