"""A user workload built only from plain torch.nn layers: `--model examples.mlp_workload:workload`.

Run from the repository root (the current directory is on --model's import path):
    recycle train --model examples.mlp_workload:workload -d 2 -s 2 --kill 1:0@1 --rejoin 1:0@2
    recycle profile --model examples.mlp_workload:workload -s 2 -o job.json

The task: each position carries a d_model-dim feature vector x; its class is the argmax of
x @ P for a fixed random projection P (vocab classes). A residual MLP learns it.
Its plain nn layers get their weight gradients in W like any model's (docs/executor.md,
"Deferred W"); it reads its own synthetic features, so `--data` does not apply to it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from executor.compute.data import _seed
from executor.compute.model import ModelConfig, Workload, layer_range


def _seeded(cfg: ModelConfig, key: int, build):
    """Build under a private RNG seeded by (seed, key): the same parameters on every
    replica and every split, whatever else used the global RNG before."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(cfg.seed, 0x311F, key))
        return build()


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(),
                                 nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(x)


class MLPStage(nn.Module):
    def __init__(self, cfg: ModelConfig, stage: int, stages: int):
        super().__init__()
        d = cfg.d_model
        lo, hi = layer_range(cfg.n_layers, stage, stages, cfg.boundaries)
        self.inp = _seeded(cfg, 0, lambda: nn.Linear(d, d)) if stage == 0 else None
        # keyed by the global layer index: names and values do not depend on the split
        self.blocks = nn.ModuleDict({str(i): _seeded(cfg, i + 1, lambda: Block(d))
                                     for i in range(lo, hi)})
        self.head = None
        if stage == stages - 1:
            self.head = _seeded(cfg, cfg.n_layers + 1, lambda: nn.Sequential(
                nn.LayerNorm(d), nn.Linear(d, cfg.vocab)))

    def forward(self, x: Tensor) -> Tensor:
        if self.inp is not None:
            x = self.inp(x)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else x


def microbatch(cfg: ModelConfig, iteration: int, g: int) -> tuple[Tensor, Tensor]:
    """(features [b, T, d] float32, classes [b, T] long), from (cfg, iteration, g) only."""
    proj = torch.randn(cfg.d_model, cfg.vocab,
                       generator=torch.Generator().manual_seed(_seed(cfg.seed, 0xC1A55)))
    gen = torch.Generator().manual_seed(_seed(cfg.seed, 0xDA7A, iteration, g))
    x = torch.randn(cfg.micro_batch_size, cfg.seq_len, cfg.d_model, generator=gen)
    return x, (x @ proj).argmax(-1)


def loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def workload() -> Workload:
    return Workload(build_stage=MLPStage, loss_fn=loss, microbatch=microbatch)
