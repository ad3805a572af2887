"""A Llama-style decoder split into pipeline stages, made only of torch.nn layers and
functional ops (so the generic deferred-W split and torch's own tooling see plain modules).

RMSNorm (torch.nn.RMSNorm), rotary position embeddings (rotate-half form, theta 500000 as
Llama 3), SwiGLU MLP, grouped-query attention (n_kv_heads key/value heads shared by
n_heads query heads; F.scaled_dot_product_attention, causal), untied output head, no
biases. Parameter names follow Meta's/torchtitan's checkpoints (tok_embeddings,
layers.{i}.attention.wq, feed_forward.w1, norm, output).

Split like the GPT: stage 0 holds the embedding, the last stage the final norm and the
head; blocks are keyed by their GLOBAL index (executor.compute.model.layer_range, which
honours cfg.boundaries) and initialised from a generator seeded by (seed, layer), so every
replica, every split and the unsplit model build bit-identical parameters.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init

from executor.compute import data
from executor.compute.model import ModelConfig, Workload, layer_range
from executor.compute.units import layer

ROPE_THETA = 500_000.0
NORM_EPS = 1e-5
_INIT_KEY = 0x11A3A  # keeps llama's init streams apart from the GPT's


def ffn_width(cfg: ModelConfig) -> int:
    """cfg.ffn_hidden, or Llama's rule: 2/3 of 4*d, rounded up to a multiple of 64."""
    if cfg.ffn_hidden:
        return cfg.ffn_hidden
    return 64 * math.ceil(8 * cfg.d_model / 3 / 64)


def kv_heads(cfg: ModelConfig) -> int:
    return cfg.n_kv_heads or cfg.n_heads


def check_shape(cfg: ModelConfig) -> None:
    """One-line reasons for shapes this model cannot have."""
    if cfg.n_heads % kv_heads(cfg):
        raise ValueError(f"n_kv_heads={kv_heads(cfg)} must divide n_heads={cfg.n_heads}")
    if (cfg.d_model // cfg.n_heads) % 2:
        raise ValueError(f"head size d_model/n_heads = {cfg.d_model // cfg.n_heads} must be "
                         f"even (rotary embeddings rotate pairs)")


def _gen(cfg: ModelConfig, key: int) -> torch.Generator:
    return torch.Generator().manual_seed(data._seed(cfg.seed, _INIT_KEY, key))


def _normal(weight: Tensor, std: float, gen: torch.Generator) -> None:
    if weight.is_meta:  # shape-only construction (parameter counts of the big flavours)
        return
    with torch.no_grad():  # drawn on the CPU: the same bits whatever the device
        if weight.device.type == "cpu":
            weight.normal_(0.0, std, generator=gen)
        else:
            weight.copy_(torch.empty(weight.shape).normal_(0.0, std, generator=gen))


def _linear(n_in: int, n_out: int) -> nn.Linear:
    """A bias-free Linear left uninitialised (the caller draws it: skips torch's kaiming
    init, which cost as much again when building the big flavours)."""
    return skip_init(nn.Linear, n_in, n_out, bias=False, device=torch.get_default_device())


def rotary(seq_len: int, head_dim: int, device=None) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (seq_len, head_dim) for the rotate-half form."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=device) / head_dim))
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (b, heads, T, head_dim); rotates pairs (i, i + head_dim/2) by position angles."""
    T = x.shape[-2]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos[:T] + rotated * sin[:T]).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, self.n_heads, self.n_kv = cfg.d_model, cfg.n_heads, kv_heads(cfg)
        self.head_dim = d // cfg.n_heads
        self.wq = _linear(d, self.n_heads * self.head_dim)
        self.wk = _linear(d, self.n_kv * self.head_dim)
        self.wv = _linear(d, self.n_kv * self.head_dim)
        self.wo = _linear(self.n_heads * self.head_dim, d)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, T, _ = x.shape
        split = lambda t, h: t.view(b, T, h, self.head_dim).transpose(1, 2)
        q = apply_rotary(split(self.wq(x), self.n_heads), cos, sin)
        k = apply_rotary(split(self.wk(x), self.n_kv), cos, sin)
        v = split(self.wv(x), self.n_kv)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.n_kv != self.n_heads)
        return self.wo(y.transpose(1, 2).reshape(b, T, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h = cfg.d_model, ffn_width(cfg)
        self.w1 = _linear(d, h)
        self.w2 = _linear(h, d)
        self.w3 = _linear(d, h)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm: h = x + attention(norm(x)); out = h + feed_forward(norm(h))."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
        self.feed_forward = FeedForward(cfg)
        gen = _gen(cfg, layer + 1)
        resid = 0.02 / math.sqrt(2 * cfg.n_layers)  # scaled init of the residual outputs
        for lin, std in ((self.attention.wq, 0.02), (self.attention.wk, 0.02),
                         (self.attention.wv, 0.02), (self.attention.wo, resid),
                         (self.feed_forward.w1, 0.02), (self.feed_forward.w3, 0.02),
                         (self.feed_forward.w2, resid)):
            _normal(lin.weight, std, gen)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaStage(nn.Module):
    """One pipeline stage: tokens -> hidden (first), hidden -> hidden, hidden -> logits (last)."""

    def __init__(self, cfg: ModelConfig, stage: int, stages: int):
        super().__init__()
        check_shape(cfg)
        self.n_layers = cfg.n_layers
        lo, hi = layer_range(cfg.n_layers, stage, stages, cfg.boundaries)
        self.tok_embeddings = None
        if stage == 0:
            self.tok_embeddings = skip_init(nn.Embedding, cfg.vocab, cfg.d_model,
                                            device=torch.get_default_device())
            _normal(self.tok_embeddings.weight, 0.02, _gen(cfg, 0))
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(lo, hi)})
        self.norm = self.output = None
        if stage == stages - 1:
            self.norm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
            self.output = _linear(cfg.d_model, cfg.vocab)
            _normal(self.output.weight, 0.02, _gen(cfg, cfg.n_layers + 1))
        # Not parameters and not in the state dict: recomputed on every build and device.
        cos, sin = rotary(cfg.seq_len, cfg.d_model // cfg.n_heads)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        # layers numbered in the whole model (units.py): 0 the embedding, 1..L the blocks
        if self.tok_embeddings is not None:
            x = layer(0, self.tok_embeddings, x)
        cos, sin = self.rope_cos, self.rope_sin
        if x.shape[1] > cos.shape[0]:  # a longer sequence than cfg.seq_len: extend
            cos, sin = rotary(x.shape[1], cos.shape[1], device=x.device)
        for i, block in self.layers.items():
            x = layer(int(i) + 1, block, x, cos, sin, block=int(i))
        if self.output is not None:
            x = layer(self.n_layers + 1, lambda h: self.output(self.norm(h)), x)
        return x


def build_stage(cfg: ModelConfig, stage: int, stages: int) -> nn.Module:
    return LlamaStage(cfg, stage, stages)


def build_full(cfg: ModelConfig) -> nn.Module:
    """The unsplit model: what the stages concatenated must equal."""
    return LlamaStage(cfg, 0, 1)


def workload() -> Workload:
    """Llama with the GPT's loss, data and optimizer (next-token cross-entropy, AdamW)."""
    return Workload(build_stage=build_stage, reads_tokens=True, reshapes=True)
