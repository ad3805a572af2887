"""Recovery policies: what each pays per failure, per recovery and in steady state.

Each policy turns (event, failed set before and after, worker speeds) into a `Decision`
(planner/simulation/engine.py). The cost models are written out in docs/simulator.md;
the one-line summary of each is its class docstring. Rates are micro-batches per second;
`base` is the failure-free rate, D*M / period([]) of the planner's plan, the same for every
policy but Bamboo (whose redundant forwards cost it in steady state) and SWIFT (logging).
Workers that are slow (a speed below 1) slow every synchronous pipeline they are in: the
policies that do not re-plan run at the slowest live worker's pace.
"""
from __future__ import annotations

from typing import Optional

from planner.failures import dead_stage
from planner.simulation.policies.bamboo import Bamboo
from planner.simulation.policies.bamboo_reform import BambooReform
from planner.simulation.base import Context, Params, Policy  # noqa: F401 (re-exported)
from planner.simulation.policies.checkpoint import CheckpointRestart
from planner.simulation.policies.elastic import ElasticRecycle
from planner.simulation.engine import Decision
from planner.simulation.policies.limit import Limit, ShapeLimit
from planner.simulation.policies.shaped import ShapedRecycle, ShapedWhenShort


class RecycleFixed(Policy):
    """The paper's ReCycle, each worker bound to its stage for life: re-route to same-stage
    peers, the plan's period for the failed set. A failure costs the detection delay and
    the iteration in flight; a rejoin costs nothing (state comes from a live peer while the
    others train); a stage with no live worker halts until a repair, then restarts from the
    last checkpoint. (`recycle`, with roles and shapes, is shaped.py.)"""
    name = "recycle-fixed"

    def steady(self, failed, speed):
        if dead_stage(self.ctx.job, failed) is not None:
            return Decision(0.0)
        P = self.ctx.periods(failed, speed)
        return Decision(self.ctx.DM / P, P)

    def on_event(self, kind, workers, before, after, speed, run):
        p = self.ctx.params
        if self.halted:
            return self._restart(after, speed) if kind == "recover" else None
        d = self.steady(after, speed)
        if d.rate <= 0:
            return self._halt(f"stage {dead_stage(self.ctx.job, after)} lost")
        if kind == "fail":
            return Decision(d.rate, d.iter_s, lose="inflight", stall_s=p.detect_s)
        return d  # a rejoin or a new speed: the next iteration runs the new plan


class SwiftReplay(RecycleFixed):
    """ReCycle's re-routing, plus SWIFT's logging: every stage's inputs (activations and
    gradients) are logged, so a stage with no live worker is restored alone, from its
    last checkpoint, and replays the logged iterations since (on the workers of that stage
    that are back) while the others wait; no other stage rolls back. Pays the logging in
    steady state; takes the global restore instead when that is faster."""
    name = "swift-replay"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.backlog = 0.0  # micro-batches trained since the last checkpoint, at the halt
        self.lost_stages: set[int] = set()

    def _dead(self, failed) -> set[int]:
        D = self.ctx.job.replicas
        return {s for s in range(self.ctx.job.stages)
                if sum(1 for d in range(D) if (d, s) in failed) == D}

    def steady(self, failed, speed):
        d = super().steady(failed, speed)
        keep = 1.0 - self.ctx.params.swift_log_overhead
        return Decision(d.rate * keep, d.iter_s / keep) if d.rate > 0 else d

    def on_event(self, kind, workers, before, after, speed, run):
        ctx, p = self.ctx, self.ctx.params
        if self.halted:
            if dead_stage(ctx.job, after) is not None:
                self.lost_stages |= self._dead(after)
                return None
            if kind != "recover":
                return None
            d = self.steady(after, speed)
            iterations = self.backlog / ctx.DM
            replay = 0.0
            for st in self.lost_stages:
                live = sum(1 for r in range(ctx.job.replicas) if (r, st) not in after)
                work = ctx.DM * (ctx.job.cost.F[st] + ctx.job.cost.I[st] + ctx.job.cost.W[st])
                replay = max(replay, iterations * work * ctx.unit_s / live)
            global_redo = self.backlog / ctx.base
            self.halted = False
            if replay <= global_redo:
                return Decision(d.rate, d.iter_s, stall_s=p.restart_s + replay,
                                note=f"replayed {iterations:.0f} iterations of stage(s) "
                                     f"{sorted(self.lost_stages)}")
            return Decision(d.rate, d.iter_s, lose="checkpoint", stall_s=p.restart_s,
                            note="restored from checkpoint (faster than replay)")
        d = self.steady(after, speed)
        if d.rate <= 0:
            self.halted = True
            self.lost_stages = self._dead(after)
            self.backlog = run.since_ckpt
            return Decision(0.0, lose="inflight", note="stage lost, replay pending")
        if kind == "fail":
            return Decision(d.rate, d.iter_s, lose="inflight", stall_s=p.detect_s)
        return d


