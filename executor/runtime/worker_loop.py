"""The worker loop of one (replica, stage): get a plan, enter its world, run its iterations
(docs/executor.md, "One iteration"). The parts it loops over each own one responsibility:

  StageHandle     (stage_handle.py)   what the parts below work on, typed: the worker's
                                      state, its stage runtime, snapshots, boundary log,
                                      world, store, plan source and fence. Only this loop
                                      holds the loop; every part takes the handle.
  WorkerState     (worker_state.py)   who this worker is, what it trained and has seen
  PlanFence       (plan_fence.py)     never a stale or foreign plan; the per-iteration gate
  StageRuntime    (stage_runtime.py)  the stage's module, optimizer, stepper, parts, data
  enter           (entry.py)          entering a version: its slot and shape, its world,
                                      and (stage_state/sync.py) the iteration to train
                                      next with the state after the one before
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
from typing import Optional

from executor.protocol import Bye, Fatal, NoCopyLeft
from executor.runtime.entry import enter
from executor.runtime.role import Role, next_role
from executor.runtime.stage_handle import StageHandle
from executor.runtime.stage_state.sync import NoCopy
from executor.runtime.steps.iteration import IterationRuntime
from executor.runtime.steps.model_error import ModelError, own_log
from executor.runtime.transport.waiting import CommError
from executor.runtime.transport.wire import ActivationSpecError
from executor.runtime.worker_config import WorkerConfig
from executor.runtime.worker_state import WorkerState
from executor.sources.plan_source import TrainingHalted
from planner.plan import Plan


class WorkerLoop:
    def __init__(self, conf: WorkerConfig, me: tuple[int, int], source, store,
                 incarnation: int = 1):
        state = WorkerState(tuple(me), incarnation, done=conf.start_iteration - 1,
                            origin=-1 if conf.from_seed else None)
        self.h = StageHandle.open(conf, state, store, source)
        self.state, self.fence, self.source, self.log = state, self.h.fence, source, self.h.log
        self.iteration = IterationRuntime(self.h)
        self._stopped = threading.Event()  # set when run() ends: the heartbeats stop

    # ---- main loop --------------------------------------------------------------------
    def run(self) -> int:
        st, h = self.state, self.h
        self.log(f"started (incarnation {st.incarnation}) on {h.conf.device}")
        beats = threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True)
        beats.start()
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
                    enter(h, plan)
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
            self._close(beats)

    def _close(self, beats: threading.Thread) -> None:
        """Everything run() started ends with it: in a process the exit would end it, but a
        WorkerLoop run in a thread (tests/test_fault_in_one_process.py) left its heartbeat
        and snapshot threads running, holding store connections into the interpreter's
        shutdown, where they aborted it now and then ("terminate called without an active
        exception")."""
        h = self.h
        self.log(f"optimizer: {h.stage.stepper.stats.line()}")
        if h.snaps is not None:
            self.log(f"snapshots: {h.snaps.stats_line()}")
        if h.boundary_log.on:
            self.log(f"boundary log: {h.boundary_log.stats_line()}")
        h.stage.close()  # the last iteration's part, before the process ends
        if h.world is not None:
            h.world.close()
        if h.snaps is not None:
            h.snaps.close()
        if self.state.leaving:  # the last word: the coordinator may close its store now
            try:
                self.source.send(Bye())
            except Exception:  # closed already (it waited for us in vain)
                pass
        self._stopped.set()
        beats.join(self.h.conf.timeouts.comm + 1.0)  # a beat in flight has its store timeout

    def _fatal(self, reason: str, **extra) -> int:
        """Halt the run with `reason` (the coordinator publishes the halt), then exit 2.
        Waits a little for the halt so that our exit is not taken for a failure first."""
        self.log(f"fatal: {reason}")
        self.source.send(Fatal(reason=reason, **extra))
        try:
            self.source.wait_for_plan(10 ** 9, self.h.conf.timeouts.coordinator_answer)
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
        while not self._stopped.is_set():
            try:
                self.source.heartbeat(st.home[0], st.home[1], st.done + 1, st.incarnation,
                                      st.last_compute, entered=st.in_version)
            except Exception:  # the coordinator is gone: nothing left to train for
                if st.leaving or self._stopped.is_set():  # unless we are done: it closed
                    return  # its store after our bye
                os._exit(3)
            self._stopped.wait(0.5)

    # ---- one plan version -------------------------------------------------------------
    def _run_plan(self, plan: Plan) -> Optional[Plan]:
        """Iterations under `plan` until training ends; a newer plan is taken only at an
        iteration boundary (returned). After the last iteration: wait for the next plan
        (a rollback, or the final empty plan)."""
        st, h = self.state, self.h
        wp = plan.worker(*st.me)
        while st.done + 1 < h.conf.iterations:
            newer, committed = self.fence.gate(st.done + 1)
            if newer is not None:
                return newer
            if committed > st.done:  # counted before a rollback to a snapshot: stale
                committed = st.restored_at
            h.stage.stepper.forget_committed(committed)
            self.iteration.run(plan, wp, st.done + 1)
        return None

    def _abort(self, exc: CommError) -> Optional[Plan]:
        """Drop the iteration in flight; returns the newer plan if one is out already."""
        st, h = self.state, self.h
        self.log(f"plan v{st.version}: iteration {st.done + 1} aborted: {exc}")
        h.stage.compute.reset()  # graphs, losses and partial gradients of the iteration
        if h.world is not None:
            h.world.close()  # peers blocked on us get 'connection closed' now
            h.world = None
        newer = getattr(exc, "plan", None)
        newer = newer if isinstance(newer, Plan) else h.newer_plan()
        if newer is None:  # nobody moved on yet: the source must act, or we all wait
            self.source.report_suspect(*(exc.peer or st.me), reason=f"{st.me}: {exc}")
        return newer
