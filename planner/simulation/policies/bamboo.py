"""Bamboo: redundant forwards always on, a failed stage run by its predecessor."""
from __future__ import annotations

from typing import Optional

from planner.simulation.base import Policy
from planner.simulation.engine import Decision


class Bamboo(Policy):
    """Redundant computation always on: stage s also runs stage s+1's forward (ring), its
    cost in every iteration (less `bamboo_rc_hidden` of it, hidden in bubbles). A failed
    worker's stage is taken over by its predecessor in the same pipeline (fail-over, no
    work lost); the pipelines run in lock-step, so the job runs at the slowest pipeline's
    pace. Two adjacent failures in one pipeline lose the shadow: restart from a checkpoint
    without that pipeline until it is repaired; no pipeline left: wait."""
    name = "bamboo"

    def __init__(self, ctx):
        super().__init__(ctx)
        self._memo: dict[tuple, Optional[float]] = {}

    def _fatal(self, stages: frozenset) -> bool:
        S = self.ctx.job.stages
        if S == 1:
            return bool(stages)
        return any((s + 1) % S in stages for s in stages) or len(stages) >= S

    def _pipeline_T(self, stages: frozenset) -> Optional[float]:
        """One pipeline's iteration (s), its failed stages run by their predecessors."""
        if stages not in self._memo:
            ctx, S = self.ctx, self.ctx.job.stages
            groups = [list(g) for g in ctx.stage_units]
            merged: list[list] = []
            owner = [s for s in range(S) if s not in stages]
            for s in owner:
                merged.append(list(groups[s]))
            for s in sorted(stages):  # taken over by the predecessor (ring)
                pred = (s - 1) % S
                merged[owner.index(pred)].extend(groups[s])
            hide = 1.0 - ctx.params.bamboo_rc_hidden
            k = len(merged)
            extra = [round(hide * sum(u.F for u in merged[(j + 1) % k])) if k > 1 else 0
                     for j in range(k)]
            P = ctx.pipelines.period(merged, ctx.M, extra)
            self._memo[stages] = None if P is None else P * ctx.P0 / ctx.P_pipe
        return self._memo[stages]

    def _running(self, failed):
        per: dict[int, set] = {}
        for d, s in failed:
            per.setdefault(d, set()).add(s)
        return [d for d in range(self.ctx.job.replicas)
                if not self._fatal(frozenset(per.get(d, ())))], per

    def steady(self, failed, speed):
        ctx = self.ctx
        running, per = self._running(failed)
        Ts = [self._pipeline_T(frozenset(per.get(d, ()))) for d in running]
        if not running or any(T is None for T in Ts):
            return Decision(0.0)
        T = max(Ts) / ctx.slowest(failed, speed, set(running))
        return Decision(len(running) * ctx.M / T, T)

    def react(self, kind, workers, before, after, d):
        p = self.ctx.params
        was, _ = self._running(before)
        now, _ = self._running(after)
        if kind == "fail":
            if not {w[0] for w in workers} & set(was):
                return None  # only pipelines that were already out
            if set(was) - set(now):  # a pipeline lost a worker and its shadow
                if d.rate <= 0:
                    return self._halt("adjacent failures in every pipeline")
                return Decision(d.rate, d.iter_s, lose="checkpoint",
                                stall_s=p.detect_s + p.restart_s,
                                note="adjacent failures: restart without a pipeline")
            return Decision(d.rate, d.iter_s, stall_s=p.detect_s + p.bamboo_failover_s)
        if not {w[0] for w in workers} & set(now):
            return None
        return Decision(d.rate, d.iter_s, stall_s=p.bamboo_failover_s)
