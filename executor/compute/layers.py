"""The built-in GPT's layers: plain torch.nn layers (their weight gradients are deferred to
W like any module's, by executor/compute/backward/split_backward.py) and seeded initialisation."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LayerNorm = nn.LayerNorm


def Linear(d_in: int, d_out: int, bias: bool = True) -> nn.Linear:
    """An nn.Linear left uninitialised (no draw from the global RNG): the model seeds it."""
    # on the default device: a model built under torch.device("meta") holds no memory
    return nn.utils.skip_init(nn.Linear, d_in, d_out, bias=bias,
                              device=torch.get_default_device())


class Embedding(nn.Module):
    """Token embedding plus learned absolute positions (parameters `tok`, `pos`)."""

    def __init__(self, vocab: int, max_len: int, d: int):
        super().__init__()
        self.tok = nn.Parameter(torch.empty(vocab, d))
        self.pos = nn.Parameter(torch.empty(max_len, d))

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.tok) + self.pos[: tokens.shape[-1]]


def normal_(t: Tensor, std: float, gen: torch.Generator) -> None:
    if t.is_meta:  # built for its names and shapes only (runtime/stage_state/shape.py)
        return
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * std)
