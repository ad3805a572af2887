"""Synthetic training data: deterministic from (seed, iteration, g) alone.

The language is a fixed random sparse Markov chain: every token has `branching` possible
successors with random probabilities, so the best achievable loss is the chain's
entropy rate (about 0.8 nats here) against log(vocab) for a model that learned nothing.
Any worker can regenerate any micro-batch, which is what lets re-routed micro-batches and
re-run iterations (docs/design.md section 6) see exactly the same samples.
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from executor.compute.config import ModelConfig

BRANCHING = 3
_MASK = (1 << 63) - 1


def _seed(*parts: int) -> int:
    """Mix integers into one generator seed (stable across processes and runs)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = ((h ^ (p & _MASK)) * 0x100000001B3 + 0x632BE59BD9B4E019) & _MASK
    return h


@lru_cache(maxsize=16)
def _chain(seed: int, vocab: int, branching: int = BRANCHING) -> tuple[Tensor, Tensor]:
    """Per token, its `branching` successors and their cumulative probabilities."""
    gen = torch.Generator().manual_seed(_seed(seed, 0xDA7A))
    succ = torch.empty(vocab, branching, dtype=torch.long)
    cum = torch.empty(vocab, branching)
    for v in range(vocab):
        succ[v] = torch.randperm(vocab, generator=gen)[:branching]
        w = torch.rand(branching, generator=gen) + 0.2
        cum[v] = torch.cumsum(w / w.sum(), 0)
    cum[:, -1] = 1.0
    return succ, cum


def transition_matrix(seed: int, vocab: int, branching: int = BRANCHING) -> Tensor:
    """Row-stochastic [vocab, vocab] matrix with `branching` non-zeros per row."""
    succ, cum = _chain(seed, vocab, branching)
    probs = torch.zeros(vocab, vocab)
    step = torch.diff(cum, dim=1, prepend=torch.zeros(vocab, 1))
    probs.scatter_(1, succ, step)
    return probs


def entropy_rate(seed: int, vocab: int) -> float:
    """Best achievable loss (nats) under the chain's uniform start: a target for tests."""
    p = transition_matrix(seed, vocab)
    h = -(p * torch.log(p.clamp_min(1e-30))).sum(1)
    return float(h.mean())


def microbatch(cfg: "ModelConfig", iteration: int, g: int) -> tuple[Tensor, Tensor]:
    """(tokens, targets), both LongTensor[micro_batch_size, seq_len]; targets are tokens
    shifted by one. Depends only on (cfg.seed, cfg.vocab, shapes, iteration, g).
    Sampled by inverse CDF over each token's few successors, one uniform draw per
    position: ~1 ms, where per-step multinomial sampling cost as much as a stage's F."""
    b, T = cfg.micro_batch_size, cfg.seq_len
    succ, cum = _chain(cfg.seed, cfg.vocab)
    gen = torch.Generator().manual_seed(_seed(cfg.seed, iteration, g))
    seq = torch.empty(b, T + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(cfg.vocab, (b,), generator=gen)
    u = torch.rand(b, T, 1, generator=gen)
    last = succ.shape[1] - 1
    for t in range(T):
        row = seq[:, t]
        j = (u[:, t] > cum[row]).sum(1).clamp_(max=last)
        seq[:, t + 1] = succ[row, j]
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
