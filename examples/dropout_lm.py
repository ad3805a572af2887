"""Models that draw random numbers in their forward: dropout, exact under failures because
every draw is keyed by (seed, iteration, micro-batch, layer) (docs/executor.md,
"Randomness").

`DropoutGPT`: a GPT-2-style plain nn.Module (token and position embeddings, pre-LN blocks
of causal attention and MLP, dropout after the embeddings, on the attention weights and on
both residual branches, as GPT-2's), trained without a Workload:

    recycle train --model 'examples.dropout_lm:DropoutGPT?split=emb,blocks.0,blocks.1,norm,head' \\
        -d 2 -s 2 --kill 1:1@1 --rejoin 1:1@2

`workload`: a Workload of its own (a residual MLP with dropout, its stages built by hand):
its forward calls no `units.layer`, so each stage is keyed as one unit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from executor.compute.model import ModelConfig, Workload, layer_range

P = 0.1  # GPT-2's dropout


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(P)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.01)

    def forward(self, tokens: Tensor) -> Tensor:
        pos = torch.arange(tokens.shape[-1], device=tokens.device)
        return self.drop(self.tok(tokens) + self.pos(pos))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.attn_drop, self.resid_drop = nn.Dropout(P), nn.Dropout(P)

    def forward(self, x: Tensor) -> Tensor:
        b, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda t: t.reshape(b, T, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1),
                              float("-inf"))
        y = self.attn_drop(att.softmax(-1)) @ v
        x = x + self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, T, d)))
        return x + self.resid_drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class DropoutGPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.emb = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def pieces(n_layers: int) -> list[str]:
    return ["emb", *(f"blocks.{i}" for i in range(n_layers)), "norm", "head"]


def name(n_layers: int) -> str:
    """The --model name of DropoutGPT with n_layers blocks."""
    return "examples.dropout_lm:DropoutGPT?split=" + ",".join(pieces(n_layers))


# ---- a Workload of its own ----------------------------------------------------------------

def _seeded(cfg: ModelConfig, key: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 1000 + key)
        return build()


class MLPStage(nn.Module):
    """Residual MLP blocks with dropout; the first stage embeds, the last projects."""

    def __init__(self, cfg: ModelConfig, stage: int, stages: int):
        super().__init__()
        d = cfg.d_model
        lo, hi = layer_range(cfg.n_layers, stage, stages, cfg.boundaries)
        self.emb = _seeded(cfg, 0, lambda: nn.Embedding(cfg.vocab, d)) if stage == 0 else None
        self.blocks = nn.ModuleDict({str(i): _seeded(cfg, i + 1, lambda: nn.Sequential(
            nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(P), nn.Linear(4 * d, d)))
            for i in range(lo, hi)})
        self.head = _seeded(cfg, cfg.n_layers + 1, lambda: nn.Linear(d, cfg.vocab)) \
            if stage == stages - 1 else None

    def forward(self, x: Tensor) -> Tensor:
        if self.emb is not None:
            x = F.dropout(self.emb(x), P, self.training)  # functional: found by the probe
        for block in self.blocks.values():
            x = x + block(x)
        return self.head(x) if self.head is not None else x


def workload() -> Workload:
    return Workload(build_stage=MLPStage, reads_tokens=True)
