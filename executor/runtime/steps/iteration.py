"""One training iteration of one worker: the plan's lowered steps for it (planner/
lowering.py) dispatched to registered handlers, as torch.distributed.pipelining's schedule
runtime does: the stage's compute (F, I, B, W, RECV, SEND: interpreter.StageSteps), the
gradient all-reduce, the optimizer step and its reports, and the fault-injection point."""
from __future__ import annotations

import os
import socket
import time
from typing import Optional

from executor.compute.one_process.reference import checksum
from executor.protocol import Done, Mid
from executor.runtime.stage_handle import StageHandle
from executor.runtime.stage_state.shape import base_checksums
from executor.runtime.steps.compute_clock import ComputeClock
from executor.runtime.steps.grad_sum import allreduce_grads
from executor.runtime.steps.interpreter import FAULT, StageSteps, run_steps, with_fault_point
from executor.runtime.steps.model_error import ModelError
from executor.runtime.transport.waiting import CommError
from executor.runtime.transport.wire import ActivationSpecError
from executor.runtime.transport.world_transport import COMM_DIRECTION, WorldTransport
from executor.sources.plan_source import TrainingHalted
from planner.lowering import Op, lower
from planner.plan import Plan, WorkerPlan

HOST = socket.gethostname()


class IterationRuntime:
    def __init__(self, h: StageHandle):
        """`h`: the worker's conf, state, stage runtime, world, source, snapshots and log
        one iteration uses (the agent owns them; this only runs with them)."""
        self.h = h
        self.clock = ComputeClock(h.conf.device, h.conf.slows)
        self._lowered: tuple = (None, [])  # ((plan version, slot), its steps for us)
        self._recvs: list = []
        self._ahead = 0

    def run(self, plan: Plan, wp: WorkerPlan, it: int) -> None:
        a, st, stage = self.h, self.h.state, self.h.stage
        self.actions = wp.actions
        if a.snaps is not None:
            a.snaps.follow(plan)  # who holds which stage's snapshot under this plan
        stage.stepper.settle()  # the previous step is final before its parameters are used
        stage.compute.begin(it)  # the key of this iteration's draws
        stage.batches.begin(it, [x.microbatch for x in wp.actions if x.op == "F"]
                            if it + 1 < a.conf.iterations else None)
        self.clock.begin(it)
        stage.stepper.idle_cpu_s = 0.0
        sync = plan.solver.optimizer == "synchronous"
        if sync:  # wall times, for the check that no iteration starts before all stepped
            a.log(f"iteration {it} entered at {time.time():.6f}")
        steps = self._steps(plan)
        if it in a.conf.fault_iterations:  # an injected signal may land mid-iteration
            steps = with_fault_point(steps)
        self._recvs = [(k, s) for k, s in enumerate(steps) if s.op is Op.RECV]
        self._ahead = 0
        compute = StageSteps(stage.compute, st.me[1], a.conf.stages,
                             lambda g: self._batch(it, g),
                             WorldTransport(a.world, it, a.boundary_log),
                             lambda what, g, fn, *x: self._model(what, g, it, fn, *x))
        table = {**compute.table(), Op.ALLREDUCE: lambda s: self._allreduce(),
                 Op.OPT: lambda s: self._step(it, sync), FAULT: lambda s: self._fault(it)}
        run_steps(steps, table, before=lambda k: self._post_ahead(it, k))
        a.world.flush()
        if sync:  # synchronous optimizer: nobody starts the next iteration before all stepped
            a.world.barrier()

    def _steps(self, plan: Plan) -> list:
        """This worker's steps under `plan`, lowered once per plan version."""
        key = (plan.version, self.h.state.me)  # the steps depend on nothing else
        if self._lowered[0] != key:
            self._lowered = (key, lower(plan, key[1]))
        return self._lowered[1]

    def _fault(self, it: int) -> None:
        """The injection point: tell the coordinator (pid and host: a torchrun'd worker on
        its host can be signalled) and let the signal land right here. Only in iterations
        a fault may target us: a store round trip per iteration otherwise."""
        a = self.h
        a.source.send(Mid(it=it, wait=True, pid=os.getpid(), host=HOST))
        limit = a.conf.timeouts.coordinator_answer
        if not a.source.await_go(it, limit):  # it once went on without a word
            a.log(f"iteration {it}: the coordinator gave no go at the fault point within "
                  f"{limit:g} s; going on (no injected fault lands here)")

    def _post_ahead(self, it: int, k: int, window: int = 2) -> None:
        """Before step k: keep the receives of the steps after it posted, at most
        `window` ahead (a buffer each), so their messages move while we compute."""
        world = self.h.world
        while self._ahead < len(self._recvs) and world.early_count() < window:
            idx, st = self._recvs[self._ahead]
            if idx > k and not world.post_early(st.boundary, st.peer, it, st.microbatch,
                                                COMM_DIRECTION[st.direction]):
                return  # this boundary's spec is not known yet: its first receive tells
            self._ahead += 1

    def _batch(self, it: int, g: int):
        return self._model("data", g, it, self.h.stage.batches.get, it, g,
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
        a = self.h
        self.clock.step_begins()
        last = a.state.me[1] == a.conf.stages - 1
        a.state.losses = allreduce_grads(a.stage.params, a.world,
                                         a.stage.compute.losses() if last else None,
                                         a.conf.job.num_microbatches, a.conf.device)

    def _step(self, it: int, sync: bool) -> None:
        """OPT: snapshot, AdamW step, report the iteration (and its losses) done."""
        a, st, stage = self.h, self.h.state, self.h.stage
        losses, st.losses = st.losses, {}
        stage.stepper.step(it, st.version)
        stage.compute.reset()
        st.done = it
        final = it == a.conf.iterations - 1  # the summary needs the checksum only at the end
        if final or (st.writer and stage.parts.due(it)):
            stage.stepper.settle()  # what is published or saved must be final
        n = sum(1 for x in self.actions if x.op == "F")
        # a worker paced by its link is as slow as one paced by its compute (link_meter.py)
        st.last_compute = (it, max(self.clock.per_microbatch(n, stage.stepper.idle_cpu_s),
                                   a.world.link_seconds_per_microbatch(n)))
        a.source.send(Done(it=it, losses=losses, compute=round(st.last_compute[1], 7),
                           slot=list(st.me), checksum=checksum(stage.module) if final else None,
                           base_checksums=base_checksums(a.base, stage.module)
                           if final and a.conf is not a.base else None,
                           **(self._snapshot_figures() if final else {})))
        if a.boundary_log.on and a.snaps is not None and a.snaps.every == 0:
            a.boundary_log.off()  # auto chose no snapshots: nothing would ever trim the log
        if a.snaps is not None and a.snaps.due(it):
            a.boundary_log.snapshot_at(it)  # every stage snapshots it: older logs may go
            stage.stepper.settle()  # the snapshot is of the final step (a clip may redo it)
            a.snaps.offer(st.me[1], it, stage.state(), send=st.writer)
        if st.writer and stage.parts.due(it):
            stage.parts.write(it, stage.module, stage.opt)
        if sync:
            a.log(f"iteration {it} stepped at {time.time():.6f}")

    def _snapshot_figures(self) -> dict:
        """For the run's summary: K in force and the host memory snapshots hold here."""
        snaps: Optional[object] = self.h.snaps
        log = self.h.boundary_log.stats.peak_bytes
        if snaps is None:
            return {"snap_every": 0, "snap_bytes": 0, "log_bytes": log}
        s = snaps.stats()
        return {"snap_every": s["every"], "snap_bytes": s["local_bytes"] + s["held_bytes"],
                "log_bytes": log}
