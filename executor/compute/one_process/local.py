"""Execute planner Plans in one process: the semantic model of the distributed runtime.

Every live worker gets its own StageCompute, its own copy of the stage's parameters and its
own optimizer (replicas start identical and stay identical). Each worker runs its plan
lowered to steps (planner/lowering.py), through the same handlers as the distributed agent
(executor/runtime/steps/interpreter.py); across workers the next step chosen is the ready one
whose plan action starts earliest, where ready means a RECV's message was sent (F(s, g)
needs the activation of (s-1, g), I/B(s, g) the gradient of (s+1, g)) and an ALLREDUCE's
peers all reached theirs. A plan whose order cannot be met deadlocks and raises.

failures_by_iteration maps an iteration to either
  * a list of (replica, stage) workers that fail DURING it: the iteration runs until half
    its F/I/W/B actions are done (or until the first OPT would run, whichever is first, so
    no stage has stepped), is aborted on all survivors (partial gradients dropped), a new
    plan is solved for the grown failed set, and the iteration re-runs from the start;
  * a Plan to switch to at the start of it (e.g. a worker coming back: it copies its
    stage's parameters and optimizer state from a live peer, docs/design.md section 6).

Each worker steps through the workers' own StageStepper (learning-rate schedule,
clipping by the global norm with optimistic steps and redos), the stages' norms meeting
in an in-process c10d HashStore; every step is settled at the end of its iteration.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from executor.compute.config import TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig, Workload
from executor.compute.one_process.reference import Summary, checksum, snapshot
from executor.compute.stage import StageCompute
from executor.runtime.steps.interpreter import StageSteps
from executor.runtime.steps.stepper import StageStepper
from executor.runtime.steps.tied import ties_of
from planner.lowering import WORK, Op, Step, lower
from planner.solvers.backends import solve
from planner.plan import Plan
from planner.plan import Mode

Key = tuple[int, int]  # (replica, stage)
Event = Union[Plan, Sequence[Sequence[int]]]


class _Channel:
    """The in-memory transport: a sent message waits under its (boundary, g, direction)
    until its RECV takes it (each is sent and received once per iteration)."""

    def __init__(self):
        self.box: dict = {}

    def has(self, st: Step) -> bool:
        return (st.boundary, st.microbatch, st.direction) in self.box

    def recv(self, st: Step):
        return self.box.pop((st.boundary, st.microbatch, st.direction))

    def send(self, st: Step, value) -> None:
        self.box[(st.boundary, st.microbatch, st.direction)] = value


class Aborted(RuntimeError):
    """The iteration in flight was aborted by an injected failure."""


@dataclass
class _Worker:
    module: nn.Module
    compute: StageCompute
    opt: torch.optim.Optimizer
    stepper: StageStepper


def _mode(plan: Plan) -> Mode:
    return Mode(split_backward=plan.solver.split_backward,
                staggered=plan.solver.optimizer == "staggered")


class LocalRunner:
    def __init__(self, cfg: ModelConfig, plan: Plan, workload: Workload = DEFAULT_WORKLOAD,
                 training: TrainingSettings = TrainingSettings()):
        self.cfg, self.wl, self.plan, self.training = cfg, workload, plan, training
        job = plan.job
        self.S, self.n = job.stages, job.replicas * job.microbatches
        self.store = dist.HashStore()  # where the stages' gradient norms meet (clipping)
        self.epoch = 0  # plans switched to: the version the norms are keyed by
        self._it = 0  # the iteration in flight (an aborted one re-runs from its start)
        self.workers: dict[Key, _Worker] = {}
        for w in plan.workers:
            self.workers[w.key] = self._new_worker(w.stage)
        # Tied weights (runtime/steps/tied.py): an owner's OPT waits for its mirrors' gradients,
        # which in one thread means after the mirror stages' OPT.
        self.mirrors_of: dict[int, set[int]] = {}
        for w in self.workers.values():
            for tie in ties_of(w.module):
                self.mirrors_of.setdefault(tie.owner[0], set()).update(s for s, _ in tie.mirrors)

    def _new_worker(self, stage: int) -> _Worker:
        module = self.wl.build_stage(self.cfg, stage, self.S)
        compute = StageCompute(module, stage == 0, stage == self.S - 1, 1.0 / self.n,
                               loss_fn=self.wl.loss_fn, precision=self.training.precision,
                               stage=stage, seed=self.cfg.seed,
                               checkpointing=self.training.activation_checkpointing)
        opt = self.wl.make_optimizer(self.training, module.parameters())
        stepper = StageStepper(module, opt, self.training, stage, self.S, self.store,
                               log=lambda msg: None)
        return _Worker(module, compute, opt, stepper)

    # ---- plan changes (at iteration boundaries only) --------------------------------
    def switch(self, plan: Plan) -> None:
        if (plan.job.stages, plan.job.replicas * plan.job.microbatches) != (self.S, self.n):
            raise ValueError("a new plan must keep the grid's stages and global batch")
        keep = {w.key for w in plan.workers}
        for key in list(self.workers):
            if key not in keep:
                del self.workers[key]
        for key in sorted(keep - set(self.workers)):
            donor = next((v for k, v in sorted(self.workers.items()) if k[1] == key[1]), None)
            if donor is None:
                raise RuntimeError(f"no live peer of stage {key[1]} to restore {key} from")
            w = self._new_worker(key[1])
            w.module.load_state_dict(donor.module.state_dict())
            w.opt.load_state_dict(copy.deepcopy(donor.opt.state_dict()))
            self.workers[key] = w
        self.plan = plan
        self.epoch += 1

    def fail(self, failed: Sequence[Sequence[int]]) -> None:
        for w in self.workers.values():  # the aborted iteration re-runs from its start
            w.stepper.keep_before(self._it)
        dead = {tuple(f) for f in failed}
        union = sorted({tuple(f) for f in self.plan.failed} | dead)
        self.switch(solve(self.plan.job, union, solver="greedy", mode=_mode(self.plan)))

    # ---- one iteration --------------------------------------------------------------
    def iteration(self, it: int, abort_midway: bool = False) -> float:
        """Run every worker's lowered steps (planner/lowering.py) through the interpreter's
        handlers (executor/runtime/steps/interpreter.py), messages through an in-memory channel:
        next is the ready step whose plan action starts earliest, where ready means a
        RECV's message has been sent and an ALLREDUCE's peers have all reached theirs."""
        plan, S = self.plan, self.S
        self._it = it
        steps = {w.key: lower(plan, w.key) for w in plan.workers}
        starts = {w.key: [a.start for a in w.actions] for w in plan.workers}
        pos = {k: 0 for k in steps}
        channel = _Channel()
        batches = {g: self.wl.microbatch(self.cfg, it, g) for g in range(self.n)}
        tables = {}
        for key, w in self.workers.items():
            w.compute.begin(it)
            table = StageSteps(w.compute, key[1], S, batches.__getitem__, channel).table()
            table[Op.OPT] = lambda st, w=w: self._step(w, it)
            tables[key] = table
        losses: dict[int, float] = {}
        todo = sum(st.op in WORK for q in steps.values() for st in q)
        kill_at = todo // 2 if abort_midway else None
        done = 0

        def now(k: Key) -> Step:
            return steps[k][pos[k]]

        def ready(key: Key) -> bool:
            st = now(key)
            if st.op is Op.RECV:
                return channel.has(st)
            if st.op is Op.ALLREDUCE:
                return all(now(k).op is Op.ALLREDUCE for k in st.peers)
            if st.op is Op.OPT:  # a tied weight's owner steps after its mirrors' stages
                return all(pos[k] == len(steps[k]) for k in steps
                           if k[1] in self.mirrors_of.get(key[1], ()))
            return True

        while True:
            live = [k for k in steps if pos[k] < len(steps[k])]
            if not live:
                break
            live.sort(key=lambda k: (starts[k][now(k).index], k))
            key = next((k for k in live if ready(k)), None)
            if key is None:
                raise RuntimeError(f"plan deadlocks at iteration {it}: " + ", ".join(
                    f"{k}:{now(k).label(k[1])}" for k in live))
            st = now(key)
            if kill_at is not None and (done >= kill_at or st.op is Op.ALLREDUCE):
                for w in self.workers.values():
                    w.compute.reset()
                raise Aborted(f"iteration {it} aborted after {done} of {todo} actions")
            d, s = key
            if st.op is Op.ALLREDUCE:
                self._all_reduce([self.workers[k] for k in st.peers])
                for k in st.peers:
                    pos[k] += 1
                continue
            g = st.microbatch
            if st.op in (Op.F, Op.I, Op.B) and plan.routes[g][s] != d:
                raise RuntimeError(f"{st.label(s)} on replica {d}, routes say {plan.routes[g][s]}")
            tables[key][st.op](st)
            if st.op is Op.F and s == S - 1:
                losses[g] = self.workers[key].compute.loss(g)
            pos[key] += 1
            done += st.op in WORK
        if sorted(losses) != list(range(self.n)):
            raise RuntimeError(f"iteration {it} computed losses for {sorted(losses)}")
        # every stage's norm is in: steps become final (owners of tied weights first)
        for _, w in sorted(self.workers.items(), key=lambda kw: (kw[0][1], kw[0][0])):
            w.stepper.settle()
            w.stepper.forget_committed(it)
        return sum(losses[g] for g in range(self.n)) / self.n

    def _all_reduce(self, peers: list[_Worker]) -> None:
        """ALLREDUCE: sum each parameter's gradient over the live peers (fixed order, so
        every peer gets the identical sum)."""
        for w in peers:
            if w.compute.pending():
                raise RuntimeError(f"OPT with micro-batches {w.compute.pending()} unfinished")
        for params in zip(*(list(w.module.parameters()) for w in peers)):
            parts = [p.grad for p in params if p.grad is not None]
            if not parts:
                continue
            total = parts[0].clone()
            for t in parts[1:]:
                total.add_(t)
            for p in params:
                p.grad = total.clone()

    def _step(self, w: _Worker, it: int) -> None:
        """OPT: the worker's optimizer step on the summed gradients."""
        w.stepper.step(it, self.epoch)
        w.compute.zero_grad()

    def summary(self, losses: list[float]) -> Summary:
        sums, states = [], []
        for s in range(self.S):
            peers = [w for k, w in sorted(self.workers.items()) if k[1] == s]
            first = snapshot(peers[0].module)
            for other in peers[1:]:  # replicas must stay bit-identical
                if any(not torch.equal(first[n], t) for n, t in snapshot(other.module).items()):
                    raise AssertionError(f"replicas of stage {s} diverged")
            sums.append(checksum(peers[0].module))
            states.append(first)
        return Summary(losses=losses, param_checksums=sums, state=states)


def run_plan_locally(cfg: ModelConfig, plan: Plan, iterations: int,
                     failures_by_iteration: Optional[Mapping[int, Event]] = None, *,
                     workload: Workload = DEFAULT_WORKLOAD,
                     training: TrainingSettings = TrainingSettings()) -> Summary:
    runner = LocalRunner(cfg, plan, workload, training)
    events = dict(failures_by_iteration or {})
    losses = []
    for it in range(iterations):
        ev = events.get(it)
        if isinstance(ev, Plan):
            runner.switch(ev)
        elif ev:
            try:
                runner.iteration(it, abort_midway=True)
                raise AssertionError("an injected failure must abort the iteration")
            except Aborted:
                runner.fail(ev)
        losses.append(runner.iteration(it))
    return runner.summary(losses)
