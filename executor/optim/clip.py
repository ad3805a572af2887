"""Clipping by the global gradient norm over the whole model, computed identically in the
workers and the reference.

Each stage contributes the square of its gradients' norm, computed by torch's own
torch.nn.utils.get_total_norm (foreach kernels, one reduction per device and dtype) and
read to the host once per stage (one sync; the first version read every parameter's sum,
one sync per parameter); the global norm is the square root of the stage squares added in
float64 in stage order. The coefficient is torch.nn.utils.clip_grad_norm_'s:
max_norm / (norm + 1e-6), applied (torch._foreach_mul_) only when below 1.

Why not clip_grad_norm_ itself: its norm is one process's parameters, ours is the whole
model's, summed over stages that live in other processes; and under the staggered
optimizer a stage may step before the other stages' norms are known, so the coefficient
must be a number the stepper can apply later to gradients it kept (runtime/steps/stepper.py).
Every peer of a stage publishes the same value (its gradients are identical after the
all-reduce, and the same code runs on the same device type and thread count).

In a pipeline each stage's sum lives in another process, and a stage steps as soon as its
own all-reduce is done (staggered optimizer). Waiting for every stage's sum before stepping
would be a cross-stage barrier. `NormBoard` is where the sums meet: each stage's workers
publish theirs in the run's c10d store under (plan version, iteration, stage) (identical
on every peer: it is taken after the all-reduce) and read the others' when they are there
(no wait) or when the step must be final (runtime/steps/stepper.py). Keys carry the plan version
because a rolled-back iteration re-runs under a new version with other gradients.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from executor.protocol import clip_norm_key
from executor.runtime.transport.waiting import wait_until

EPS = 1e-6  # clip_grad_norm_'s


def stage_sq_norm(grads: Sequence[Optional[Tensor]]) -> float:
    """Squared norm of a stage's gradients (one reduction, one read to the host)."""
    present = [g.detach() for g in grads if g is not None]
    if not present:
        return 0.0
    return float(torch.nn.utils.get_total_norm(present, 2.0)) ** 2


def global_norm(stage_sums: Sequence[float]) -> float:
    return math.sqrt(sum(stage_sums))


def coefficient(norm: float, max_norm: float) -> float:
    """The factor gradients are scaled by (1.0: the clip does not apply)."""
    return min(1.0, max_norm / (norm + EPS))


def scale_(grads: Sequence[Optional[Tensor]], c: float) -> None:
    present = [g for g in grads if g is not None]
    if present:
        torch._foreach_mul_(present, c)


class NormBoard:
    """The stages' squared gradient norms of one run, in a c10d store."""

    def __init__(self, store, stages: int):
        self.store, self.stages = store, stages

    @staticmethod
    def key(version: int, it: int, stage: int) -> str:
        return clip_norm_key(version, it, stage)

    def publish(self, version: int, it: int, stage: int, sq: float) -> None:
        self.store.set(self.key(version, it, stage), float(sq).hex())

    def forget(self, version: int, it: int, stage: int) -> None:
        self.store.delete_key(self.key(version, it, stage))

    def _keys(self, version: int, it: int) -> list[str]:
        return [self.key(version, it, s) for s in range(self.stages)]

    def _read(self, keys: list[str]) -> list[float]:
        return [float.fromhex(v.decode()) for v in self.store.multi_get(keys)]

    def ready(self, version: int, it: int) -> Optional[list[float]]:
        """Every stage's sum if all are in already (one round trip, never waits)."""
        keys = self._keys(version, it)
        return self._read(keys) if self.store.check(keys) else None

    def wait(self, version: int, it: int, limit_s: float, newer=None) -> list[float]:
        """Every stage's sum, waiting up to limit_s (executor/runtime/transport/waiting.py: a newer
        plan ends the wait, this iteration will be rolled back anyway). Polls with check():
        store.wait would return at once but logs a C++ warning at every timeout."""
        keys = self._keys(version, it)
        missing = lambda: "missing stages " + str([s for s, k in enumerate(keys)  # noqa: E731
                                                   if not self.store.check([k])])
        wait_until(lambda: self.store.check(keys), f"gradient norms of iteration {it} "
                   f"(plan v{version})", limit_s=limit_s, newer=newer, missing=missing)
        return self._read(keys)
