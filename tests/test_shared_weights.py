"""Deferred W with a parameter used several times in one stage (issue 22 item 1, first
half): an ALBERT-style Linear applied twice around a LayerNorm, an embedding tied to the
output head, a parameter on the trunk and in a side branch, a raw matrix used twice.
I then W (per micro-batch, and all I's first with the W's in another order, as the
scheduler defers them) must give plain autograd's parameter and input gradients, and I
plus W must do one plain backward's products (W re-runs nothing of I's trunk)."""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from executor.compute.model import lm_loss
from executor.compute.stage import StageCompute

torch.set_num_threads(1)
D, V, B, T = 8, 11, 2, 5
SCALE = 0.25
MBS = 4
DEFERRED = [2, 0, 3, 1]  # W order after all I's


class _Albert(nn.Module):
    """ALBERT-style reuse: `shared` applied twice with a LayerNorm and GELU between."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, D)

    def forward(self, h):
        y = self.shared(h)
        y = self.shared(F.gelu(self.norm(y)))
        return self.out(torch.tanh(y)) + h


class _TiedLM(nn.Module):
    """One stage holding both ends of a GPT-2-style model: head.weight is emb.weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.norm = nn.LayerNorm(D)
        self.mid = nn.Linear(D, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        h = self.emb(tokens)
        h = h + torch.tanh(self.mid(self.norm(h)))
        return self.head(h)


class _SideBranch(nn.Module):
    """`first.weight` on the trunk and, through a side branch of its own, scaling the
    output: the branch joins the trunk above the trunk's use."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(D, D)
        self.second = nn.Linear(D, D)

    def forward(self, h):
        scale = 1 + self.first.weight.pow(2).mean()
        return self.second(torch.tanh(self.first(h))) * scale


class _RawTwice(nn.Module):
    """A raw matrix multiplied in twice: its uses meet the trunk directly (no node private
    to the upper use), so W cannot take the upper use without the trunk: it goes to I."""

    def __init__(self):
        super().__init__()
        self.mat = nn.Parameter(torch.randn(D, D) / D ** 0.5)
        self.lin = nn.Linear(D, D)

    def forward(self, h):
        return self.lin(torch.tanh(torch.tanh(h @ self.mat) @ self.mat))


def _make(cls):
    torch.manual_seed(21)
    m = cls().double()
    return m, copy.deepcopy(m)


def _data(first: bool, last: bool, g: int):
    gen = torch.Generator().manual_seed(100 + g)
    x = torch.randint(0, V, (B, T), generator=gen) if first else \
        torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    tgt = torch.randint(0, V, (B, T), generator=gen) if last else None
    msg = None if last else torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    return x, tgt, msg


def _split(module, first, last, order):
    comp = StageCompute(module, first, last, SCALE, lm_loss)
    comp.split_first = True  # the tied model is a first stage: split it all the same
    gxs = {}
    for g in range(MBS):
        x, tgt, msg = _data(first, last, g)
        comp.forward(g, x, tgt)
        gxs[g] = comp.backward_input(g, msg)
        if order is None:
            comp.backward_weight(g)
    for g in order or []:
        comp.backward_weight(g)
    assert comp.pending() == []
    return comp, gxs


def _plain(module, first, last):
    gxs = {}
    for g in range(MBS):
        x, tgt, msg = _data(first, last, g)
        if not first:
            x = x.clone().requires_grad_(True)
        out = module(x)
        if last:
            (lm_loss(out, tgt) * SCALE).backward()
        else:
            torch.autograd.backward(out, msg)
        gxs[g] = None if first else x.grad
    return gxs


CASES = {"albert": (_Albert, False, False), "tied": (_TiedLM, True, True),
         "side": (_SideBranch, False, False), "raw": (_RawTwice, False, False)}


@pytest.mark.parametrize("order", [None, DEFERRED], ids=["i-then-w", "w-deferred"])
@pytest.mark.parametrize("case", list(CASES))
def test_shared_parameter_gradients_equal_plain_autograd(case, order):
    cls, first, last = CASES[case]
    module, ref = _make(cls)
    _, gxs = _split(module, first, last, order)
    want = _plain(ref, first, last)
    for g in range(MBS):
        if not first:
            torch.testing.assert_close(gxs[g], want[g], atol=1e-6, rtol=0, msg=f"{case} dx {g}")
    got, exp = dict(module.named_parameters()), dict(ref.named_parameters())
    assert got.keys() == exp.keys()
    for n in got:
        assert got[n].grad is not None, (case, n)
        torch.testing.assert_close(got[n].grad, exp[n].grad, atol=1e-6, rtol=0,
                                   msg=f"{case} {n}")


@pytest.mark.parametrize("case,deferred", [
    ("albert", ["shared.weight", "norm.weight", "norm.bias", "out.weight", "out.bias"]),
    ("tied", ["emb.weight", "norm.weight", "norm.bias", "mid.weight", "mid.bias"]),
    ("side", ["first.weight", "first.bias", "second.weight", "second.bias"]),
    ("raw", ["lin.weight", "lin.bias"])])
def test_shared_weights_are_deferred_and_w_reruns_nothing_of_i(case, deferred, caplog):
    """The weight products of every use wait for W; I + W do the FLOPs of one plain
    backward (a W that ran the trunk between two uses again would do more)."""
    cls, first, last = CASES[case]
    module, ref = _make(cls)
    comp = StageCompute(module, first, last, SCALE, lm_loss)
    comp.split_first = True  # the tied model is a first stage: split it all the same
    # micro-batch 1 first: the first W of a graph structure also runs its Linear and norm
    # groups through the engine, to check that the direct products give the same bits
    # (executor/compute/backward/direct_w.py); the FLOPs below are a later micro-batch's
    with caplog.at_level(logging.WARNING, logger="recycle.compute"):
        comp.forward(1, *_data(first, last, 1)[:2])
        comp.backward_input(1, _data(first, last, 1)[2])
    comp.backward_weight(1)
    comp.zero_grad()
    x, tgt, msg = _data(first, last, 0)
    comp.forward(0, x, tgt)
    with caplog.at_level(logging.WARNING, logger="recycle.compute"), \
            FlopCounterMode(display=False) as fi:
        comp.backward_input(0, msg)
    waiting = sorted(n for n, p in module.named_parameters() if p.grad is None)
    assert waiting == sorted(deferred)
    # what I took instead is reported, by name (a bias used twice: its uses join the
    # trunk directly, so the upper one has no node of its own that W could start from)
    stray = sorted(n for n, _ in module.named_parameters() if n not in deferred)
    lines = [r.getMessage() for r in caplog.records if "not deferred" in r.getMessage()]
    assert lines == ([f"weight gradient not deferred to W (computed in I): {', '.join(stray)}"]
                     if stray else [])
    with FlopCounterMode(display=False) as fw:
        comp.backward_weight(0)
    if not first:
        x = x.clone().requires_grad_(True)
    with FlopCounterMode(display=False) as fb:
        out = ref(x)
    with FlopCounterMode(display=False) as fb:
        if last:
            (lm_loss(out, tgt) * SCALE).backward()
        else:
            torch.autograd.backward(out, msg)
    assert fi.get_total_flops() + fw.get_total_flops() == fb.get_total_flops()
    for (n, p), q in zip(module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=0, msg=n)


def test_shared_weight_under_bf16_autocast():
    """Autocast casts a shared fp32 weight once (cached) for both uses: one cast node
    under the two uses' own transposes. Within bf16's rounding of plain fp32 autograd."""
    torch.manual_seed(22)
    module = _Albert()
    ref = copy.deepcopy(module)
    comp = StageCompute(module, False, False, 1.0, precision="bf16")
    gen = torch.Generator().manual_seed(9)
    xs = [torch.randn(B, T, D, generator=gen) for _ in range(3)]
    msgs = [torch.randn(B, T, D, generator=gen) for _ in range(3)]
    for g, (x, m) in enumerate(zip(xs, msgs)):
        comp.forward(g, x)
        comp.backward_input(g, m.to(torch.bfloat16))
    for g in (1, 2, 0):
        comp.backward_weight(g)
    for x, m in zip(xs, msgs):
        torch.autograd.backward(ref(x), m)
    for (n, p), q in zip(module.named_parameters(), ref.parameters()):
        err = (p.grad - q.grad).norm() / q.grad.norm().clamp_min(1e-12)
        assert err < 0.05, (n, float(err))


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_models_without_shared_weights_keep_one_plain_call_per_group(family, monkeypatch):
    """The common case is untouched: no group of the GPT or Llama stages needs a first
    hop, and W makes one engine call per group."""
    from executor.compute.backward import split_backward
    from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig
    from executor.models import llama
    from executor.models.flavours import LLAMA
    wl = DEFAULT_WORKLOAD if family == "gpt" else llama.workload()
    cfg = ModelConfig(n_layers=2) if family == "gpt" else \
        ModelConfig(**LLAMA["debug"].shape(), micro_batch_size=2)
    calls = []
    real = split_backward._grad
    monkeypatch.setattr(split_backward, "_grad", lambda *a: calls.append(1) or real(*a))
    x, tgt = wl.microbatch(cfg, 0, 0)
    comps = [StageCompute(wl.build_stage(cfg, s, 2), s == 0, s == 1, 1.0, wl.loss_fn)
             for s in range(2)]
    comps[0].split_first = True
    for c in comps:
        x = c.forward(0, x, tgt if c.is_last else None)
    grad = None
    for c in reversed(comps):
        grad = c.backward_input(0, grad)
        groups = list(c._after_i[0][0].groups)  # W empties the list
        assert groups and all(grp.kids is None for grp in groups)
        calls.clear()
        c.backward_weight(0)
        assert len(calls) == len(groups)
