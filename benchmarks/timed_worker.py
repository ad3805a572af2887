"""executor.worker, instrumented for the benchmark: `child` replaces executor.worker.child
as the launcher's process target (or run `python -m benchmarks.timed_worker`).

Nothing in executor/ changes: in its own process only, this wraps StageCompute's F/I/W,
every optimizer step (torch's global step hooks), World receives/flush/allreduce_stage,
IterationRuntime._step and StageStepper.step (the snapshot for rollback) with timers, and
StorePlanSource.send to stamp each per-iteration Done message's `extra` with the worker's
clock ("wall", seconds) and the cumulative timers ("timers").
It also generates every micro-batch the worker may need (all iterations, all g: re-routing
can bring any) when the agent is built, as a prefetching data loader would: the synthetic
Markov-chain sampler costs about as much as a stage's F and would otherwise sit on the
critical path (the benchmark reports its cost separately).
The coordinator (benchmarks.executor_bench.TimedCoordinator) reads both from the messages.
"""
from __future__ import annotations

import sys
import time

from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from executor import worker
from executor.compute import stage
from executor.protocol import Done
from executor.runtime import plan_fence
from executor.runtime.steps import iteration, stepper
from executor.runtime.transport import comm, rendezvous

# cumulative seconds per category, sent with every per-iteration "done" message:
#   fiw: StageCompute F/I/W; opt: optimizer steps; recv/flush/allreduce: waiting in comm;
#   step: all of IterationRuntime._step (stepper + bookkeeping: losses, messages)
#   stepper: StageStepper.step (the pre-step copy for rollback + opt; T's stepper.py)
#   data: generating micro-batches; send: posting isends; control: plan polling;
#   gate: the store round trip before each iteration (StorePlanSource.gate); msg: messages
#   to the coordinator (StorePlanSource.send, inside step for the per-iteration "done")
TIMERS: dict[str, float] = {k: 0.0 for k in ("fiw", "opt", "recv", "flush", "allreduce", "step",
                                             "stepper", "data", "send", "control", "gate", "msg")}
GAUGES: dict[str, int] = {"snapshot_bytes": 0}  # largest extra memory the snapshots held
_opt_t0 = [0.0]


_inside: dict[str, int] = {}  # timer -> depth of timed calls in progress


def _timed(fn, key: str):
    """Adds fn's wall time to TIMERS[key], once: a timed call inside another of the same
    timer (B calling I and W, in a StageCompute whose B is built from them) is not counted
    twice, and one whose B is its own backward is counted too."""
    def wrap(*args, **kw):
        if _inside.get(key):
            return fn(*args, **kw)
        _inside[key] = 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            _inside[key] = 0
            TIMERS[key] += time.perf_counter() - t0
    wrap.__name__ = fn.__name__
    return wrap


def _opt_pre(opt, args, kwargs):
    _opt_t0[0] = time.perf_counter()


def _opt_post(opt, args, kwargs):
    TIMERS["opt"] += time.perf_counter() - _opt_t0[0]


def _pregenerate() -> None:
    init, batch = iteration.IterationRuntime.__init__, iteration.IterationRuntime._batch

    def pregen_init(self, h):
        init(self, h)
        conf = h.conf
        h.stage.batches.ahead = False  # everything is generated up front here instead
        self._pregen = {}
        if h.state.me[1] in (0, conf.stages - 1):
            for it in range(conf.iterations):
                for g in range(conf.job.num_microbatches):
                    self._pregen[(it, g)] = conf.workload.microbatch(conf.model, it, g)

    def pregen_batch(self, it: int, g: int):
        got = self._pregen.get((it, g))
        return got if got is not None else batch(self, it, g)
    iteration.IterationRuntime.__init__ = pregen_init
    iteration.IterationRuntime._batch = pregen_batch


def install() -> None:
    _pregenerate()
    for cls, name, key in ((stage.StageCompute, "forward", "fiw"),
                           (stage.StageCompute, "backward_input", "fiw"),
                           (stage.StageCompute, "backward_weight", "fiw"),
                           (stage.StageCompute, "backward_full", "fiw"),
                           (comm.World, "_recv_into", "recv"), (comm.World, "flush", "flush"),
                           (comm.World, "allreduce_stage", "allreduce"),
                           (iteration.IterationRuntime, "_step", "step"),
                           (iteration.IterationRuntime, "_batch", "data"),
                           (comm.World, "send", "send"),
                           (plan_fence.PlanFence, "next_plan", "control"),
                           (rendezvous.StorePlanSource, "gate", "gate")):
        setattr(cls, name, _timed(getattr(cls, name), key))
    step = _timed(stepper.StageStepper.step, "stepper")

    def gauged_step(self, *args, **kw):
        out = step(self, *args, **kw)
        GAUGES["snapshot_bytes"] = max(GAUGES["snapshot_bytes"], self.snapshot_bytes())
        return out
    stepper.StageStepper.step = gauged_step
    register_optimizer_step_pre_hook(_opt_pre)
    register_optimizer_step_post_hook(_opt_post)
    send = _timed(rendezvous.StorePlanSource.send, "msg")

    def timed_send(self, msg) -> None:
        if isinstance(msg, Done) and not msg.sync:
            msg.extra = {"wall": time.time(), "timers": dict(TIMERS), "gauges": dict(GAUGES)}
        send(self, msg)
    rendezvous.StorePlanSource.send = timed_send


def child(store: str, replica: int, stage: int, log_path: str, token: str | None = None,
          coordinator: int | None = None) -> None:
    """executor.worker.child's signature: the launcher's process target."""
    install()
    worker.child(store, replica, stage, log_path, token, coordinator)


if __name__ == "__main__":
    install()
    sys.exit(worker.main())
