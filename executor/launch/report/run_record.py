"""What a multi-process run did, for its summary: the plan versions it trained under and
the time it took to recover from each injected kill and restart.

The coordinator records, on the wall clock shared with the workers' reports: each kill and
restart it injected, each plan version it published or followed, and each worker's entry
into a version (the `done` message a worker sends once it has entered). The figures are
derived from these alone, after the run.

The record is written only through its methods, one per fact (`killed`, `restarted`,
`published`, `entered`, `trained_with`, `paused`, `resumed`, `replayed`, `rolled_back`):
the parts that learn a fact say it, the record keeps it. Its fields are read, never
written, elsewhere (tests/test_run_record.py checks the product's source for that).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from planner.control.roles import dead_of

Worker = tuple[int, int]


@dataclass
class RunRecord:
    kills_at: list = field(default_factory=list)      # (t, worker, iteration)
    restarts_at: list = field(default_factory=list)   # (t, worker, rejoin iteration)
    published_at: list = field(default_factory=list)  # (t, version)
    # (t, worker, incarnation, version, first iteration) of each entry into a version
    entries: list = field(default_factory=list)
    plans: dict = field(default_factory=dict)         # version -> plan
    # iteration -> the plan version its step ran under (the losses' `done` messages say):
    # by the time an iteration's line is printed, a newer plan may be in force already.
    trained: dict = field(default_factory=dict)
    pauses: int = 0  # times fewer live workers than stages stopped training (Membership.Pause)
    paused_s: float = 0.0  # wall seconds spent so, until the resuming version
    # how each stage lost whole came back: {"kind": "replay", stage, first, last, seconds,
    # workers, version} (executor/runtime/replay/) or {"kind": "rollback", to, why,
    # version} (the whole job went back to its snapshots)
    recoveries: list = field(default_factory=list)

    def published(self, plan) -> None:
        self.plans[plan.version] = plan
        self.published_at.append((time.time(), plan.version))

    def killed(self, w: Worker, iteration: int, t: Optional[float] = None) -> None:
        """An injected SIGKILL of `w` in `iteration` (at wall time `t`, default now)."""
        self.kills_at.append((time.time() if t is None else t, w, iteration))

    def restarted(self, w: Worker, iteration: int) -> None:
        """`w`'s next process started, to rejoin at `iteration`."""
        self.restarts_at.append((time.time(), w, iteration))

    def entered(self, t: float, w: Worker, incarnation: int, version: int,
                first: int) -> None:
        """`w` (incarnation) entered `version` at `t`, to train from iteration `first`."""
        self.entries.append((t, w, incarnation, version, first))

    def trained_with(self, iteration: int, version: int) -> None:
        """`iteration`'s step ran under plan `version` (its losses are in)."""
        self.trained[iteration] = version

    def paused(self) -> None:
        self.pauses += 1

    def resumed(self, seconds: float) -> None:
        """Training resumed after `seconds` paused."""
        self.paused_s += seconds

    def replayed(self, version: int, stage: int, first: int, last: int, seconds: float,
                 workers: int) -> None:
        """Stage `stage`, lost whole, replayed iterations first..last alone."""
        self.recoveries.append({"version": version, "kind": "replay", "stage": stage,
                                "first": first, "last": last, "seconds": seconds,
                                "workers": workers})

    def rolled_back(self, version: int, to: int, why: str, tier: str, again: int) -> None:
        """The job went back to iteration `to`'s copies (from `tier`)."""
        self.recoveries.append({"version": version, "kind": "rollback", "to": to, "why": why,
                                "tier": tier, "again": again})

    def trained_under(self, it: int, version: int, failed) -> tuple[int, list]:
        """(version, failed workers) iteration `it` ran under; the given ones if unknown."""
        v = self.trained.get(it, version)
        plan = self.plans.get(v)
        if plan is not None and plan.partition is not None and plan.incarnations:
            # a shape's empty slots are of its own grid: name the dead workers instead
            # (home slots of the user's grid that fill no slot)
            return v, dead_of(plan.roles or [], len(plan.incarnations),
                              len(plan.incarnations[0]))
        return v, sorted(tuple(x) for x in (plan.failed if plan is not None else failed))

    def plans_used(self, iterations: int) -> list[dict]:
        """Every plan version some worker trained under: what the run really ran."""
        first: dict[int, int] = {}
        for _, _, _, v, it in self.entries:
            first[v] = min(first.get(v, it), it)
        out = []
        for v in sorted(first):
            plan = self.plans.get(v)
            if plan is None or not plan.workers or first[v] >= iterations:
                continue
            out.append({"version": v, "failed": [list(x) for x in plan.failed],
                        "speeds": plan.job.speed, "incarnations": plan.incarnations,
                        "first_iteration": first[v], "period": plan.metrics.period,
                        **({"roles": {r.worker: [r.replica, r.stage] for r in plan.roles},
                            "moves": [m.model_dump() for m in plan.moves or []]}
                           if plan.roles is not None else {}),
                        **({"partition": {"unit": plan.partition.unit,
                                          "bounds": list(plan.partition.bounds),
                                          "grid": [plan.job.replicas, plan.job.stages]}}
                           if plan.partition is not None else {}),
                        "microbatches": {f"{x.replica}:{x.stage}": sum(
                            1 for a in x.actions if a.op == "F") for x in plan.workers}})
        return out

    def recovery(self, fault_log: list) -> list[dict]:
        """Time to recover, from the workers' own entry reports: for a kill, from the
        SIGKILL to the moment the last survivor named by the next plan version entered a
        version at least that new; for a rejoin, from the restart to the moment every member
        of the first version admitting the new process had entered it. Faults whose next
        plan was itself cut short by another fault are left out (no clean measurement)."""
        def first_entry(w, since_t, min_v, inc=None):
            ts = [t for t, x, i, v, _ in self.entries
                  if x == w and v >= min_v and t >= since_t and inc in (None, i)]
            return min(ts) if ts else None

        def everyone_in(version, since_t, skip=None):
            """When the last member of `version` that ever entered it (or a newer one) did;
            a member that never did died meanwhile (its own failure counts apart)."""
            plan = self.plans.get(version)
            if plan is None:
                return None
            members = [plan.filler(*x.key) for x in plan.workers]
            ts = [first_entry(w, since_t, version, plan.incarnation(*w))
                  for w in members if w != skip]
            ts = [t for t in ts if t is not None]
            return max(ts) if ts else None

        def concurrent(start, end, me):
            """Other injected faults in flight during [start, end]: a stalled survivor, or
            a second kill, delays the recovery for reasons of its own."""
            return sorted({f"{kind} {who}" for a, b, kind, who in fault_log
                           if a <= end and b >= start and not (kind == "kill" and a == me)})

        out = []
        for t_k, w, it in self.kills_at:
            nxt = [v for t, v in self.published_at if t >= t_k]
            done = everyone_in(min(nxt), t_k, skip=w) if nxt else None
            if done is not None:
                out.append({"kind": "kill", "worker": list(w), "iteration": it,
                            "seconds": round(done - t_k, 4), "at": round(t_k, 3),
                            "concurrent": concurrent(t_k, done, t_k)})
        for t_r, w, it in self.restarts_at:
            mine = [(t, v) for t, x, inc, v, _ in self.entries if x == w and t >= t_r]
            done = everyone_in(min(mine)[1], t_r) if mine else None
            if done is not None:
                out.append({"kind": "rejoin", "worker": list(w), "iteration": it,
                            "seconds": round(done - t_r, 4), "at": round(t_r, 3),
                            "concurrent": concurrent(t_r, done, None)})
        return out


def failed_by_iteration(plans: list[dict], iterations: int) -> list[list]:
    """The failed set each iteration trained under, from a summary's `plans` (the newest
    version entered at or before it): several versions may share a failed set (speeds
    changed, a resync), so this is what a run's re-routing is checked against."""
    out = []
    for it in range(iterations):
        entered = [p for p in plans if p["first_iteration"] <= it]
        out.append(max(entered, key=lambda p: p["version"])["failed"] if entered else None)
    return out
