"""What every policy shares: its parameters, the context it reads, the Policy base."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from planner.job import JobSpec
from planner.simulation.costs import Model, Pipelines, RecyclePeriods, group
from planner.simulation.engine import Decision


@dataclass(frozen=True)
class Params:
    detect_s: float = 5.0  # failure to detection (the in-flight iteration hangs meanwhile)
    restart_s: float = 300.0  # restart of the whole job from a checkpoint
    spares: int = 0  # checkpoint-restart: spare workers standing by
    rejoin_s: float = 10.0  # rollback / lossy-forward: everyone waits while a worker rejoins
    oobleck_reconfig_s: float = 5.0
    oobleck_min_stages: int = 0  # 0: the smallest depth whose stages hold the model
    bamboo_failover_s: float = 5.0
    bamboo_rc_hidden: float = 0.0  # share of Bamboo's redundant forward hidden in bubbles
    # share of throughput logging boundary tensors costs: SWIFT's, and recycle's while it
    # replays lost stages (`replay`); 1%, as measured (benchmarks/results/swift.md)
    swift_log_overhead: float = 0.01
    # checkpoint-restart: restart on the replicas left whole (shrink the global batch, as
    # torchrun --nnodes MIN:MAX users do) instead of waiting for spares or repairs
    checkpoint_shrink: bool = False
    # Bamboo on multi-GPU nodes: its own placement (a node holds one stage of G pipelines,
    # so a stage and its shadow never share a node) instead of the trace's
    bamboo_own_placement: bool = True
    snapshot_every: int = 5  # recycle: iterations between peer-memory snapshots
    # recycle: a stage lost whole is replayed alone from the boundary logs (False: the job
    # rolls back to the snapshot, as with `recycle train --log-memory off`)
    replay: bool = True
    horizon_s: Optional[float] = None  # recycle: amortisation horizon (None: the trace's
    # mean time between events)


class Context:
    """What every policy reads: the job, its period source, pipeline estimates."""

    def __init__(self, job: JobSpec, model: Model, unit_s: float, periods: RecyclePeriods,
                 pipelines: Pipelines, params: Params, node_of=None,
                 horizon_s: Optional[float] = None):
        self.job, self.model, self.unit_s, self.params = job, model, unit_s, params
        self.node_of = node_of or (lambda w: w)  # which node a worker (home slot) is on
        # expected time to the next event: what a move's gain is amortised over
        self.horizon_s = params.horizon_s or horizon_s or 3600.0
        self.periods, self.pipelines = periods, pipelines
        self.P0 = periods(frozenset())
        self.DM, self.M = job.num_microbatches, job.microbatches
        self.base = self.DM / self.P0
        # a single D=1 pipeline of the job's S stages, to normalise pipeline estimates
        self.stage_units = group(model.units, job.stages)
        self.P_pipe = pipelines.period(self.stage_units, self.M)

    @cached_property
    def shapes(self):
        """The job's shapes and their periods (built on first use: only `recycle` and
        `limit` read them)."""
        from planner.simulation.shape_costs import ShapeCosts

        return ShapeCosts(self.job, self.model, self.unit_s, self.periods,
                          snapshots=self.params.snapshot_every > 0)

    def slowest(self, failed: frozenset, speed: dict, replicas=None) -> float:
        vals = [v for w, v in speed.items() if w not in failed
                and (replicas is None or w[0] in replicas)]
        return min([1.0] + vals) if vals else 1.0


class Policy:
    name = ""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.halted = False

    def start(self, failed: frozenset, speed: dict) -> Decision:
        d = self.steady(failed, speed)
        self.halted = d.rate <= 0
        return d

    def steady(self, failed: frozenset, speed: dict) -> Decision:
        raise NotImplementedError

    def on_event(self, kind, workers, before, after, speed, run) -> Optional[Decision]:
        """The new rate after a trace event (None: unchanged). By default a halted policy
        waits for a repair to restart, a new speed just re-rates, and `react` decides what a
        failure or a rejoin costs."""
        if self.halted:
            return self._restart(after, speed) if kind == "recover" else None
        d = self.steady(after, speed)
        return d if kind == "speed" else self.react(kind, workers, before, after, d)

    def react(self, kind, workers, before, after, d: Decision) -> Optional[Decision]:
        raise NotImplementedError

    def _restart(self, failed, speed, note="restarted from checkpoint") -> Optional[Decision]:
        d = self.steady(failed, speed)
        if d.rate <= 0:
            return None
        self.halted = False
        return Decision(d.rate, d.iter_s, stall_s=self.ctx.params.restart_s, note=note)

    def _halt(self, note="halted") -> Decision:
        self.halted = True
        return Decision(0.0, 0.0, lose="checkpoint", note=note)
