"""A stage's forward as units: the layers of the whole model, numbered.

A model's forward calls `layer(index, fn, *args)` for each of its layers, `index` being
the layer's place in the whole model (the built-ins: 0 the embedding, 1..L the blocks,
L+1 the final norm and head; a module factory's pieces: their place in the split), so
neither the draws nor what is recomputed depend on where the stage boundaries fall.
There the runtime:

- seeds the draws of the layer (executor/compute/draws.py) when the stage is keyed;
- recomputes the layer's forward in backward instead of keeping what it saved, when
  activation checkpointing chooses it (`block`: its number among the layers that may be
  recomputed; executor/compute/backward/recompute.py).

Outside a stage's forward (a module called directly: tests, a profile's warm-up) `layer`
is `fn(*args)`. A Workload whose forward never calls it is keyed as one unit per stage
(so re-splitting it changes its draws) and cannot be checkpointed.

StageCompute (stage.py) and the single-process reference (reference.py) run every stage
forward inside `StageUnits.forward(iteration, g)`, so both draw alike.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from executor.compute.backward import recompute
from executor.compute.draws import Draws, Key

log = logging.getLogger("recycle.compute")
_local = threading.local()


@dataclass
class Pass:
    """One forward of a stage on one micro-batch (or a layer's recomputation of it)."""
    draws: Draws
    key: int  # Key(seed, iteration, g).base(): what each layer's seed is mixed from
    seeded: bool  # its draws are keyed
    policy: recompute.Policy
    ledger: object = None  # executor/compute/memory.SavedLedger when memory is tracked
    recomputing: bool = False
    layers: int = 0  # layer() calls seen (0: the model has no units)
    frames: list = dataclasses.field(default_factory=list)  # its recomputed layers



def active() -> Optional[Pass]:
    return getattr(_local, "current", None)


@contextmanager
def running(p: Optional[Pass]) -> Iterator[Optional[Pass]]:
    prev = active()
    _local.current = p
    try:
        yield p
    finally:
        _local.current = prev


def layer(index: int, fn: Callable, *args, block: Optional[int] = None):
    """Layer `index` of the whole model applied to args. block: its number among the
    layers activation checkpointing may recompute (None: never recomputed)."""
    p = active()
    if p is None:
        return fn(*args)
    p.layers += 1
    if p.seeded:
        p.draws.seed(p.key, index)
    if block is not None and not p.recomputing and p.policy.recomputes(block):
        again = dataclasses.replace(p, recomputing=True, ledger=None, frames=[])
        return recompute.checkpoint(p, index, fn, args, lambda: running(again))
    return fn(*args)


def stage_unit(stage: int) -> int:
    """The unit a stage's forward starts in (what a model without layers draws in)."""
    return -1 - stage


class StageUnits:
    """What one stage's forwards run in: its draws and its checkpointing policy."""

    def __init__(self, module: nn.Module, stage: int, seed: int, device: torch.device,
                 checkpointing: str = "none", name_unkeyable: bool = True):
        self.stage, self.seed = stage, seed
        self.draws = Draws(module, device, f"stage {stage}", name_unkeyable)
        self.policy = recompute.Policy.parse(checkpointing)
        self._warned = False

    @contextmanager
    def forward(self, iteration: int, g: int, ledger=None) -> Iterator[Pass]:
        d = self.draws
        seeded = d.seeds
        key = Key(self.seed, iteration, g).base() if seeded else 0
        saved = d.save() if seeded else None
        p = Pass(d, key, seeded, self.policy, ledger)
        if seeded:
            d.seed(key, stage_unit(self.stage))
        try:
            with running(p):
                yield p
        finally:
            if seeded:
                d.end_probe()
                d.restore(saved)
        if self.policy.on and p.layers == 0 and not self._warned:
            self._warned = True
            log.warning("stage %d: activation checkpointing %s asked, but its forward calls "
                        "no executor.compute.units.layer: nothing is recomputed",
                        self.stage, self.policy)
