"""The worker loop of one (replica, stage): get a plan, build its world, run its actions.

Failure handling (docs/design.md section 6):
  - fencing: a plan for another job, or older than one already seen, is refused (logged);
    a worker that is not in an admitted plan stops, an empty plan means "training done";
  - any CommError (peer died, hung, or left for a newer plan) aborts the iteration in
    flight: compute state and partial gradients are dropped, the world is closed (so peers
    blocked on us fail fast too) and the worker takes the newest plan; only if there is
    none yet is the suspect reported (a late report, e.g. from a worker that was stalled
    and has been fenced out meanwhile, would make the service re-publish for nothing);
  - entering a plan = new world + a sync: all members all-gather (last stepped iteration,
    needs-state). Training resumes at r = 1 + min over members holding state, everyone
    rolls back to "after step r-1", restarted workers receive params + optimizer state
    from a live peer of their stage, and iteration r re-runs under the new plan.

Rollback with a staggered optimizer: a stage steps as soon as its own all-reduce is done,
so when a later stage fails in iteration i, earlier stages may already have stepped i
(and stage 0 may be running i+1). Before every step each worker keeps a snapshot of its
pre-step parameters and optimizer state; snapshots are dropped once the coordinator
reports the iteration committed (stepped by every live worker). Rolling back is restoring
snapshot r. Cost: one extra copy of a stage's state per iteration in flight (usually 1-2),
in exchange for keeping the stagger (committing steps only after a global barrier would
remove exactly the overlap the staggered optimizer exists for).
"""
from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from typing import Optional

import torch

from executor.checkpoint import load_stage
from executor.checkpoint.part_writer import PartWriter
from executor.runtime.batches import Batches
from executor.runtime.comm import CommError, Superseded, World
from executor.compute.config import TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig, Workload
from executor.sources.plan_source import TrainingHalted
from executor.compute.reference import checksum
from executor.compute.stage import StageCompute
from executor.runtime.compute_clock import ComputeClock
from executor.runtime.interpreter import FAULT, StageSteps, run_steps, with_fault_point
from executor.runtime.grad_sum import allreduce_grads
from executor.runtime.model_error import ModelError, own_log
from executor.runtime.peer_snapshots import PeerSnapshots
from executor.runtime.role import Role, next_role
from executor.runtime.stage_state.sync import NoCopy, sync_state
from executor.runtime.world_transport import COMM_DIRECTION, WorldTransport
from executor.runtime.stepper import StageStepper
from executor.runtime.wire import ActivationSpecError
from planner.job import JobSpec
from planner.lowering import Op, lower
from planner.plan import Plan, WorkerPlan, home_id


HOST = socket.gethostname()


