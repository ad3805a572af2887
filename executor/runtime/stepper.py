"""The optimizer step of one stage worker, and the pre-step state rollback restores.

The agent hands over a stage whose gradients are already summed over its live peers;
the stepper keeps what a later rollback to "before step it" needs and steps. `settle()`
is called wherever the post-step parameters are about to be used or published (the
next iteration's first action, entering a plan, a checkpoint, the final checksum): a
step that must be corrected after the fact (gradient clipping by a norm other stages
contribute to) is corrected there.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn


class StageStepper:
    def __init__(self, module: nn.Module, opt: torch.optim.Optimizer, cfg, stage: int,
                 stages: int, store=None):
        self.module, self.opt, self.cfg = module, opt, cfg
        self.stage, self.stages, self.store = stage, stages, store
        self.snapshots: dict[int, tuple[dict, dict]] = {}  # iteration -> pre-step state

    def step(self, it: int, version: int) -> None:
        """Snapshot the pre-step state of iteration `it`, then step (plan `version`)."""
        self.snapshots[it] = ({k: v.detach().clone() for k, v in self.module.state_dict().items()},
                              copy.deepcopy(self.opt.state_dict()))
        self.opt.step()

    def settle(self) -> None:
        """Make the last step final before its parameters are used (no-op without clipping)."""

    def rollback(self, r: int) -> None:
        """Restore the state before step `r` (which this worker took)."""
        sd, osd = self.snapshots[r]
        self.module.load_state_dict(sd)
        self.opt.load_state_dict(osd)

    def keep_before(self, r: int) -> None:
        """Forget snapshots of iterations >= r (they will be re-run)."""
        self.snapshots = {k: v for k, v in self.snapshots.items() if k < r}

    def forget_committed(self, committed: int) -> None:
        """Forget snapshots of iterations every live worker has stepped."""
        self.snapshots = {k: v for k, v in self.snapshots.items() if k > committed}

    def snapshot_bytes(self) -> int:
        """Extra memory the kept snapshots hold."""
        total = 0
        for sd, osd in self.snapshots.values():
            for t in _tensors(sd) + _tensors(osd):
                total += t.numel() * t.element_size()
        return total

    def held(self) -> Optional[int]:
        return max(self.snapshots) if self.snapshots else None


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []
