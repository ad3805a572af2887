"""The worker loop of one (replica, stage): get a plan, enter its world, run its iterations
(docs/executor.md, "One iteration"). The parts it loops over each own one responsibility:

  WorkerState     (worker_state.py)   who this worker is, what it trained and has seen
  PlanFence       (plan_fence.py)     never a stale or foreign plan; the per-iteration gate
  StageRuntime    (stage_runtime.py)  the stage's module, optimizer, stepper, parts, data
  sync_state      (stage_state/)      entering a version: the iteration to train next, the
                                      state from a peer or from peer-memory snapshots
  IterationRuntime (iteration.py)     one iteration's lowered steps through a handler table
  PeerSnapshots   (peer_snapshots/)   the stage's state in another worker's host memory

Failure handling (docs/design.md section 6):
  - a plan that does not admit this process: wait to be admitted, or stop (role.py);
  - any CommError (a peer died, hung or left; a wait ended: runtime/transport/waiting.py) aborts
    the iteration in flight: compute state and partial gradients are dropped, the world is
    closed (so peers blocked on us fail fast too) and the worker takes the newest plan;
    only if there is none yet is the suspect reported;
  - entering a plan = new world + sync_state; training resumes at the iteration it decides.

Rollback with a staggered optimizer (the stepper's pre-step copies of every iteration not
yet committed): docs/executor.md, "Failures and rollback with a staggered optimizer".
"""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

from executor.compute.one_process.reference import checksum
from executor.protocol import Bye, Done, Fatal, NoCopyLeft
from executor.runtime.transport.comm import World
from executor.runtime.steps.iteration import IterationRuntime
from executor.runtime.steps.model_error import ModelError, own_log
from executor.runtime.peer_snapshots import PeerSnapshots
from executor.runtime.plan_fence import PlanFence
from executor.runtime.replay import BoundaryLog
from executor.runtime.replay.boundary_log import TIED_GRAD, TIED_VALUE
from executor.runtime.role import Role, next_role
from executor.runtime.steps.stage_runtime import StageRuntime
from executor.runtime.stage_state.shape import bounds_key, shaped_config
from executor.runtime.stage_state.sync import NoCopy, sync_state
from executor.runtime.transport.waiting import CommError
from executor.runtime.transport.wire import ActivationSpecError
from executor.runtime.worker_config import WorkerConfig
from executor.runtime.worker_state import WorkerState
from executor.sources.plan_source import TrainingHalted
from planner.plan import Plan, home_id


