"""Which workers may die next without leaving a stage empty, when plans move workers
between stages (planner/control/elastic.py): the chaos schedule follows every membership
the runtime may reach, running the runtime's own pure Membership. Events of one iteration
may land in any order (two kills race to be seen first), so each order is followed."""
from __future__ import annotations

from itertools import permutations
from typing import Iterable, Optional

from planner.control.elastic import LOCAL_HORIZON
from planner.control.membership import Membership, Publish
from planner.job import JobSpec

Worker = tuple[int, int]


def _key(m: Membership):
    return (m.failed, m.roles, m.incarnations, m.moving)


class Liveness:
    def __init__(self, replicas: int, stages: int, microbatches: int):
        job = JobSpec.uniform(replicas, stages, microbatches)  # as `recycle train` plans
        m, _ = Membership.start(replicas, stages, job=job, horizon=LOCAL_HORIZON).first()
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