class DropReplica(Policy):
    """torchft-style: a replica with any failed worker leaves and the global batch shrinks
    (live replicas x M micro-batches an iteration, at the failure-free period); the step in
    flight is not committed; a repaired replica heals from a live peer while the others
    train and rejoins at once. No replica left: restore from a checkpoint."""
    name = "drop-replica"
    sync_rejoin = False  # rollback / lossy-forward: everyone waits for the rejoin
    loses = "inflight"

    def steady(self, failed, speed):
        live = set(range(self.ctx.job.replicas)) - {d for d, _ in failed}
        if not live:
            return Decision(0.0)
        s = self.ctx.slowest(failed, speed, live)
        return Decision(len(live) * self.ctx.M / self.ctx.P0 * s, self.ctx.P0 / s)

    def react(self, kind, workers, before, after, d):
        p = self.ctx.params
        live_before = {d for d in range(self.ctx.job.replicas)} - {d for d, _ in before}
        live_after = {d for d in range(self.ctx.job.replicas)} - {d for d, _ in after}
        if kind == "fail":
            dropped = live_before - live_after
            if not dropped:
                return None  # the failed workers' replicas had already left
            if d.rate <= 0:
                return self._halt("every replica lost")
            if self.loses == "fraction":
                return Decision(d.rate, d.iter_s, lose="fraction",
                                fraction=len(dropped) / len(live_before), stall_s=p.detect_s)
            return Decision(d.rate, d.iter_s, lose="inflight", stall_s=p.detect_s)
        if live_after == live_before:
            return None
        return Decision(d.rate, d.iter_s, stall_s=p.rejoin_s if self.sync_rejoin else 0.0)


class Rollback(DropReplica):
    """Argonne's immediate mini-batch rollback (data parallel): the survivors shrink the
    group, roll the iteration in flight back and re-run it without the failed replicas
    (global batch smaller from then on); a repaired replica rejoins by a synchronous
    broadcast of the model (everyone waits `rejoin_s`). Keeps a consistent model."""
    name = "rollback"
    sync_rejoin = True


class LossyForward(DropReplica):
    """Argonne's lossy forward recovery: the survivors finish the iteration in flight with
    their own gradients; the failed replicas' micro-batches of that iteration are skipped
    (counted as lost work), not re-run: no time lost beyond detection, at the price of an
    update computed on a partial batch (and, for a failure mid all-reduce, partially
    averaged gradients): an accuracy trade, not an exact one. Rejoin as rollback."""
    name = "lossy-forward"
    sync_rejoin = True
    loses = "fraction"


