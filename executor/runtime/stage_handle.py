"""What entering a version and running an iteration work on, typed: the stage this process
runs (its runtime, its peer-memory snapshots, its boundary log), the world of the version
it is in, and the run's parts they talk to (store, plan source, plan fence).

The WorkerLoop (worker_loop.py) owns one and is the only loop over it; every other module of the
runtime (entry.py, stage_state/, replay/, steps/iteration.py) takes this handle, never
the WorkerLoop. A stage or a shape is swapped only here (`take_stage`, `take_shape`), so a
module holding the handle always sees the stage in force.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from executor.runtime.peer_snapshots import PeerSnapshots
from executor.runtime.plan_fence import PlanFence
from executor.runtime.replay import BoundaryLog
from executor.runtime.replay.boundary_log import TIED_GRAD, TIED_VALUE
from executor.runtime.steps.stage_runtime import StageRuntime
from executor.runtime.transport.comm import World
from executor.runtime.worker_config import WorkerConfig
from executor.runtime.worker_state import WorkerState
from planner.plan import home_id


def worker_log(state: WorkerState):
    """The worker's log: timestamped lines naming it (and the slot it fills, if not its own)."""
    def log(msg: str) -> None:
        stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
        where = "" if state.me == state.home else f" in {state.me[0]}:{state.me[1]}"
        print(f"{stamp} [worker {state.home[0]}:{state.home[1]}{where}] {msg}", flush=True)
    return log


@dataclass(eq=False)
class StageHandle:
    base: WorkerConfig  # the run's own configuration
    conf: WorkerConfig  # the shape in force (the plan's partition), the base until a cut
    state: WorkerState
    store: Any  # the run's c10d store
    source: Any  # the plan source (sources/plan_source.py)
    fence: PlanFence
    snaps: Optional[PeerSnapshots]
    boundary_log: BoundaryLog
    stage: Optional[StageRuntime] = None
    world: Optional[World] = None

    @classmethod
    def open(cls, conf: WorkerConfig, state: WorkerState, store, source) -> "StageHandle":
        log = worker_log(state)
        fence = PlanFence(state, source, conf.job.identity_hash(), log)
        # Peer-memory snapshots (docs/executor.md; 0: none, -1: auto): this worker's host
        # keeps other stages' snapshots, its own stage's copies stay here.
        snaps = (PeerSnapshots(store, home_id(*state.home), conf.snapshot_every,
                               conf.stages, timeout_s=conf.timeouts.state_io, log=log,
                               first=conf.start_iteration, budget=conf.snapshot_budget)
                 if conf.snapshot_every else None)
        # What this worker sends across stage boundaries, for the replay of a stage lost
        # whole (runtime/replay/); from a snapshot only: off without them.
        boundary_log = BoundaryLog(conf.log_budget if snaps is not None else 0,
                                 origin=state.origin)
        h = cls(conf, conf, state, store, source, fence, snaps, boundary_log)
        h.stage = h.new_stage(state.me[1])
        if conf.load_origin and conf.origin_parts:
            h.stage.load_parts(conf.origin_parts)
        return h

    def log(self, msg: str) -> None:
        worker_log(self.state)(msg)

    def new_stage(self, s: int, conf: Optional[WorkerConfig] = None) -> StageRuntime:
        """Stage `s` of the shape `conf` (the one in force by default), wired to this
        worker's fence and boundary log; not taken until take_stage/take_shape."""
        stage = StageRuntime(conf or self.conf, s, self.store, self.log)
        # a wait in settle() (other stages' norms, tied weights) leaves for a newer plan
        stage.stepper.newer = lambda: self.fence.next_plan(0)
        stage.stepper.on_norms = lambda it, sums: self.boundary_log.note_norms(it, sums)
        # what a tied weight's exchange publishes for stage `to`, kept for replays
        stage.stepper.tied.on_publish = lambda kind, to, it, ts: self.boundary_log.keep(
            to, TIED_GRAD if kind == "grad" else TIED_VALUE, it, s, ts)
        return stage

    def take_stage(self, s: int, conf: Optional[WorkerConfig] = None) -> None:
        """Run a new, empty stage `s` (of shape `conf`): its state comes from a holder."""
        self.stage.close()
        self.conf = conf or self.conf
        self.stage = self.new_stage(s)
        self.state.fresh = True

    def take_shape(self, conf: WorkerConfig, stage: StageRuntime, k: int) -> None:
        """Run `stage` of the shape `conf` from the state after step k on: the old
        stage, its snapshots and boundary logs go (stage_state/reshape.py)."""
        old, self.stage, self.conf = self.stage, stage, conf
        old.close()
        self.state.fresh = False
        self.state.done = k
        if self.snaps is not None:
            self.snaps.reshaped(conf.stages, k + 1)
        self.boundary_log.reshaped()

    def newer_plan(self):
        """A plan newer than the one in force, if one is out (no wait)."""
        return self.fence.next_plan(0)
