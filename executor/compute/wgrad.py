"""Deferred weight gradients: zero-bubble's `W` without a second backward.

Every parameterised layer of the stage models comes from here. Outside `deferring(store)`
they run the native ops (plain autograd, used by the reference and by users who do not
split). Inside it they run an autograd Function whose backward computes ONLY the
gradient w.r.t. its input and appends a closure (parameter, input, grad_output) to the
store. `W` then runs the store: one weight-gradient product per layer and nothing of
`I`'s work again. Parameters of other layers (a user's own nn.Linear) still get their
gradient during `I` from ordinary autograd: correct, just not deferred.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

WeightGradStore = list  # list of zero-argument closures, run in order by `W`
_STORE: ContextVar[Optional[WeightGradStore]] = ContextVar("recycle_wgrad_store", default=None)


@contextmanager
def deferring(store: WeightGradStore) -> Iterator[WeightGradStore]:
    """Layers built here and called inside this block defer their weight gradients into
    `store` (the graph records the store, so the later backward fills it)."""
    token = _STORE.set(store)
    try:
        yield store
    finally:
        _STORE.reset(token)


def accumulate(param: Tensor, grad: Tensor) -> None:
    """Same rule as autograd's AccumulateGrad: first gradient is taken, later ones added."""
    if param.grad is None:
        param.grad = grad.detach().contiguous()
    else:
        param.grad.add_(grad)


def run_store(store: WeightGradStore) -> None:
    for fn in store:
        fn()
    store.clear()


# ---- Linear ----------------------------------------------------------------------------
def _linear_w(weight: Tensor, bias: Optional[Tensor], x: Tensor, go: Tensor) -> None:
    go2 = go.reshape(-1, go.shape[-1])
    accumulate(weight, go2.t().mm(x.reshape(-1, x.shape[-1])))
    if bias is not None:
        accumulate(bias, go2.sum(0))


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.store = bias, store
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, go):
        x, weight = ctx.saved_tensors
        ctx.store.append(lambda w=weight, b=ctx.bias, x=x, go=go: _linear_w(w, b, x, go))
        gx = go.matmul(weight) if ctx.needs_input_grad[0] else None
        return gx, None, None, None


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.bias = nn.Parameter(torch.empty(d_out)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        store = _STORE.get()
        if store is None:
            return F.linear(x, self.weight, self.bias)
        return _LinearFn.apply(x, self.weight, self.bias, store)


# ---- LayerNorm: normalise with native autograd, defer only the affine part -------------
def _affine_w(weight: Tensor, bias: Tensor, xhat: Tensor, go: Tensor) -> None:
    d = go.shape[-1]
    accumulate(weight, (go * xhat).reshape(-1, d).sum(0))
    accumulate(bias, go.reshape(-1, d).sum(0))


class _AffineFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xhat, weight, bias, store):
        ctx.save_for_backward(xhat, weight)
        ctx.bias, ctx.store = bias, store
        return torch.addcmul(bias, xhat, weight)

    @staticmethod
    def backward(ctx, go):
        xhat, weight = ctx.saved_tensors
        ctx.store.append(lambda w=weight, b=ctx.bias, xh=xhat, go=go: _affine_w(w, b, xh, go))
        return go * weight, None, None, None


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        store = _STORE.get()
        shape = (x.shape[-1],)
        if store is None:
            return F.layer_norm(x, shape, self.weight, self.bias, self.eps)
        return _AffineFn.apply(F.layer_norm(x, shape, None, None, self.eps),
                               self.weight, self.bias, store)


# ---- Token + position embedding (first stage: no input gradient at all) ----------------
def _embed_w(tok: Tensor, pos: Tensor, tokens: Tensor, go: Tensor) -> None:
    d, T = go.shape[-1], tokens.shape[-1]
    gt = torch.zeros_like(tok).index_add_(0, tokens.reshape(-1), go.reshape(-1, d))
    gp = torch.zeros_like(pos)
    gp[:T] = go.reshape(-1, T, d).sum(0)
    accumulate(tok, gt)
    accumulate(pos, gp)


class _EmbedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, tok, pos, store):
        ctx.save_for_backward(tokens)
        ctx.params, ctx.store = (tok, pos), store
        return F.embedding(tokens, tok) + pos[: tokens.shape[-1]]

    @staticmethod
    def backward(ctx, go):
        (tokens,) = ctx.saved_tensors
        tok, pos = ctx.params
        ctx.store.append(lambda t=tok, p=pos, ids=tokens, go=go: _embed_w(t, p, ids, go))
        return None, None, None, None


class Embedding(nn.Module):
    """Token embedding plus learned absolute positions."""

    def __init__(self, vocab: int, max_len: int, d: int):
        super().__init__()
        self.tok = nn.Parameter(torch.empty(vocab, d))
        self.pos = nn.Parameter(torch.empty(max_len, d))

    def forward(self, tokens: Tensor) -> Tensor:
        store = _STORE.get()
        if store is None:
            return F.embedding(tokens, self.tok) + self.pos[: tokens.shape[-1]]
        return _EmbedFn.apply(tokens, self.tok, self.pos, store)


DEFERRED_LAYERS = (Linear, LayerNorm, Embedding)


def deferred_params(module: nn.Module) -> set[int]:
    """ids of parameters whose gradients `W` computes (the rest get theirs during `I`)."""
    return {id(p) for m in module.modules() if isinstance(m, DEFERRED_LAYERS)
            for p in m.parameters(recurse=False)}


def normal_(t: Tensor, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * std)



def store_bytes(store: WeightGradStore, exclude: set[int] = frozenset()) -> int:
    """Bytes a weight-gradient store keeps alive (distinct storages, parameters excluded):
    the part of a micro-batch's activation memory that lives from I to W."""
    seen, total = set(), 0
    for fn in store:
        for t in fn.__defaults__ or ():
            if isinstance(t, Tensor) and id(t) not in exclude:
                st = t.untyped_storage()
                if st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    total += st.nbytes()
    return total
