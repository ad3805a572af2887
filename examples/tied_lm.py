"""A plain nn.Module with its input embedding tied to its output head, trained without a
Workload: `--model examples.tied_lm:TiedLM?split=emb,blocks.0,blocks.1,norm,head`, or from
Python `module_workload(TiedLM, PIECES)` (executor/models/modules.py).

On two or more stages the embedding (stage 0) and the head (last stage) are one weight
held twice: the tied gradient is summed between the two stages before either copy moves
(executor/runtime/steps/tied.py, docs/executor.md "Tied weights").
    recycle train --model 'examples.tied_lm:TiedLM?split=emb,blocks.0,blocks.1,norm,head' \
        -d 2 -s 2 --kill 1:1@1 --rejoin 1:1@2
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from executor.compute.model import ModelConfig
from executor.models.modules import module_workload


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TiedLM(nn.Module):
    """Token embedding, residual MLP blocks, a final norm and a head that IS the embedding."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.emb.weight
        nn.init.normal_(self.emb.weight, std=0.02)  # GPT-2's: N(0, 1) logits would be huge

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class AlbertLM(TiedLM):
    """ALBERT-style: ONE block applied at every layer (a weight used several times in a
    stage, and across stages when the layers are split), plus the tied embedding/head.
    `--model 'examples.tied_lm:AlbertLM?split=emb,blocks.0,blocks.1,blocks.2,norm,head'`"""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        shared = self.blocks[0]
        self.blocks = nn.ModuleList(shared for _ in range(cfg.n_layers))


def pieces(n_layers: int) -> list[str]:
    return ["emb", *(f"blocks.{i}" for i in range(n_layers)), "norm", "head"]


def workload():
    """Two blocks: `--model examples.tied_lm:workload --layers 2`."""
    return module_workload(TiedLM, pieces(2), reads_tokens=True)