class Oobleck(Policy):
    """Pipeline templates: the live workers are re-instantiated into pipelines of k stages
    (k from the smallest depth that holds the model to S) with the global batch spread to
    equalise their iteration times; each failure and each rejoin costs a reconfiguration;
    a failure also loses the iteration in flight. The rate of a configuration is D*M
    micro-batches over the planner's periods of its templates, in the same currency as
    every policy's (so with every worker live it may beat the user's grid: its templates
    re-cut the model). Halts when fewer workers than the shallowest template are left, or
    when one event takes every copy of a stage."""
    name = "oobleck"

    def __init__(self, ctx):
        super().__init__(ctx)
        S = ctx.job.stages
        kmin = ctx.params.oobleck_min_stages
        if kmin <= 0 and not any(u.params for u in ctx.model.units):
            # a spec says nothing of parameter memory: allow stages of up to two spec stages
            kmin = -(-S // 2)
        if kmin <= 0:
            kmin = next((k for k in range(1, S + 1) if ctx.pipelines.line(k) is not None), S)
        self.kmin = max(1, min(kmin, S))
        self._rate: dict[int, tuple[float, float]] = {}
        # its best use of the whole grid (what it trains with no failure), for the report
        self.full_T = self._config_time(ctx.job.replicas * S)

    def _config_time(self, n: int) -> Optional[float]:
        """Least iteration time of D*M micro-batches over n workers: p pipelines of about
        n/p stages each (the first ones hold the extra workers), whole micro-batches each."""
        ctx, S = self.ctx, self.ctx.job.stages
        best = None
        for p in range(1, min(n // self.kmin, ctx.DM) + 1):
            base, extra = divmod(n, p)
            sizes = [min(S, base + (1 if i < extra else 0)) for i in range(p)]
            lines = [ctx.pipelines.line(k) for k in sizes]
            if any(ln is None for ln in lines):
                continue
            T = _spread(lines, ctx.DM)
            if T is not None:
                best = T if best is None else min(best, T)
        return best
    def steady(self, failed, speed):
        ctx = self.ctx
        n = ctx.job.replicas * ctx.job.stages - len(failed)
        if n < self.kmin:
            return Decision(0.0)
        if n not in self._rate:
            T = self._config_time(n)
            rate = 0.0 if T is None else ctx.DM / T
            self._rate[n] = (rate, ctx.DM / rate if rate else 0.0)
        rate, it = self._rate[n]
        s = ctx.slowest(failed, speed)
        return Decision(rate * s, it / s)

    def react(self, kind, workers, before, after, d):
        p = self.ctx.params
        if kind == "fail":
            if d.rate <= 0 or dead_stage(self.ctx.job, workers) is not None:
                return self._halt("too few workers" if d.rate <= 0 else "every copy of a stage lost")
            return Decision(d.rate, d.iter_s, lose="inflight",
                            stall_s=p.detect_s + p.oobleck_reconfig_s)
        return Decision(d.rate, d.iter_s, stall_s=p.oobleck_reconfig_s)


def _spread(lines: list[tuple[float, float]], total: int) -> Optional[float]:
    """Iteration time when `total` micro-batches go, whole, to pipelines that run m of
    them in a + b*m seconds: each next micro-batch to the pipeline that ends earliest
    with it. None if some pipeline would get none (fewer pipelines do better)."""
    import heapq

    m = [1] * len(lines)
    if total < len(lines):
        return None
    heap = [(a + 2 * b, i) for i, (a, b) in enumerate(lines)]
    heapq.heapify(heap)
    for _ in range(total - len(lines)):
        _, i = heapq.heappop(heap)
        m[i] += 1
        a, b = lines[i]
        heapq.heappush(heap, (a + b * (m[i] + 1), i))
    return max(a + b * k for (a, b), k in zip(lines, m))


POLICIES = {cls.name: cls for cls in (ShapedRecycle, ShapedWhenShort, ElasticRecycle,
                                      RecycleFixed, CheckpointRestart, Rollback, LossyForward,
                                      DropReplica, Oobleck, Bamboo, SwiftReplay, BambooReform,
                                      Limit, ShapeLimit)}

__all__ = ["POLICIES", "Params", "Context", "Policy", "RecycleFixed", "SwiftReplay",
           "DropReplica", "Rollback", "LossyForward", "Oobleck", "Bamboo", "BambooReform",
           "CheckpointRestart", "ElasticRecycle", "ShapedRecycle", "ShapedWhenShort", "Limit",
           "ShapeLimit"]
