"""The optimizer step of one stage worker, and the pre-step state rollback restores.

The agent hands over a stage whose gradients are already summed over its live peers;
the stepper keeps what a later rollback to "before step it" needs (optim/prestep_copies.py:
pre-allocated slots, one foreach copy), sets the iteration's learning rate (a pure
function of `it`, optim/schedule.py) and steps.

Clipping by the global norm (training.clip > 0, optim/clip.py) needs every stage's gradient
norm, and the staggered optimizer steps each stage as soon as its own all-reduce is done.
So each stage publishes its squared norm for (plan version, iteration) and then:
  * if every stage's norm is already in the store (a stage that steps late, typically
    stage 0), it steps once with the exact clip coefficient;
  * otherwise it steps optimistically, as if the clip did not apply, and keeps the
    gradients. `settle()` -- called wherever the post-step parameters are about to be
    used or published (the next iteration's first action, entering a plan, a checkpoint,
    the final checksum) -- reads the norms (by then they are nearly always there) and, if
    the clip applies, redoes the step from the pre-step copy with scaled gradients
    (zero-bubble's optimizer post-validation). Both ways give the very same bits as a
    step with the coefficient known up front: the snapshot restore is exact.
Counters (`stats`) say how often each case happened and what the redos cost.

Weights tied across stages (runtime/steps/tied.py): the owner adds the mirrors' gradients before
its norm and step and publishes the new value once its step is final; a mirror leaves the
weight out of its step and copies that value in at settle(), which is when its step
becomes final.

Contract with the caller: an optimistic step keeps references to the gradient tensors
(p.grad at step time) until settle(); the caller may drop them (p.grad = None) but must
not change them in place before the next settle() (no in-place zeroing or reuse of one
flat gradient buffer for the next iteration before settle()).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
from torch import nn

from executor.optim.clip import NormBoard, coefficient, global_norm, scale_, stage_sq_norm
from executor.optim.schedule import IterationLR
from executor.optim.prestep_copies import PreStepCopies
from executor import protocol as P
from executor.runtime.steps.tied import TiedExchange
from executor.runtime.transport.waiting import wait_until
from executor.timeouts import Timeouts

_PLAN_COUNTER = P.PLAN_VERSION  # rendezvous.publish_plan's: newest version + 1


@dataclass
class StepStats:
    steps: int = 0
    exact: int = 0  # clip: every norm was in at the step, no redo possible
    optimistic: int = 0  # clip: stepped before some stage's norm was in
    redos: int = 0  # optimistic steps the clip then applied to: redone
    redo_s: float = 0.0  # wall time of the redos (restore + scale + step)
    settle_wait_s: float = 0.0  # wall time settle() waited for other stages' norms
    snapshot_s: float = 0.0  # wall time taking pre-step copies (host side)
    step_s: float = 0.0  # wall time of the optimizer steps themselves (redos excluded)

    def line(self) -> str:
        d = asdict(self)
        return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in d.items())


@dataclass
class _Pending:
    it: int
    version: int
    grads: list  # the step's gradients (the agent drops p.grad right after the step)
    versions: list  # their autograd version counters: an in-place change shows


class StageStepper:
    def __init__(self, module: nn.Module, opt: torch.optim.Optimizer, training, stage: int,
                 stages: int, store=None, *, log: Optional[Callable[[str], None]] = None):
        """`training`: the run's TrainingSettings (its schedule and clip)."""
        self.module, self.opt, self.training = module, opt, training
        self.stage, self.stages, self.store = stage, stages, store
        self.params = [p for group in opt.param_groups for p in group["params"]]
        self.copies = PreStepCopies(module, opt)
        self.lr = IterationLR(opt, training)  # set by iteration number: optim/schedule.py
        self.board: Optional[NormBoard] = None
        if training.clip > 0:
            if store is None:
                raise ValueError("clipping by the global norm needs the run's store")
            self.board = NormBoard(store, stages)
        self.pending: Optional[_Pending] = None
        self.tied = TiedExchange(module, stage, store)
        self.published: list[tuple[int, int]] = []  # (version, iteration) of our norm keys
        self.stats = StepStats()
        self.idle_cpu_s = 0.0  # CPU time of idle() copies since the agent last reset it
        # The agent's log (timestamped, per worker); by default the process's stdout,
        # which is the worker's log file.
        self.log = log or (lambda msg: print(f"[stage {stage}] {msg}", flush=True))
        # Polled while settle() waits for other stages' norms: returns a newer plan or
        # None (the agent's `lambda: self._next_plan(0)`). A newer plan means a stage
        # failed before publishing its norm: leave (WaitEnded) and roll back. Without
        # it, the in-process launcher's plan counter in the store is watched instead.
        self.newer: Optional[Callable[[], object]] = None
        timeout = getattr(store, "timeout", None)
        self.wait_s = Timeouts(timeout.total_seconds()).other_stages if timeout else 60.0
        # Told every stage's squared norm of each iteration stepped with the clip on (the
        # agent's boundary log keeps them: a replay of a lost stage steps with them).
        self.on_norms: Optional[Callable[[int, list], None]] = None

    def step(self, it: int, version: int, logged: Optional["Logged"] = None) -> None:
        """Snapshot the pre-step state of iteration `it`, then step (plan `version`).

        `logged`: a replayed step of a stage lost whole (runtime/replay/): the clip norms
        and the tied weights' inputs come from the boundary logs, as the run had them,
        instead of the store; nothing is published (only told to `on_publish`, so the
        log holds it again) and no pre-step copy is kept (a replay is redone whole, never
        rolled back into). Otherwise the very step a live iteration takes."""
        if self.pending is not None or self.tied.pending is not None:
            self.settle()  # defensive: a step is always taken from a final state
        if self.tied.active:  # mirrors publish (and drop) theirs, owners add them
            if logged is None:
                self.tied.send_grads(version, it)
                self.tied.add_grads(version, it, self._waiter(version, f"tied gradients "
                                                                       f"of iteration {it}"))
            else:
                self.tied.tell("grad", it, self.tied.take_shares())
                self.tied.add_shares(logged.shares)
        t0 = time.perf_counter()
        if logged is None:
            self.copies.capture(it)
        t1 = time.perf_counter()
        self.lr.at(it)
        final = True
        if self.board is not None:
            grads = [p.grad for p in self.params]
            sums = logged.norms if logged is not None else self._publish_norm(version, it, grads)
            if sums is None and logged is not None:  # plan_replay never lets one through
                raise ValueError(f"replayed step {it}: the clip needs every stage's logged norm")
            if sums is None:
                self.stats.optimistic += 1
                self.pending = _Pending(it, version, grads, _versions(grads))
                final = False
            else:
                self.stats.exact += logged is None
                self._noted(it, sums)
                c = coefficient(global_norm(sums), self.training.clip)
                if c < 1.0:
                    scale_(grads, c)
        self.opt.step()
        self.stats.steps += 1
        self.stats.snapshot_s += t1 - t0
        self.stats.step_s += time.perf_counter() - t1
        if logged is not None:  # a mirror takes the owner's logged value; an owner tells
            self.tied.copy_values(logged.values)
            if self.tied.owned:
                self.tied.tell("value", it, self.tied.values())
        elif final:
            self.tied.send_values(version, it)
            if self.tied.pending is None:  # a mirror's step is final once its copy is in
                self.copies.copy_ahead(it + 1)

    def _publish_norm(self, version: int, it: int, grads: list) -> Optional[list]:
        """Publish this stage's squared norm; every stage's, if all are in already."""
        self.board.publish(version, it, self.stage, stage_sq_norm(grads))
        self.published.append((version, it))
        return self.board.ready(version, it)

    def _noted(self, it: int, sums: list) -> None:
        if self.on_norms is not None:
            self.on_norms(it, sums)

    def _waiter(self, version: int, what: str):
        def wait(keys):  # WaitEnded: the agent aborts the iteration and re-syncs
            wait_until(lambda: self.store.check(keys), what, limit_s=self.wait_s,
                       newer=lambda: self._newer_than(version))
        return wait

    def settle(self) -> None:
        """Make the last step final before its parameters are used: if it was taken
        optimistically and the global norm says the clip applies, redo it."""
        pend = self.pending
        if pend is None:
            if self.tied.pending is not None:
                version, it = self.tied.pending
                self.tied.receive_values(self._waiter(version, f"tied weights of step {it}"))
                self.copies.copy_ahead(it + 1)
            return
        t0 = time.perf_counter()
        # WaitEnded: the agent aborts the iteration and re-syncs
        sums = self.board.wait(pend.version, pend.it, self.wait_s,
                               lambda: self._newer_than(pend.version))
        t1 = time.perf_counter()
        self.stats.settle_wait_s += t1 - t0
        self.pending = None
        self._noted(pend.it, sums)
        if _versions(pend.grads) != pend.versions:  # a redo from them would be wrong
            raise RuntimeError(f"the gradients of step {pend.it} changed in place before "
                               "settle(): the stepper's contract (module docstring)")
        norm = global_norm(sums)
        c = coefficient(norm, self.training.clip)
        if c < 1.0:
            self.copies.redo_from(pend.it)
            scale_(pend.grads, c)
            saved = [p.grad for p in self.params]
            for p, g in zip(self.params, pend.grads):
                p.grad = g
            self.lr.at(pend.it)
            self.opt.step()
            for p, g in zip(self.params, saved):
                p.grad = g
            dt = time.perf_counter() - t1
            self.stats.redos += 1
            self.stats.redo_s += dt
            self.log(f"clip: redid step {pend.it} (plan v{pend.version}): global norm "
                     f"{norm:.6g} > {self.training.clip:g}, x{c:.6g}, {dt * 1e3:.2f} ms "
                     f"(waited {(t1 - t0) * 1e3:.2f} ms for the norms)")
        self.tied.send_values(pend.version, pend.it)
        self.tied.receive_values(self._waiter(pend.version, f"tied weights of step {pend.it}"))
        self.copies.copy_ahead(pend.it + 1)

    def unsettled(self) -> Optional[int]:
        """The iteration of a step that cannot be made final now because it waits for what
        a stage that died never published (its norm, a tied weight's new value); None if
        every step is final or can be made so (one store round trip each)."""
        pend, out = self.pending, None
        if pend is not None and self.board is not None and \
                self.board.ready(pend.version, pend.it) is None:
            out = pend.it
        if self.tied.value_missing():
            out = min(out if out is not None else self.tied.pending[1], self.tied.pending[1])
        return out

    def _newer_than(self, version: int):
        """A plan newer than `version` if one is out (the agent's), else None; without
        the agent, the in-process launcher's plan counter says (its number only)."""
        if self.newer is not None:
            return self.newer()
        if self.store.check([_PLAN_COUNTER]):
            newest = int(self.store.add(_PLAN_COUNTER, 0)) - 1
            if newest > version:
                return PlanNumber(newest)
        return None

    def rollback(self, r: int) -> None:
        """Restore the state before step `r` (which this worker took)."""
        self.pending = None  # a step of r or later is undone, settled or not
        self.tied.pending = None
        self.copies.restore(r)

    def reset(self, r: int) -> None:
        """The state was replaced by that after step r-1 (a peer-memory snapshot): every
        pre-step copy and pending step is of a past that no longer happened."""
        self.pending = None
        self.tied.pending = None
        self.tied.drop_from(0)
        self.copies.drop(lambda it: False)

    def keep_before(self, r: int) -> None:
        """Forget snapshots of iterations >= r (they will be re-run)."""
        if self.pending is not None and self.pending.it >= r:
            self.pending = None
        self.tied.drop_from(r)
        self.copies.restart(r)  # buffers as before r's aborted forward, if we have them
        self.copies.drop(lambda it: it < r)

    def forget_committed(self, committed: int) -> None:
        """Forget snapshots of iterations every live worker has stepped (except the one
        an unsettled step may still have to be redone from)."""
        keep = self.pending.it if self.pending is not None else None
        self.copies.drop(lambda it: it > committed or it == keep)
        self.tied.forget_before(committed)
        if self.board is not None:  # every worker has settled committed - 1: its keys go
            done = [k for k in self.published if k[1] < committed]
            self.published = [k for k in self.published if k[1] >= committed]
            for version, it in done:
                self.board.forget(version, it, self.stage)

    def idle(self) -> None:
        """The worker is about to wait for a message: take what can be taken now. Its CPU
        time adds up in `idle_cpu_s` (the agent's compute measure leaves it out)."""
        if self.copies.idle_copy_due:  # reading the clock is a system call: only then
            t0 = time.thread_time()
            self.copies.copy_when_idle()
            self.idle_cpu_s += time.thread_time() - t0

    def snapshot_bytes(self) -> int:
        """Extra memory the kept snapshots hold."""
        return self.copies.held_bytes()


@dataclass(frozen=True)
class Logged:
    """A replayed step's inputs, from the boundary logs (runtime/replay/): every stage's
    squared gradient norm as the run clipped with it (None without the clip), the mirrors'
    gradient shares an owner adds (mirror stage -> {tie: tensor}) and the stepped values a
    mirror copies in (owner stage -> {tie: tensor})."""
    norms: Optional[list]
    shares: dict
    values: dict


@dataclass(frozen=True)
class PlanNumber:
    """A newer plan known by its version only (the store's counter, no plan at hand)."""
    version: int


def _versions(grads) -> list:
    return [g._version if g is not None else None for g in grads]
