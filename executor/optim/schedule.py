"""The learning rate as a pure function of the iteration number.

No scheduler object and no scheduler state: the rate of iteration `it` is set on the
optimizer's param groups right before its step, so a rollback, a re-run under a new plan,
a restarted worker and a resumed checkpoint all get it right without restoring anything.

    warm-up (it < warmup):  lr * (it + 1) / warmup
    constant:               lr
    cosine:                 min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2,
                            t = (it - warmup) / (total - warmup), min_lr = min_lr_ratio * lr,
                            and min_lr from `total` on (a run longer than its horizon).
"""
from __future__ import annotations

import math

import torch

SCHEDULES = ("constant", "cosine")


def lr_at(cfg, it: int) -> float:
    """Learning rate of iteration `it` under cfg's lr, lr_schedule, warmup_iters,
    total_iters and min_lr_ratio."""
    lr, warmup = cfg.lr, cfg.warmup_iters
    if it < warmup:
        return lr * (it + 1) / warmup
    if cfg.lr_schedule == "constant":
        return lr
    if cfg.lr_schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {cfg.lr_schedule!r}; "
                         f"choose one of {', '.join(SCHEDULES)}")
    total = cfg.total_iters
    if total <= warmup:
        raise ValueError(f"a cosine schedule needs total_iters ({total}) above "
                         f"warmup_iters ({warmup})")
    floor = cfg.min_lr_ratio * lr
    if it >= total:
        return floor
    t = (it - warmup) / (total - warmup)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
