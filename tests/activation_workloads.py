"""Two-stage workloads whose stages exchange other activations than one float32
(micro_batch, seq_len, d_model) tensor (tests/test_activation_specs.py). Built only from
torch.nn layers, seeded per layer, so every replica and the reference build the same.

  odd:     stage 0 sends one float64 tensor of shape (b, T, 3 d)
  tuple:   stage 0 sends (hidden bf16 (b, T, d), positions int64 (b, T), keep bool (b, T))
  changes: stage 0's output shape depends on the micro-batch (refused: one spec per boundary)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from executor.compute.data import _seed
from executor.compute.model import ModelConfig, Workload


def _seeded(cfg: ModelConfig, key: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(cfg.seed, 0x7E57, key))
        return build()


def _args(args: tuple):
    """A tuple activation may come as one argument (the tuple) or spread over several."""
    return args[0] if len(args) == 1 else args


class OddFirst(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.inp = _seeded(cfg, 0, lambda: nn.Linear(d, 3 * d))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.inp(x)).double()


class OddLast(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.mix = _seeded(cfg, 1, lambda: nn.Linear(3 * d, d))
        self.head = _seeded(cfg, 2, lambda: nn.Sequential(nn.LayerNorm(d), nn.Linear(d, cfg.vocab)))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float64:
            raise TypeError(f"expected the float64 activation, got {x.dtype}")
        return self.head(F.gelu(self.mix(x.float())))


class TupleFirst(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inp = _seeded(cfg, 0, lambda: nn.Linear(cfg.d_model, cfg.d_model))

    def forward(self, x: Tensor):
        b, T, _ = x.shape
        h = torch.tanh(self.inp(x)).to(torch.bfloat16)
        pos = torch.arange(T).expand(b, T).contiguous()
        keep = x[..., 0] > -1.0  # data-dependent bool mask
        return h, pos, keep


class TupleLast(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.pos = _seeded(cfg, 1, lambda: nn.Embedding(cfg.seq_len, d))
        self.head = _seeded(cfg, 2, lambda: nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                                        nn.Linear(2 * d, cfg.vocab)))

    def forward(self, *args):
        h, pos, keep = _args(args)
        if (h.dtype, pos.dtype, keep.dtype) != (torch.bfloat16, torch.int64, torch.bool):
            raise TypeError(f"unexpected dtypes {h.dtype}, {pos.dtype}, {keep.dtype}")
        z = (h.float() + self.pos(pos)) * keep.unsqueeze(-1).float()
        return self.head(z)


class ChangingFirst(OddFirst):
    def forward(self, x: Tensor) -> Tensor:
        out = super().forward(x)
        # a stage whose output shape depends on the data: here, on the micro-batch index
        return out[:, :-1] if bool(x[0, 0, 0] > 0) else out


def microbatch(cfg: ModelConfig, iteration: int, g: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(_seed(cfg.seed, 0xDA7A, iteration, g))
    x = torch.randn(cfg.micro_batch_size, cfg.seq_len, cfg.d_model, generator=gen)
    return x, (x[..., :cfg.vocab] if cfg.vocab <= cfg.d_model else x).argmax(-1) % cfg.vocab


def loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)[:logits.numel() // logits.shape[-1]])


def _two(first, last):
    def build(cfg: ModelConfig, stage: int, stages: int) -> nn.Module:
        if stages != 2:
            raise ValueError("these test workloads have exactly 2 stages")
        return first(cfg) if stage == 0 else last(cfg)
    return Workload(build_stage=build, loss_fn=loss, microbatch=microbatch)


def odd() -> Workload:
    return _two(OddFirst, OddLast)


def tuple_() -> Workload:
    return _two(TupleFirst, TupleLast)


def changes() -> Workload:
    return _two(ChangingFirst, OddLast)


class _OwnGenerator(torch.nn.Module):
    """Draws from a generator of its own: randomness the runtime cannot key."""

    def __init__(self):
        super().__init__()
        self.gen = torch.Generator().manual_seed(1)

    def forward(self, x):
        return x + 0.01 * torch.rand(x.shape, generator=self.gen)


def own_generator(cfg):
    """`--model tests.activation_workloads:own_generator?split=0,1,2` (test_dropout.py)."""
    return torch.nn.Sequential(torch.nn.Embedding(cfg.vocab, cfg.d_model), _OwnGenerator(),
                               torch.nn.Linear(cfg.d_model, cfg.vocab))
