"""The learning-rate schedule on torch's LambdaLR and the clip's norm on torch's
get_total_norm (executor/optim/schedule.py, clip.py)."""
from __future__ import annotations

import dataclasses
import warnings

import torch

from executor.compute.config import TrainingSettings
from executor.optim.clip import scale_, stage_sq_norm
from executor.optim.schedule import IterationLR, lr_at


def _opt(lr=0.123):
    m = torch.nn.Linear(3, 2)
    return m, torch.optim.AdamW(m.parameters(), lr=lr)


def test_iteration_lr_is_lr_at_in_any_order_and_warns_nothing():
    cfg = dataclasses.replace(TrainingSettings(), lr=2e-3, lr_schedule="cosine", warmup_iters=3,
                              total_iters=12, min_lr_ratio=0.1)
    _, opt = _opt()  # built with another lr: the schedule's base is training.lr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched = IterationLR(opt, cfg)
        assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
        # forward, then a rollback to 5 and a clip redo of 8 after 9 began: no counter drift
        order = list(range(10)) + [5, 6, 9, 8, 14]
        got = [sched.at(i) for i in order]
    assert got == [lr_at(cfg, i) for i in order]  # the same bits, not approximately
    assert opt.param_groups[0]["lr"] == lr_at(cfg, 14) == 2e-3 * 0.1
    assert sched.get_last_lr() == [lr_at(cfg, 14)]


def test_stage_norm_is_one_reduction_equal_to_the_float64_sum():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, 32, generator=g), None, torch.randn(7, generator=g) * 1e-3,
             torch.randn(3, 5, 2, generator=g) * 10]
    ref = sum(float(t.double().pow(2).sum()) for t in grads if t is not None)
    assert abs(stage_sq_norm(grads) - ref) <= 1e-6 * ref
    assert stage_sq_norm([None]) == 0.0 == stage_sq_norm([])


def test_scale_multiplies_every_present_gradient():
    grads = [torch.ones(3), None, torch.full((2, 2), 4.0)]
    scale_(grads, 0.5)
    assert grads[0].tolist() == [0.5] * 3 and grads[2].tolist() == [[2.0, 2.0]] * 2
