"""Bamboo that re-forms its pipelines from the live nodes (a sensitivity variant).

The `bamboo` policy waits for a broken pipeline's own slots to be refilled. Bamboo also
reconfigures: after a failure its redundancy cannot cover (two adjacent stages of one
pipeline) it restores from the checkpoint onto floor(live / S) pipelines built from every
live worker, and when enough new nodes have joined to form another pipeline it
reconfigures to use them. Pipelines are dealt so that consecutive stages sit on different
nodes (the live workers sorted by node, position j of pipeline i taking the (j*p + i)-th:
p >= G apart). Between reconfigurations a failure is a fail-over as in `bamboo`.
"""
from __future__ import annotations

from planner.simulation.engine import Decision
from planner.simulation.policies.bamboo import Bamboo


class BambooReform(Bamboo):
    name = "bamboo-reform"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.live: set = set()
        self.pipes: list[list] = []  # worker per position, per pipeline

    def _form(self) -> None:
        S = self.ctx.job.stages
        order = sorted(self.live, key=lambda w: (self.ctx.node_of(w), w))
        p = len(order) // S
        self.pipes = [[order[j * p + i] for j in range(S)] for i in range(p)]

    def _rate(self, speed) -> Decision:
        ctx = self.ctx
        if not self.pipes:
            return Decision(0.0)
        Ts = []
        for pipe in self.pipes:
            down = frozenset(j for j, w in enumerate(pipe) if w not in self.live)
            if self._fatal(down):
                return Decision(0.0)
            Ts.append(self._pipeline_T(down))
        if any(T is None for T in Ts):
            return Decision(0.0)
        T = max(Ts) / ctx.slowest(frozenset(), speed)
        return Decision(len(self.pipes) * ctx.M / T, T)

    def start(self, failed, speed):
        D, S = self.ctx.job.replicas, self.ctx.job.stages
        self.live = {(d, s) for d in range(D) for s in range(S) if (d, s) not in failed}
        self._form()
        d = self._rate(speed)
        self.halted = d.rate <= 0
        return d

    def on_event(self, kind, workers, before, after, speed, run):
        p, S = self.ctx.params, self.ctx.job.stages
        if kind == "speed":
            return None if self.halted else self._rate(speed)
        in_use = {w for pipe in self.pipes for w in pipe}
        if kind == "recover":
            self.live |= set(workers)
            spare = len(self.live - in_use) + sum(1 for w in in_use if w not in self.live)
            if self.halted or len(self.live) // S > len(self.pipes) and spare >= S:
                was_halted = self.halted
                self._form()
                d = self._rate(speed)
                if d.rate <= 0:
                    return None
                self.halted = False
                if was_halted:
                    return Decision(d.rate, d.iter_s, stall_s=p.restart_s,
                                    note="restarted from checkpoint")
                return Decision(d.rate, d.iter_s, stall_s=p.bamboo_failover_s,
                                note="reconfigured onto new nodes")
            if set(workers) & in_use:  # back in its own pipeline position: fail back
                d = self._rate(speed)
                return Decision(d.rate, d.iter_s, stall_s=p.bamboo_failover_s)
            return None
        self.live -= set(workers)
        if self.halted or not set(workers) & in_use:
            return None
        d = self._rate(speed)
        if d.rate > 0:
            return Decision(d.rate, d.iter_s, stall_s=p.detect_s + p.bamboo_failover_s)
        # redundancy lost: restore from the checkpoint onto the pipelines the live nodes make
        self._form()
        d = self._rate(speed)
        if d.rate <= 0:
            return self._halt("fewer live workers than one pipeline")
        return Decision(d.rate, d.iter_s, lose="checkpoint", stall_s=p.detect_s + p.restart_s,
                        note="adjacent failures: restored onto re-formed pipelines")
