"""A small GPT-style decoder, split into pipeline stages, plus the user hook (`Workload`).

Stage 0 holds the embeddings, the last stage the final LayerNorm and the head; the
`n_layers` blocks are spread as evenly as possible, earlier stages taking the remainder
(the last stage already carries the head and the loss). `stages > n_layers` is allowed:
middle stages then hold no block and pass activations through unchanged, which keeps
large planner grids runnable with a tiny model.

Initialisation is per layer from a generator seeded by (seed, layer key), so every
replica and every split builds bit-identical parameters, and the stages concatenated equal
`build_full(cfg)` parameter for parameter (same names too: blocks keep global indices).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from executor.compute import data
from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.layers import Embedding, LayerNorm, Linear, normal_
from executor.compute.units import layer


def layer_range(n_layers: int, stage: int, stages: int,
                boundaries: Sequence[int] = ()) -> tuple[int, int]:
    """Blocks [lo, hi) of `stage`. boundaries (cfg.boundaries): the first block of stages
    1..S-1, non-decreasing in 0..n_layers (a stage may hold no block); empty: as even as
    possible, earlier stages taking the remainder. One stage holds every block."""
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} outside 0..{stages - 1}")
    if boundaries and stages > 1:
        edges = (0, *boundaries, n_layers)
        if len(boundaries) != stages - 1 or any(a > b for a, b in zip(edges, edges[1:])):
            raise ValueError(f"boundaries {list(boundaries)} do not split {n_layers} layers "
                             f"into {stages} stages (need {stages - 1} non-decreasing "
                             f"first layers in 0..{n_layers})")
        return edges[stage], edges[stage + 1]
    base, extra = divmod(n_layers, stages)
    lo = stage * base + min(stage, extra)
    return lo, lo + base + (1 if stage < extra else 0)


def _gen(seed: int, key: int) -> torch.Generator:
    return torch.Generator().manual_seed(data._seed(seed, 0x1A7E5, key))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x)). No q/k/v bias: the gradient of
    a key bias is zero up to rounding noise, which Adam would amplify into updates that
    differ between two exact-in-math runs."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.ln1, self.ln2 = LayerNorm(d), LayerNorm(d)
        self.qkv = Linear(d, 3 * d, bias=False)
        self.proj = Linear(d, d)
        self.fc1, self.fc2 = Linear(d, 4 * d), Linear(4 * d, d)
        gen = _gen(cfg.seed, layer + 1)
        resid_std = 0.02 / math.sqrt(2 * cfg.n_layers)  # GPT-2's scaled residual init
        for lin, std in ((self.qkv, 0.02), (self.proj, resid_std), (self.fc1, 0.02),
                         (self.fc2, resid_std)):
            normal_(lin.weight, std, gen)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        b, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda t: t.reshape(b, T, self.n_heads, d // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, T, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTStage(nn.Module):
    """One pipeline stage: tokens -> hidden (first), hidden -> hidden, hidden -> logits (last)."""

    def __init__(self, cfg: ModelConfig, stage: int, stages: int):
        super().__init__()
        self.stage, self.stages = stage, stages
        self.n_layers = cfg.n_layers
        lo, hi = layer_range(cfg.n_layers, stage, stages, cfg.boundaries)
        self.embed = None
        if stage == 0:
            self.embed = Embedding(cfg.vocab, cfg.seq_len, cfg.d_model)
            gen = _gen(cfg.seed, 0)
            normal_(self.embed.tok, 0.02, gen)
            normal_(self.embed.pos, 0.01, gen)
        # ModuleDict keyed by the global layer index: names match the unsplit model.
        self.blocks = nn.ModuleDict({str(i): Block(cfg, i) for i in range(lo, hi)})
        self.ln_f = self.head = None
        if stage == stages - 1:
            self.ln_f = LayerNorm(cfg.d_model)
            self.head = Linear(cfg.d_model, cfg.vocab)
            normal_(self.head.weight, 0.02, _gen(cfg.seed, cfg.n_layers + 1))
            nn.init.zeros_(self.head.bias)

    def forward(self, x: Tensor) -> Tensor:
        # layers numbered in the whole model (units.py): 0 the embedding, 1..L the blocks
        if self.embed is not None:
            x = layer(0, self.embed, x)
        for i, block in self.blocks.items():
            x = layer(int(i) + 1, block, x, block=int(i))
        if self.head is not None:
            x = layer(self.n_layers + 1, lambda h: self.head(self.ln_f(h)), x)
        return x


def build_stage(cfg: ModelConfig, stage: int, stages: int) -> nn.Module:
    return GPTStage(cfg, stage, stages)


def build_full(cfg: ModelConfig) -> nn.Module:
    """The unsplit model (S=1): what the stages concatenated must equal."""
    return GPTStage(cfg, 0, 1)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy of one micro-batch (unscaled)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(training: TrainingSettings, params: Iterable[Tensor]) -> torch.optim.Optimizer:
    # foreach=False: the same per-tensor kernels on every worker and in the reference.
    return torch.optim.AdamW(list(params), lr=training.lr, betas=training.betas,
                             weight_decay=training.weight_decay, foreach=False)


class StageFactory(Protocol):
    def __call__(self, cfg: ModelConfig, stage: int, stages: int) -> nn.Module: ...


@dataclass(frozen=True)
class Workload:
    """What to train: swap any callable to plug in your own model, loss or data.

    build_stage(cfg, stage, stages) must be deterministic (every replica builds the same
    parameters); loss_fn(last_stage_output, targets) returns the unscaled mean loss of a
    micro-batch; microbatch(cfg, iteration, g) -> (first-stage input, targets) must depend
    only on its arguments; make_optimizer(training, params) builds a stage's optimizer from
    the run's TrainingSettings (lr, betas, weight decay; the schedule sets the rate later). Any module's weight gradients are deferred to `W`
    (executor/compute/backward/split_backward.py); activations may be a Tensor or a tuple of them."""
    build_stage: StageFactory = build_stage
    loss_fn: Callable[[Tensor, Tensor], Tensor] = lm_loss
    microbatch: Callable[[ModelConfig, int, int], tuple[Tensor, Tensor]] = data.microbatch
    make_optimizer: Callable[[TrainingSettings, Iterable[Tensor]], torch.optim.Optimizer] = make_optimizer
    # The first stage takes LongTensor[b, seq_len] token ids and loss_fn next-token targets
    # of the same shape: `recycle train --data FILE` may then feed it a token file.
    reads_tokens: bool = False
    # build_stage cuts the model at cfg.boundaries (stages may hold any run of blocks): a
    # plan may then change the pipeline's shape at run time (runtime/stage_state/shape.py)
    reshapes: bool = False


DEFAULT_WORKLOAD = Workload(reads_tokens=True, reshapes=True)