class Agent:
    def __init__(self, conf: WorkerConfig, me: tuple[int, int], source, store,
                 incarnation: int = 1):
        # `base`: the run's own configuration; `conf`: the one of the shape in force (the
        # plan's partition: stage_state/shape.py), the base until a plan changes shape
        self.base = self.conf = conf
        self.source, self.store = source, store
        self.state = WorkerState(tuple(me), incarnation,
                                 done=conf.start_iteration - 1,
                                 origin=-1 if conf.from_seed else None)
        self.fence = PlanFence(self.state, source, conf.job.identity_hash(), self.log)
        self.stage = self._new_stage(self.state.me[1])
        if conf.load_origin and conf.origin_parts:
            self.stage.load_parts(conf.origin_parts)
        self.world: Optional[World] = None
        self.iteration = IterationRuntime(self)
        # Peer-memory snapshots (docs/executor.md; 0: none, -1: auto): this worker's host
        # keeps other stages' snapshots, its own stage's copies stay here.
        self.snaps = (PeerSnapshots(store, home_id(*self.state.home), conf.snapshot_every,
                                    conf.stages, timeout_s=conf.timeouts.snapshot_io,
                                    log=self.log, first=conf.start_iteration,
                                    budget=conf.snapshot_budget)
                      if conf.snapshot_every else None)
        # What this worker sends across stage boundaries, for the replay of a stage lost
        # whole (runtime/replay/); from a snapshot only: off without them.
        self.boundaries = BoundaryLog(conf.log_budget if self.snaps is not None else 0,
                                      origin=self.state.origin)

    def build_stage(self, conf: WorkerConfig, s: int) -> StageRuntime:
        """Stage `s` of the shape `conf` (taken by take_shape once its state is in)."""
        return self._new_stage(s, conf)

    def take_shape(self, conf: WorkerConfig, stage: StageRuntime, k: int) -> None:
        """Run `stage` of the shape `conf` from the state after step k on: the old
        stage, its snapshots and boundary logs go (stage_state/reshape.py)."""
        old, self.stage, self.conf = self.stage, stage, conf
        old.close()
        self.state.fresh = False
        self.state.done = k
        if self.snaps is not None:
            self.snaps.reshaped(conf.stages, k + 1)
        self.boundaries.reshaped()
        self.iteration.forget_lowered()

    def _new_stage(self, s: int, conf: Optional[WorkerConfig] = None) -> StageRuntime:
        stage = StageRuntime(conf or self.conf, s, self.store, self.log)
        # a wait in settle() (other stages' norms, tied weights) leaves for a newer plan
        stage.stepper.newer = lambda: self.fence.next_plan(0)
        stage.stepper.on_norms = lambda it, sums: self.boundaries.note_norms(it, sums)
        # what a tied weight's exchange publishes for stage `to`, kept for replays
        stage.stepper.tied.on_publish = lambda kind, to, it, ts: self.boundaries.keep(
            to, TIED_GRAD if kind == "grad" else TIED_VALUE, it, s, ts)
        return stage

    def log(self, msg: str) -> None:
        st = self.state
        stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
        where = "" if st.me == st.home else f" in {st.me[0]}:{st.me[1]}"
        print(f"{stamp} [worker {st.home[0]}:{st.home[1]}{where}] {msg}", flush=True)

    # ---- main loop --------------------------------------------------------------------
    def run(self) -> int:
        st = self.state
        self.log(f"started (incarnation {st.incarnation}) on {self.conf.device}")
        threading.Thread(target=self._heartbeats, daemon=True).start()
        plan: Optional[Plan] = None
        try:
            while True:
                plan = plan or self.fence.await_plan()
                role = self._role(plan)
                if role is Role.WAIT:
                    plan = None
                    continue
                if role is Role.STOP:
                    st.leaving = True
                    return 0
                try:
                    self._enter(plan)
                    plan = self._run_plan(plan)
                except CommError as exc:
                    plan = self._abort(exc)
        except TrainingHalted as exc:
            self.log(f"training halted: {exc}")
            st.leaving = True
            return 0
        except NoCopy as exc:  # no live copy of some stage: the run halts (exit 3)
            self.log(f"halting the run: {exc}")
            self.source.send(NoCopyLeft(reason=str(exc)))
            st.leaving = True
            return 0
        except ActivationSpecError as exc:  # the model is wrong: no plan can help
            return self._fatal(str(exc))
        except ModelError as exc:  # full traceback here; its last line to the coordinator
            self.log(exc.traceback_text())
            return self._fatal(exc.one_line(), error="exception", log=own_log())
        finally:
            self._close()

    def _close(self) -> None:
        self.log(f"optimizer: {self.stage.stepper.stats.line()}")
        if self.snaps is not None:
            self.log(f"snapshots: {self.snaps.stats_line()}")
        if self.boundaries.on:
            self.log(f"boundary log: {self.boundaries.stats_line()}")
        self.stage.close()  # the last iteration's part, before the process ends
        if self.world is not None:
            self.world.close()
        if self.state.leaving:  # the last word: the coordinator may close its store now
            try:
                self.source.send(Bye())
            except Exception:  # closed already (it waited for us in vain)
                pass

    def _fatal(self, reason: str, **extra) -> int:
        """Halt the run with `reason` (the coordinator publishes the halt), then exit 2.
        Waits a little for the halt so that our exit is not taken for a failure first."""
        self.log(f"fatal: {reason}")
        self.source.send(Fatal(reason=reason, **extra))
        try:
            self.source.wait_for_plan(10 ** 9, self.conf.timeouts.coordinator_answer)
        except TrainingHalted:
            pass
        return 2

    def _role(self, plan: Plan) -> Role:
        """Membership (docs/executor.md): what this process does with `plan` (next_role),
        with its side effects: the log line, and asking once per version to be admitted."""
        st = self.state
        self.fence.seen(plan)
        role, why = next_role(plan, st.home, st.incarnation, st.entered)
        if role is Role.STOP:
            self.log(f"training complete (plan v{plan.version})" if not plan.workers
                     else f"not in plan v{plan.version}: {why}: stopping")
        elif role is Role.WAIT:
            st.fresh = True  # the others train on without us: our state comes from a peer
            if plan.version > st.asked:
                st.asked = plan.version
                self.log(f"waiting to be admitted (plan v{plan.version} {why})")
                self.source.rejoin(plan.version)
        return role

    def _heartbeats(self) -> None:
        st = self.state
        while True:
            try:
                self.source.heartbeat(st.home[0], st.home[1], st.done + 1, st.incarnation,
                                      st.last_compute, entered=st.in_version)
            except Exception:  # the coordinator is gone: nothing left to train for
                if st.leaving:  # unless we are done: it closed its store after our bye
                    return
                os._exit(3)
            time.sleep(0.5)

    # ---- one plan version -------------------------------------------------------------
    def _enter(self, plan: Plan) -> None:
        st = self.state
        self.fence.seen(plan)
        st.entered = True
        if self.world is not None:
            self.world.close()
            self.world = None
        self._take_slot(plan)
        live = [w.key for w in plan.workers]
        self.world = World(self.store, plan.version, st.me, live, self.conf.timeouts.comm,
                           self.conf.device, self.conf.local_workers,
                           newer=lambda: self.fence.next_plan(0), missing=self._missing,
                           incarnations={w: plan.incarnation(*plan.filler(*w)) for w in live})
        self.world.on_idle = self.stage.stepper.idle
        synced = sync_state(self, plan)
        st.done = synced.iteration - 1
        st.writer = st.me == min(w for w in self.world.workers if w[1] == st.me[1])
        parts = self.stage.parts
        if st.writer and parts.due(st.done):  # the part a dead writer may not have finished
            parts.write(st.done, self.stage.module, self.stage.opt, only_if_missing=True)
        self.stage.compute.split = plan.solver.split_backward  # fused B: F prepares no I
        backward = "I/W split" if plan.solver.split_backward else "fused B"
        self.log(f"entered plan v{plan.version} ({len(live)} workers, failed {plan.failed}, "
                 f"{backward}, {plan.solver.optimizer} optimizer) at iteration "
                 f"{synced.iteration}")
        self.source.send(Done(it=st.done, checksum=checksum(self.stage.module), sync=True,
                              at=time.time(), slot=list(st.me)))
        st.in_version = plan.version  # entered with the stage's state in place

    def _take_slot(self, plan: Plan) -> None:
        """The slot the plan's roles give us, in the plan's shape: a worker with state of
        another shape keeps it until sync_state moves it by name (stage_state/reshape.py);
        one with none builds its new stage at once."""
        st, slot = self.state, plan.slot_of(self.state.name)
        target = shaped_config(self.base, plan)
        if bounds_key(target) == bounds_key(self.conf):
            self.conf = target  # the same shape (a cut run back on the job's own: its conf)
            return self._move(slot, plan)
        if st.fresh:
            self.log(f"building stage {slot[1]} of {target.stages} (plan v{plan.version}'s shape)")
            self.stage.close()
            self.conf = target
            self.stage = self._new_stage(slot[1])
            self.iteration.forget_lowered()
        st.me = slot

    def _move(self, slot: tuple[int, int], plan: Plan) -> None:
        """Take the slot the plan's roles give us; a new stage is built empty (fresh)."""
        st = self.state
        # the stage this process runs, not its last slot's: a plan of another shape gives
        # a worker with state its new slot before the state moves by name (reshape.py);
        # superseded before it entered, the worker still runs its old stage
        if slot[1] != self.stage.stage:
            self.log(f"moving from stage {self.stage.stage} to stage {slot[1]} "
                     f"(plan v{plan.version})")
            if self.stage.stepper.unsettled() is None:  # else it waits for a dead stage:
                self.stage.stepper.settle()  # the state left behind is not used anyway
            self.stage.close()
            self.stage = self._new_stage(slot[1])
            st.fresh = True  # the stage's state comes from a live holder, as on a rejoin
            self.iteration.forget_lowered()
        st.me = slot

    def _run_plan(self, plan: Plan) -> Optional[Plan]:
        """Iterations under `plan` until training ends; a newer plan is taken only at an
        iteration boundary (returned). After the last iteration: wait for the next plan
        (a rollback, or the final empty plan)."""
        st = self.state
        wp = plan.worker(*st.me)
        while st.done + 1 < self.conf.iterations:
            newer, committed = self.fence.gate(st.done + 1)
            if newer is not None:
                return newer
            if committed > st.done:  # counted before a rollback to a snapshot: stale
                committed = st.restored_at
            self.stage.stepper.forget_committed(committed)
            self.iteration.run(plan, wp, st.done + 1)
        return None

    def _abort(self, exc: CommError) -> Optional[Plan]:
        """Drop the iteration in flight; returns the newer plan if one is out already."""
        st = self.state
        self.log(f"plan v{st.version}: iteration {st.done + 1} aborted: {exc}")
        self.stage.compute.reset()  # graphs, losses and partial gradients of the iteration
        if self.world is not None:
            self.world.close()  # peers blocked on us get 'connection closed' now
            self.world = None
        newer = getattr(exc, "plan", None)
        newer = newer if isinstance(newer, Plan) else self.fence.next_plan(0)
        if newer is None:  # nobody moved on yet: the source must act, or we all wait
            self.source.report_suspect(*(exc.peer or st.me), reason=f"{st.me}: {exc}")
        return newer

    def _missing(self, workers: list) -> None:
        """Members that never came to this version's world within a timeout."""
        self.log(f"plan v{self.state.version}: still waiting for {workers} to join")
        for w in workers:
            self.source.report_suspect(*w, reason=f"{self.state.me}: {w} did not join world "
                                                  f"v{self.state.version}")
