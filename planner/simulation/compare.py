"""Every policy on the same trace: the simulator's entry point for code."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from planner.job import JobSpec
from planner.simulation.costs import Model, Pipelines, RecyclePeriods, greedy_period
from planner.simulation.engine import Outcome, run_policy
from planner.simulation.policies import POLICIES, Context, Params
from planner.simulation.trace import Trace


@dataclass
class Result:
    job: JobSpec
    model: Model
    trace: Trace
    duration_s: float
    base_rate: float  # micro-batches per second without failures
    outcomes: list[Outcome]
    plans_made: int = 0
    policy_stats: dict = field(default_factory=dict)  # the recycle policy's moves, restores
    stats: dict = field(default_factory=dict)  # the same, per elastic policy (recycle, recycle-roles)

    @property
    def ideal(self) -> float:
        return self.base_rate * self.duration_s

    def outcome(self, name: str) -> Outcome:
        return next(o for o in self.outcomes if o.policy == name)


def failed_sets(job: JobSpec, trace: Trace, duration_s: float) -> list[frozenset]:
    """Every plannable failed set the trace passes through (none when it carries speeds:
    those sets are planned as they come)."""
    from planner.failures import dead_stage

    if any(e.kind == "speed" for e in trace.events):
        return []
    failed, out = set(trace.initial_failed), [frozenset(trace.initial_failed)]
    for e in trace.events:
        if e.time >= duration_s:
            break
        (failed.update if e.kind == "fail" else failed.difference_update)(e.workers)
        out.append(frozenset(failed))
    return [f for f in out if dead_stage(job, f) is None]


def mean_gap(trace: Trace, duration_s: float) -> float:
    """Mean seconds between the trace's event batches (the recycle policy amortises a
    move over it)."""
    from planner.simulation.engine import batches

    n = len([b for b in batches(trace.events) if b[0] < duration_s])
    return duration_s / max(1, n)


def bamboo_trace(trace: Trace) -> Trace:
    """The trace as Bamboo places its workers: on nodes of G GPUs, a node holds one stage
    of G pipelines, so that no node holds a stage and its successor (whose forward it
    shadows) and one node's loss is one failure in each of G pipelines, never two
    adjacent ones (Bamboo places consecutive stages on different nodes)."""
    from planner.simulation.trace import Placement

    pl = trace.placement
    if pl is None or pl.gpus_per_node == 1 or pl.kind == "replicas" or pl.replicas % pl.gpus_per_node:
        return trace
    return trace.placed(Placement(pl.replicas, pl.stages, pl.gpus_per_node, "replicas"))


def simulate(job: JobSpec, trace: Trace, duration_s: float, unit_s: float,
             params: Params = Params(), policies: Iterable[str] = tuple(POLICIES),
             checkpoint_every_s: float = 1800.0, checkpoint_cost_s: float = 0.0,
             model: Optional[Model] = None, cache=None,
             tick: Optional[Callable[[], None]] = None, jobs: int = 1) -> Result:
    """Run each named policy over `trace` for `duration_s` seconds; `jobs` processes plan
    the trace's failed sets ahead."""
    model = model or Model.of_spec(job)
    policies = list(policies)
    periods = RecyclePeriods(job, unit_s, cache)
    if jobs > 1 and {"recycle", "recycle-short", "recycle-roles", "swift-replay"} & set(policies):
        periods.prefetch(failed_sets(job, trace, duration_s), jobs)
    ctx = Context(job, model, unit_s, periods, Pipelines(job, model, unit_s, greedy_period),
                  params, node_of=trace.node_of, horizon_s=mean_gap(trace, duration_s))
    outcomes, stats = [], {}
    for name in policies:
        policy = POLICIES[name](ctx)
        tr = trace
        if name in ("bamboo", "bamboo-reform") and params.bamboo_own_placement:
            tr = bamboo_trace(trace)
        free = getattr(policy, "free", False)  # the limit pays no checkpoint stall
        outcomes.append(run_policy(policy, tr.events, tr.initial_failed, duration_s,
                                   checkpoint_every_s, 0.0 if free else checkpoint_cost_s,
                                   tick, snapshot_iters=params.snapshot_every))
        if name in ("recycle", "recycle-short", "recycle-roles"):
            stats[name] = {"moves": policy.moves, "snapshot_restores": policy.snapshot_restores,
                           "replays": policy.replays}
        if name == "oobleck" and policy.full_T:  # its best grid against the user's
            stats[name] = {"full_factor": ctx.DM / policy.full_T / ctx.base}
        if name in ("recycle", "recycle-short"):
            stats[name].update(shape_changes=policy.shape_changes,
                               stages_hours=policy.stages_hours(duration_s))
        if name == "recycle":  # (its best shape of every worker: it starts on it)
            stats[name].update(best_full_stages=ctx.shapes.best_full.stages,
                               full_factor=ctx.shapes.full_factor)
    return Result(job, model, trace, duration_s, ctx.base, outcomes, periods.planned,
                  stats.get("recycle", {}), stats)