class Agent:
    def __init__(self, cfg: ModelConfig, me: tuple[int, int], job: JobSpec, iterations: int,
                 source, store, *, timeout_s: float = 5.0, incarnation: int = 1,
                 start_iteration: int = 0, resume_part: Optional[str] = None,
                 ckpt_dir: Optional[str] = None, ckpt_every: int = 1,
                 device: torch.device = torch.device("cpu"), local_workers: Optional[int] = None,
                 workload: Workload = DEFAULT_WORKLOAD, fault_iterations=(), slows=(),
                 snapshot_every: int = 0, snapshot_budget: int = 2 ** 62,
                 training: TrainingSettings = TrainingSettings()):
        self.cfg, self.job, self.iterations = cfg, job, iterations
        self.training = training  # optimizer, schedule, clip, precision (compute/config.py)
        # `home` is who this worker is (its first slot, id "R.S": heartbeats, messages,
        # incarnations); `me` is the slot it fills now, which a plan's roles may change.
        self.home = self.me = tuple(me)
        self.source, self.store, self.timeout_s = source, store, timeout_s
        self.S, self.wl, self.device, self.local_workers = job.stages, workload, device, local_workers
        self.ckpt = (ckpt_dir, ckpt_every)
        self._build(self.me[1])
        if resume_part is not None:  # this stage's DCP part of the checkpoint resumed from
            load_stage(self.module, self.opt, resume_part, lr=training.lr)
        self.inc = incarnation  # which process of this worker we are (membership)
        self.fresh = incarnation > 1  # restarted: its state must come from a live peer
        self.entered = False  # has been admitted to some plan version
        self.leaving = False  # training ended for us (done, fenced out or halted): exit 0
        self._asked = -1  # newest plan version on which we asked to be admitted
        self.done = start_iteration - 1  # last iteration this worker has stepped
        # A run from its seed can rebuild any stage's state before step 0, as built here:
        # the oldest copy a rollback to peer-memory snapshots may use (None: resumed).
        self.origin = -1 if resume_part is None and start_iteration == 0 else None
        self.version, self._refused = -1, -1
        self.in_version: Optional[int] = None  # the newest version entered (heartbeats say it)
        self.job_hash = job.identity_hash()
        self.world: Optional[World] = None
        self.writer = False  # this worker writes its stage's checkpoint parts
        # Iterations in which an injected fault may target us: at their mid-point we wait
        # for the coordinator's go-ahead, so the signal lands mid-iteration.
        self.fault_iterations = set(fault_iterations)
        # the straggler detector's number, and --slow's stretch: (from iteration, factor)
        self.clock = ComputeClock(self.device, slows)
        self.last_compute: Optional[tuple[int, float]] = None  # (iteration, s per micro-batch)
        self._lowered: tuple[int, list] = (-1, [])  # (plan version, its steps for us)
        self._losses: dict = {}  # the last stage's losses, from ALLREDUCE to OPT
        self.restored_at = -1  # the iteration of the last rollback to peer-memory snapshots
        # Peer-memory snapshots every K iterations (docs/executor.md; 0: none, -1: auto,
        # K from their measured cost): this worker's host keeps other stages' snapshots,
        # its own stage's copies stay here.
        self.snaps = (PeerSnapshots(store, home_id(*self.home), snapshot_every, self.S,
                                    timeout_s=max(30.0, 4 * timeout_s), log=self.log,
                                    first=start_iteration, budget=snapshot_budget)
                      if snapshot_every else None)

    def _build(self, s: int) -> None:
        """Stage `s`'s module, optimizer and the parts that serve them (at start, and when
        a plan moves this worker to another stage: its state then comes from a holder)."""
        cfg, wl = self.cfg, self.wl
        self.module = wl.build_stage(cfg, s, self.S).to(self.device)
        self.opt = wl.make_optimizer(self.training, self.module.parameters())
        self.params = list(self.module.parameters())  # walking the module tree costs 0.1 ms
        self.compute = StageCompute(self.module, s == 0, s == self.S - 1,
                                    1.0 / self.job.num_microbatches, wl.loss_fn,
                                    precision=self.training.precision)
        self.stepper = StageStepper(self.module, self.opt, self.training, s, self.S, self.store,
                                    log=self.log)
        self.stepper.newer = lambda: self._next_plan(0)  # a settle() wait leaves for a newer plan
        self.parts = PartWriter(self.ckpt[0], self.ckpt[1], self.iterations, s, self.log)
        # Micro-batches of the next iteration, loaded on a thread while this one computes
        # (a loader's work off the critical path). Only the first and last stage load data.
        self.batches = Batches(lambda it, g: wl.microbatch(cfg, it, g), s in (0, self.S - 1))

    def _move(self, slot: tuple[int, int], plan: Plan) -> None:
        """Take the slot the plan's roles give us; a new stage is built empty (fresh)."""
        if slot[1] != self.me[1]:
            self.log(f"moving from stage {self.me[1]} to stage {slot[1]} (plan v{plan.version})")
            self.stepper.settle()
            self.batches.close()
            self.parts.finish()
            self._build(slot[1])
            self.fresh = True  # the stage's state comes from a live holder, as on a rejoin
            self._lowered = (-1, [])
        self.me = slot

    def log(self, msg: str) -> None:
        stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
        where = "" if self.me == self.home else f" in {self.me[0]}:{self.me[1]}"
        print(f"{stamp} [worker {self.home[0]}:{self.home[1]}{where}] {msg}", flush=True)

    # ---- plans and fencing ------------------------------------------------------------
    def admit(self, plan: Plan) -> bool:
        got = plan.job.identity_hash()
        if got != self.job_hash:
            self.log(f"refusing plan v{plan.version}: it is for job {got}, "
                     f"this worker runs job {self.job_hash}")
            self._refused = max(self._refused, plan.version)
            return False
        if plan.version < self.version:
            self.log(f"refusing plan v{plan.version}: older than v{self.version} already seen")
            return False
        return plan.version > self.version

    def _next_plan(self, timeout_s: float) -> Optional[Plan]:
        plan = self.source.wait_for_plan(max(self.version, self._refused), timeout_s)
        return plan if plan is not None and self.admit(plan) else None

    def _await_plan(self) -> Plan:
        while True:
            plan = self._next_plan(1.0)
            if plan is not None:
                return plan

    # ---- main loop --------------------------------------------------------------------
    def run(self) -> int:
        self.log(f"started (incarnation {self.inc}) on {self.device}")
        threading.Thread(target=self._heartbeats, daemon=True).start()
        plan: Optional[Plan] = None
        try:
            while True:
                plan = plan or self._await_plan()
                role = self._role(plan)
                if role is Role.WAIT:
                    plan = None
                    continue
                if role is Role.STOP:
                    self.leaving = True
                    return 0
                try:
                    self._enter(plan)
                    plan = self._run_plan(plan, plan.worker(*self.me))
                except CommError as exc:
                    plan = self._abort(exc)
        except TrainingHalted as exc:
            self.log(f"training halted: {exc}")
            self.leaving = True
            return 0
        except NoCopy as exc:  # no live copy of some stage: the run halts (exit 3)
            self.log(f"halting the run: {exc}")
            self.source.send("halt", reason=str(exc))
            self.leaving = True
            return 0
        except ActivationSpecError as exc:  # the model is wrong: no plan can help
            return self._fatal(str(exc))
        except ModelError as exc:  # full traceback here; its last line to the coordinator
            cause = exc.__cause__
            self.log("".join(traceback.format_exception(cause)).rstrip())
            last = traceback.format_exception_only(cause)[-1].strip()
            return self._fatal(f"the model raised {last} ({exc})", error="exception",
                               log=own_log())
        finally:
            self.log(f"optimizer: {self.stepper.stats.line()}")
            if self.snaps is not None:
                self.log(f"snapshots: {self.snaps.stats_line()}")
            self.batches.close()
            self.parts.finish()  # the last iteration's part, before the process ends
            if self.world is not None:
                self.world.close()
            if self.leaving:  # the last word: the coordinator may close its store now
                try:
                    self.source.send("bye")
                except Exception:  # closed already (it waited for us in vain)
                    pass

    def _fatal(self, reason: str, **extra) -> int:
        """Halt the run with `reason` (the coordinator publishes the halt), then exit 2.
        Waits a little for the halt so that our exit is not taken for a failure first."""
        self.log(f"fatal: {reason}")
        self.source.send("fatal", reason=reason, **extra)
        try:
            self.source.wait_for_plan(10 ** 9, 4 * self.timeout_s)
        except TrainingHalted:
            pass
        return 2

    def _role(self, plan: Plan) -> Role:
        """Membership (docs/executor.md): what this process does with `plan` (next_role),
        with its side effects: the log line, and asking once per version to be admitted."""
        self.version = self.source.version = plan.version
        role, why = next_role(plan, self.home, self.inc, self.entered)
        if role is Role.STOP:
            self.log(f"training complete (plan v{plan.version})" if not plan.workers
                     else f"not in plan v{plan.version}: {why}: stopping")
        elif role is Role.WAIT:
            self.fresh = True  # the others train on without us: our state comes from a peer
            if plan.version > self._asked:
                self._asked = plan.version
                self.log(f"waiting to be admitted (plan v{plan.version} {why})")
                self.source.rejoin(plan.version)
        return role

    def _heartbeats(self) -> None:
        while True:
            try:
                self.source.heartbeat(self.home[0], self.home[1], self.done + 1, self.inc,
                                      self.last_compute, entered=self.in_version)
            except Exception:  # the coordinator is gone: nothing left to train for
                if self.leaving:  # unless we are done: it closed its store after our bye
                    return
                os._exit(3)
            time.sleep(0.5)

    def _enter(self, plan: Plan) -> None:
        self.version = self.source.version = plan.version
        self.entered = True
        if self.world is not None:
            self.world.close()
            self.world = None
        self._move(plan.slot_of(f"{self.home[0]}.{self.home[1]}"), plan)
        live = [w.key for w in plan.workers]
        self.world = World(self.store, plan.version, self.me, live, self.timeout_s,
                           self.device, self.local_workers, newer=lambda: self._next_plan(0),
                           missing=self._missing,
                           incarnations={w: plan.incarnation(*plan.filler(*w)) for w in live})
        self.world.on_idle = self.stepper.idle
        r = sync_state(self, plan)
        self.done = r - 1
        self.writer = self.me == min(w for w in self.world.workers if w[1] == self.me[1])
        if self.writer and self.parts.due(self.done):  # the part a dead writer may not have
            self.parts.write(self.done, self.module, self.opt, only_if_missing=True)  # finished
        self.compute.split = plan.solver.split_backward  # fused B: F prepares no I
        backward = "I/W split" if plan.solver.split_backward else "fused B"
        self.log(f"entered plan v{plan.version} ({len(live)} workers, failed {plan.failed}, "
                 f"{backward}, {plan.solver.optimizer} optimizer) at iteration {r}")
        self.source.send("done", it=self.done, checksum=checksum(self.module), sync=True,
                         at=time.time(), slot=list(self.me))
        self.in_version = plan.version  # entered with the stage's state in place

    def _run_plan(self, plan: Plan, wp: WorkerPlan) -> Optional[Plan]:
        """Iterations under `plan` until training ends; a newer plan is taken only at an
        iteration boundary (returned). After the last iteration: wait for the next plan
        (a rollback, or the final empty plan)."""
        while self.done + 1 < self.iterations:
            it = self.done + 1
            newer, committed = self._hold(it)
            if newer is not None:
                return newer
            if committed > self.done:  # counted before a rollback to a snapshot: stale
                committed = self.restored_at
            self.stepper.forget_committed(committed)
            self._iteration(plan, wp, self.done + 1)
        return None

    def _hold(self, it: int) -> tuple[Optional[Plan], int]:
        """Before iteration `it`: a newer plan, if one is out, and the committed iteration.
        While the coordinator holds `it` (a scheduled rejoin must be in the plan first, or
        the run halted), wait for the newer plan. Only the coordinator arms and releases
        holds (also on a deadline), so a worker can never wait on a gate nobody will open."""
        newer, held, committed = self.source.gate(max(self.version, self._refused), it)
        if newer is not None and not self.admit(newer):
            newer = None
        while newer is None and held:
            newer = self._next_plan(0.05)
            held = newer is None and self.source.held(it)
        return newer, committed

    def _abort(self, exc: CommError) -> Optional[Plan]:
        """Drop the iteration in flight; returns the newer plan if one is out already."""
        self.log(f"plan v{self.version}: iteration {self.done + 1} aborted: {exc}")
        self.compute.reset()  # graphs, losses and partial gradients of the iteration go
        if self.world is not None:
            self.world.close()  # peers blocked on us get 'connection closed' now
            self.world = None
        newer = exc.plan if isinstance(exc, Superseded) else self._next_plan(0)
        if newer is None:  # nobody moved on yet: the source must act, or we all wait
            self.source.report_suspect(*(exc.peer or self.me), reason=f"{self.me}: {exc}")
        return newer

    def _missing(self, workers: list) -> None:
        """Members that never came to this version's world within a timeout."""
        self.log(f"plan v{self.version}: still waiting for {workers} to join")
        for w in workers:
            self.source.report_suspect(*w, reason=f"{self.me}: {w} did not join world "
                                                  f"v{self.version}")

    # ---- one iteration ----------------------------------------------------------------
    def _iteration(self, plan: Plan, wp: WorkerPlan, it: int) -> None:
        """Run this worker's lowered steps of `plan` (planner/lowering.py) for `it`."""
        self.plan_actions = wp.actions
        if self.snaps is not None:
            self.snaps.follow(plan)  # who holds which stage's snapshot under this plan
        self.stepper.settle()  # the previous step is final before its parameters are used
        self.batches.begin(it, [a.microbatch for a in wp.actions if a.op == "F"]
                           if it + 1 < self.iterations else None)
        self.clock.begin(it)
        self.stepper.idle_cpu_s = 0.0
        sync = plan.solver.optimizer == "synchronous"
        if sync:  # wall times, for the check that no iteration starts before all stepped
            self.log(f"iteration {it} entered at {time.time():.6f}")
        steps = self._steps(plan)
        if it in self.fault_iterations:  # an injected signal may land mid-iteration
            steps = with_fault_point(steps)
        self._recvs = [(k, st) for k, st in enumerate(steps) if st.op is Op.RECV]
        self._ahead = 0
        stage = StageSteps(self.compute, self.me[1], self.S, lambda g: self._batch(it, g),
                           WorldTransport(self.world, it),
                           lambda what, g, fn, *a: self._model(what, g, it, fn, *a))
        table = {**stage.table(), Op.ALLREDUCE: lambda st: self._allreduce(),
                 Op.OPT: lambda st: self._step(it, sync), FAULT: lambda st: self._fault(it)}
        run_steps(steps, table, before=lambda k: self._post_ahead(it, k))
        self.world.flush()
        if sync:  # synchronous optimizer: nobody starts the next iteration before all stepped
            self.world.barrier()

    def _steps(self, plan: Plan) -> list:
        """This worker's steps under `plan`, lowered once per plan version."""
        if self._lowered[0] != plan.version:
            self._lowered = (plan.version, lower(plan, self.me))
        return self._lowered[1]

    def _fault(self, it: int) -> None:
        """The injection point: tell the coordinator (pid and host: a torchrun'd worker on
        its host can be signalled) and let the signal land right here. Only in iterations
        a fault may target us: a store round trip per iteration otherwise."""
        self.source.send("mid", it=it, wait=True, pid=os.getpid(), host=HOST)
        self.source.await_go(it, 4 * self.timeout_s)

    def _post_ahead(self, it: int, k: int, window: int = 2) -> None:
        """Before step k: keep the receives of the steps after it posted, at most
        `window` ahead (a buffer each), so their messages move while we compute."""
        while self._ahead < len(self._recvs) and self.world.early_count() < window:
            idx, st = self._recvs[self._ahead]
            if idx > k and not self.world.post_early(st.boundary, st.peer, it, st.microbatch,
                                                     COMM_DIRECTION[st.direction]):
                return  # this boundary's spec is not known yet: its first receive tells
            self._ahead += 1

    def _batch(self, it: int, g: int):
        return self._model("data", g, it, self.batches.get, it, g,
                           timed=False)  # loading is not compute: --slow must not stretch it

    def _model(self, what: str, g: int, it: int, fn, *args, timed: bool = True):
        """Run the model's code: what it raises is a ModelError, not a failure of this
        worker that a new plan could route around."""
        try:
            return self.clock.timed(fn, *args) if timed else fn(*args)
        except (CommError, ActivationSpecError, TrainingHalted):
            raise
        except Exception as exc:
            raise ModelError(f"in its {what} of micro-batch {g}, iteration {it}") from exc

    def _allreduce(self) -> None:
        """ALLREDUCE: the stage's gradients summed over its live peers (the OPT follows)."""
        self.clock.step_begins()
        last = self.me[1] == self.S - 1
        self._losses = allreduce_grads(self.params, self.world,
                                       self.compute.losses() if last else None,
                                       self.job.num_microbatches, self.device)

    def _step(self, it: int, sync: bool) -> None:
        """OPT: snapshot, AdamW step, report the iteration (and its losses) done."""
        losses, self._losses = self._losses, {}
        self.stepper.step(it, self.version)
        self.compute.reset()
        self.done = it
        final = it == self.iterations - 1  # the summary needs the checksum only at the end
        if final or (self.writer and self.parts.due(it)):
            self.stepper.settle()  # what is published or saved must be final
        n = sum(1 for a in self.plan_actions if a.op == "F")
        self.last_compute = (it, self.clock.per_microbatch(n, self.stepper.idle_cpu_s))
        self.source.send("done", it=it, losses=losses, compute=round(self.last_compute[1], 7),
                         slot=list(self.me),
                         checksum=checksum(self.module) if final else None,
                         **(self._snapshot_figures() if final else {}))
        if self.snaps is not None and self.snaps.due(it):
            self.stepper.settle()  # the snapshot is of the final step (a clip may redo it)
            self.snaps.offer(self.me[1], it, {"model": self.module.state_dict(),
                                              "optim": self.opt.state_dict()}, send=self.writer)
        if self.writer and self.parts.due(it):
            self.parts.write(it, self.module, self.opt)
        if sync:
            self.log(f"iteration {it} stepped at {time.time():.6f}")

    def _snapshot_figures(self) -> dict:
        """For the run's summary: K in force and the host memory snapshots hold here."""
        if self.snaps is None:
            return {"snap_every": 0, "snap_bytes": 0}
        st = self.snaps.stats()
        return {"snap_every": st["every"], "snap_bytes": st["local_bytes"] + st["held_bytes"]}

    # ---- state --------------------------------------------------------------------------
    def initial_state(self, stage: int) -> dict:
        """Stage `stage`'s parameters and optimizer state before the run's first step."""
        module = self.wl.build_stage(self.cfg, stage, self.S)
        opt = self.wl.make_optimizer(self.training, module.parameters())
        return {"model": module.state_dict(), "optim": opt.state_dict()}

    def load_state(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])
