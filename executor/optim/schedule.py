"""The learning rate as a pure function of the iteration number, applied through torch's
own torch.optim.lr_scheduler.LambdaLR.

    warm-up (it < warmup):  lr * (it + 1) / warmup
    constant:               lr
    cosine:                 lr * (r + (1 - r) * (1 + cos(pi * t)) / 2),
                            t = (it - warmup) / (total - warmup), r = min_lr_ratio,
                            and lr * r from `total` on (a run longer than its horizon).

`lr_factor` is the multiplier LambdaLR takes as its lr_lambda, so `lr_at` (what the
reference and tests read) and the scheduler give the same bits: base lr * factor.

What is kept from the stateless first version, and why: LambdaLR counts its own steps
(last_epoch), but a rollback re-runs iterations, a re-run under a new plan repeats one, a
restarted worker joins mid-run and a resumed checkpoint starts anywhere; under the
staggered optimizer a clip redo steps iteration `it` again after `it + 1` may have begun.
A step counter would drift in each case, and would have to be saved, restored and rolled
back with the optimizer. So `IterationLR.at(it)` sets the counter to `it` and applies
that iteration's rate right before the step: the scheduler's state is the iteration
number, nothing to restore.
"""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "cosine")


def lr_factor(training, it: int) -> float:
    """The rate of iteration `it` as a multiple of training.lr, under the TrainingSettings'
    lr_schedule, warmup_iters, total_iters and min_lr_ratio."""
    warmup = training.warmup_iters
    if it < warmup:
        return (it + 1) / warmup
    if training.lr_schedule == "constant":
        return 1.0
    if training.lr_schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {training.lr_schedule!r}; "
                         f"choose one of {', '.join(SCHEDULES)}")
    total = training.total_iters
    if total <= warmup:
        raise ValueError(f"a cosine schedule needs total_iters ({total}) above "
                         f"warmup_iters ({warmup})")
    floor = training.min_lr_ratio
    if it >= total:
        return floor
    t = (it - warmup) / (total - warmup)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def lr_at(training, it: int) -> float:
    """Learning rate of iteration `it` (what IterationLR sets for training.lr as base)."""
    return training.lr * lr_factor(training, it)


class IterationLR(LambdaLR):
    """LambdaLR on lr_factor, positioned by iteration number instead of counted steps
    (module docstring). Every param group's base rate is training.lr."""

    def __init__(self, opt: torch.optim.Optimizer, training):
        for group in opt.param_groups:  # the base LambdaLR multiplies, whatever the
            group["initial_lr"] = training.lr  # optimizer was built with
        self.training = training
        super().__init__(opt, lambda it: lr_factor(training, it), last_epoch=-1)

    def at(self, it: int) -> float:
        """Set iteration `it`'s rate on the optimizer; returns it."""
        self.last_epoch = it
        # LambdaLR's rule (get_lr) from its public fields: get_lr itself warns when
        # called outside step(), and step() counts instead of being told the iteration
        lrs = [base * f(it) for base, f in zip(self.base_lrs, self.lr_lambdas)]
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = lrs
        return lrs[0]


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
