"""Deferred W for any autograd graph (executor/compute/backward/split_backward.py via StageCompute):
gradients equal plain autograd's, I carries no weight-gradient product and W nothing else,
tuple / any-dtype activations, parameters that cannot be deferred, memory held I -> W."""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from examples import mlp_workload
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig, Workload, lm_loss
from executor.compute.stage import StageCompute

torch.set_num_threads(1)
CFG = ModelConfig(n_layers=4)
MLP = mlp_workload.workload()
SCALE = 0.5


def _stages(wl: Workload, stages: int, cfg=CFG, precision="fp32"):
    parts = [wl.build_stage(cfg, s, stages) for s in range(stages)]
    comps = [StageCompute(m, s == 0, s == stages - 1, SCALE, wl.loss_fn, precision=precision)
             for s, m in enumerate(parts)]
    comps[0].split_first = True  # these tests split every stage (StageCompute.split_first)
    return parts, comps


def _forward(comps, x, tgt, g=0):
    for c in comps:
        x = c.forward(g, x, tgt if c.is_last else None)
    return x


def _plain_grads(wl: Workload, stages: int, x, tgt, cfg=CFG):
    """Plain autograd through the same stages chained in one graph."""
    parts = [wl.build_stage(cfg, s, stages) for s in range(stages)]
    h = x
    for m in parts:
        h = m(*h) if isinstance(h, tuple) else m(h)
    (wl.loss_fn(h, tgt) * SCALE).backward()
    return [{n: p.grad for n, p in m.named_parameters()} for m in parts]


@pytest.mark.parametrize("name,wl", [("mlp", MLP), ("gpt", DEFAULT_WORKLOAD)])
def test_f_i_w_gradients_equal_plain_autograd(name, wl):
    parts, comps = _stages(wl, 3)
    x, tgt = wl.microbatch(CFG, 0, 1)
    _forward(comps, x, tgt)
    grad = None
    for c in reversed(comps):
        grad = c.backward_input(0, grad)
        # I computed no weight gradient: every parameter of these nn models is deferred
        assert all(p.grad is None for p in c.module.parameters()), name
    assert grad is None  # the first stage sends nothing back
    for c in comps:
        c.backward_weight(0)
        assert c.pending() == []
        assert all(p.grad is not None for p in c.module.parameters()), name
    ref = _plain_grads(wl, 3, x, tgt)
    for m, want in zip(parts, ref):
        for n, p in m.named_parameters():
            torch.testing.assert_close(p.grad, want[n], atol=1e-6, rtol=0, msg=f"{name} {n}")


def _linear_flops(module: nn.Module, rows: int) -> int:
    """FLOPs of one gradient product (weight's, or input's) summed over the nn.Linears."""
    return sum(2 * rows * m.in_features * m.out_features for m in module.modules()
               if isinstance(m, nn.Linear))


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_flops_w_carries_the_weight_products_and_i_plus_w_is_one_backward(stage):
    wl, stages = MLP, 3
    x, tgt = wl.microbatch(CFG, 0, 0)
    with torch.no_grad():
        for s in range(stage):
            x = wl.build_stage(CFG, s, stages)(x)
    module = wl.build_stage(CFG, stage, stages)
    last = stage == stages - 1
    comp = StageCompute(module, stage == 0, last, 1.0, wl.loss_fn)
    comp.split_first = True  # the first stage split too (StageCompute.split_first)
    out = comp.forward(0, x, tgt)
    grad = None if last else torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    # the first W of a graph structure also runs its Linear groups through the engine, to
    # check that the direct products give the same bits (direct_w): count a later one's
    comp.backward_input(0, grad)
    comp.backward_weight(0)
    comp.zero_grad()
    comp.forward(0, x, tgt)
    with FlopCounterMode(display=False) as fi:
        comp.backward_input(0, grad)
    with FlopCounterMode(display=False) as fw:
        comp.backward_weight(0)
    # one plain backward of the same stage, the same input-gradient needs
    xin = x if stage == 0 else x.detach().requires_grad_(True)
    y = module(xin)
    root = wl.loss_fn(y, tgt) if last else y
    with FlopCounterMode(display=False) as fb:
        torch.autograd.backward(root, grad)
    rows = CFG.micro_batch_size * CFG.seq_len
    weight_products = _linear_flops(module, rows)
    first_layer = 2 * rows * CFG.d_model * CFG.d_model if stage == 0 else 0  # no dx for data
    i, w, b = fi.get_total_flops(), fw.get_total_flops(), fb.get_total_flops()
    assert w == weight_products, (w, weight_products)
    assert i == weight_products - first_layer, (i, weight_products, first_layer)
    assert i + w == b, (i, w, b)
    # fused B does exactly one plain backward's products (no gradient for the data either)
    comp.forward(1, x, tgt)
    with FlopCounterMode(display=False) as ff:
        comp.backward_full(1, grad)
    assert ff.get_total_flops() == b, (ff.get_total_flops(), b)
    comp.split = False  # and so does B under a fused plan, whose F marks no trunk
    comp.forward(2, x, tgt)
    with FlopCounterMode(display=False) as ff:
        comp.backward_full(2, grad)
    assert ff.get_total_flops() == b, (ff.get_total_flops(), b)


class _TupleFirst(nn.Module):
    """Sends (hidden float32, positions int64, keep bool, scale float64 with no grad)."""

    def __init__(self, d: int):
        super().__init__()
        torch.manual_seed(11)
        self.emb = nn.Embedding(CFG.vocab, d)
        self.lin = nn.Linear(d, d)

    def forward(self, tokens: Tensor):
        h = torch.tanh(self.lin(self.emb(tokens)))
        b, T = tokens.shape
        pos = torch.arange(T).expand(b, T).contiguous()
        keep = tokens % 5 != 0
        scale = (tokens.double() + 1).reciprocal()  # floating, but needs no gradient
        return h, pos, keep, scale


class _TupleLast(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        torch.manual_seed(12)
        self.pos = nn.Embedding(CFG.seq_len, d)
        self.norm = nn.RMSNorm(d)
        self.conv = nn.Conv1d(d, d, 3, padding=1)
        self.head = nn.Linear(d, CFG.vocab)

    def forward(self, h, pos, keep, scale):
        z = self.norm(h + self.pos(pos)) * keep.unsqueeze(-1) * scale.unsqueeze(-1).float()
        z = z + self.conv(z.transpose(1, 2)).transpose(1, 2)
        return self.head(z)


def _tuple_workload():
    build = lambda cfg, s, n: _TupleFirst(cfg.d_model) if s == 0 else _TupleLast(cfg.d_model)
    return Workload(build_stage=build)


def test_tuple_activation_any_dtype():
    wl = _tuple_workload()
    parts, comps = _stages(wl, 2)
    tok, tgt = wl.microbatch(CFG, 0, 0)
    act = comps[0].forward(0, tok)
    assert isinstance(act, tuple) and [t.dtype for t in act] == [
        torch.float32, torch.int64, torch.bool, torch.float64]
    assert not any(t.requires_grad for t in act)
    comps[1].forward(0, act, tgt)
    msg = comps[1].backward_input(0)
    # the gradient message: one gradient per floating tensor, in order, in its dtype
    assert isinstance(msg, tuple) and [t.dtype for t in msg] == [torch.float32, torch.float64]
    assert msg[0].shape == act[0].shape and msg[1].shape == act[3].shape
    assert comps[0].backward_input(0, msg) is None
    for c in comps:
        assert all(p.grad is None for p in c.module.parameters())
        c.backward_weight(0)
    ref = _plain_grads(wl, 2, tok, tgt)
    for m, want in zip(parts, ref):
        for n, p in m.named_parameters():
            torch.testing.assert_close(p.grad, want[n], atol=1e-6, rtol=0, msg=n)
    # B (fused) takes the same message and gives the same gradients
    parts_b, comps_b = _stages(wl, 2)
    comps_b[1].forward(0, comps_b[0].forward(0, tok), tgt)
    comps_b[0].backward_full(0, comps_b[1].backward_full(0))
    for ma, mb in zip(parts, parts_b):
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            torch.testing.assert_close(pa.grad, pb.grad, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="2 floating"):
        comps_b[0].forward(1, tok)
        comps_b[0].backward_input(1, msg[0])  # one gradient for two floating tensors


class _WithStray(nn.Module):
    """A stage that also sends a tensor made of a parameter alone (`offset`): its gradient
    reaches the parameter through no trunk node, so W cannot take it."""

    def __init__(self, d: int):
        super().__init__()
        torch.manual_seed(13)
        self.lin = nn.Linear(d, d)
        self.offset = nn.Parameter(torch.randn(d))

    def forward(self, h):
        return self.lin(h) + self.offset, self.offset * 2


def test_parameter_that_cannot_be_deferred_is_reported_once(caplog):
    module = _WithStray(CFG.d_model)
    comp = StageCompute(module, False, False, 1.0)
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(CFG.micro_batch_size, CFG.seq_len, CFG.d_model, generator=gen)
    grads = (torch.randn(h.shape, generator=gen), torch.randn(CFG.d_model, generator=gen))
    with caplog.at_level(logging.WARNING, logger="recycle.compute"):
        for g in range(3):
            comp.forward(g, h)
            gh = comp.backward_input(g, grads)  # the input is one Tensor: so is its message
            if g == 0:  # offset's gradient came in I, lin's waits for W
                assert module.offset.grad is not None and module.lin.weight.grad is None
            comp.backward_weight(g)
    lines = [r.getMessage() for r in caplog.records if "not deferred" in r.getMessage()]
    assert lines == ["weight gradient not deferred to W (computed in I): offset"]
    ref = _WithStray(CFG.d_model)
    x = h.clone().requires_grad_(True)
    for _ in range(3):
        torch.autograd.backward(ref(x), grads)
    for a, b in zip(module.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(gh * 3, x.grad, atol=1e-6, rtol=0)


def test_bf16_activations_and_gradients_flow_in_bf16():
    parts, comps = _stages(MLP, 2, precision="bf16")
    x, tgt = MLP.microbatch(CFG, 0, 0)
    act = comps[0].forward(0, x)
    assert act.dtype == torch.bfloat16
    comps[1].forward(0, act, tgt)
    msg = comps[1].backward_input(0)
    assert msg.dtype == torch.bfloat16 and msg.shape == act.shape
    comps[0].backward_input(0, msg)
    for c in comps:
        c.backward_weight(0)
    # fp32 master weights get fp32 gradients; bf16 is within its rounding of fp32's
    ref = _plain_grads(MLP, 2, x, tgt)
    for m, want in zip(parts, ref):
        for n, p in m.named_parameters():
            assert p.grad.dtype == torch.float32
            err = (p.grad - want[n]).norm() / want[n].norm().clamp_min(1e-12)
            assert err < 0.05, (n, float(err))


def test_held_bytes_from_i_to_w():
    module = MLP.build_stage(CFG, 1, 3)
    comp = StageCompute(module, False, False, 1.0, track_memory=True)
    x = torch.randn(CFG.micro_batch_size, CFG.seq_len, CFG.d_model)
    out = comp.forward(0, x)
    after_f = comp.held_bytes(0)
    saved = comp._after_f[0].ledger.saved_bytes()
    assert after_f == saved > 0
    comp.backward_input(0, torch.ones_like(out))
    between = comp.held_bytes(0)
    ledger = comp._after_i[0][1]
    assert between > 0 and ledger.alive_bytes() <= saved
    comp.backward_weight(0)
    assert comp.held_bytes(0) == 0 and comp.pending() == []
    # W done: the graph is gone, and with it what F saved (x is still ours: its bytes stay)
    assert ledger.alive_bytes() <= x.untyped_storage().nbytes()


class _Branchy(nn.Module):
    """Takes a different path (and so a different autograd graph) on odd micro-batches."""

    def __init__(self, d: int):
        super().__init__()
        torch.manual_seed(14)
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)
        self.odd = False

    def forward(self, h):
        h = torch.tanh(self.a(h))
        return self.b(h) + h if self.odd else h


def test_graph_analysis_is_reused_until_the_structure_changes():
    module, ref = _Branchy(CFG.d_model), _Branchy(CFG.d_model)
    comp = StageCompute(module, False, False, 1.0)
    gen = torch.Generator().manual_seed(6)
    for g, odd in enumerate([False, False, True, True, False]):
        module.odd = ref.odd = odd
        h = torch.randn(CFG.micro_batch_size, CFG.seq_len, CFG.d_model, generator=gen)
        grad = torch.randn(h.shape, generator=gen)
        comp.forward(g, h)
        comp.backward_input(g, grad)
        comp.backward_weight(g)
        torch.autograd.backward(ref(h), grad)
    assert comp._plans.analyses == 3  # even, odd, even again: one analysis per change
    for a, b in zip(module.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


class _PassThrough(nn.Module):
    """Adds a parameter of the activation's own shape: autograd hands the received gradient
    to it unchanged."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(CFG.micro_batch_size, CFG.seq_len, CFG.d_model))

    def forward(self, h):
        return h + self.bias


@pytest.mark.parametrize("split", [True, False])
def test_parameter_gradient_does_not_alias_the_received_gradient(split):
    comp = StageCompute(_PassThrough(), False, False, 1.0)
    h = torch.randn(CFG.micro_batch_size, CFG.seq_len, CFG.d_model)
    msg = torch.randn(h.shape)
    comp.forward(0, h)
    if split:
        comp.backward_input(0, msg)
        comp.backward_weight(0)
    else:
        comp.backward_full(0, msg)
    want = msg.clone()
    msg.zero_()  # the runtime may reuse its receive buffer for the next micro-batch
    torch.testing.assert_close(comp.module.bias.grad, want, atol=0, rtol=0)


class _Siblings(nn.Module):
    """Llama-style parallel projections: q, k, v of one input; SwiGLU's w1 and w3."""

    def __init__(self, d: int):
        super().__init__()
        torch.manual_seed(15)
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3, self.w2 = (nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False),
                                     nn.Linear(2 * d, d, bias=False))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.wo(torch.tanh(self.wq(h) * self.wk(h)) + self.wv(h))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def test_sibling_projections_share_one_w_call():
    module, ref = _Siblings(CFG.d_model), _Siblings(CFG.d_model)
    comp = StageCompute(module, False, False, 1.0)
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(CFG.micro_batch_size, CFG.seq_len, CFG.d_model, generator=gen)
    grad = torch.randn(h.shape, generator=gen)
    comp.forward(0, h)  # a first micro-batch: its W also checks direct_w against the engine
    comp.backward_input(0, grad)
    comp.backward_weight(0)
    comp.zero_grad()
    comp.forward(0, h)
    with FlopCounterMode(display=False) as fi:
        gx = comp.backward_input(0, grad)
    calls = [sorted(n for n, p in module.named_parameters() if any(p is q for q in grp.params))
             for grp in comp._after_i[0][0].groups]
    assert sorted(calls) == sorted([["norm1.weight"], ["wk.weight", "wq.weight", "wv.weight"],
                                    ["wo.weight"], ["norm2.weight"], ["w1.weight", "w3.weight"],
                                    ["w2.weight"]])
    with FlopCounterMode(display=False) as fw:
        comp.backward_weight(0)
    x = h.clone().requires_grad_(True)
    y = ref(x)
    with FlopCounterMode(display=False) as fb:
        torch.autograd.backward(y, grad)
    # merged calls re-run nothing of I: together they do one plain backward's products
    assert fi.get_total_flops() + fw.get_total_flops() == fb.get_total_flops()
    torch.testing.assert_close(gx, x.grad, atol=1e-6, rtol=0)
    for a, b in zip(module.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


class _RawIds(nn.Module):
    """A first stage that indexes its own table with the ids: no submodule sees them."""

    def __init__(self, d: int):
        super().__init__()
        torch.manual_seed(16)
        self.table = nn.Parameter(torch.randn(CFG.vocab, d))
        self.proj = nn.Parameter(torch.randn(d, d) / d ** 0.5)

    def forward(self, tokens):
        return torch.tanh(self.table[tokens] @ self.proj)


def test_first_stage_whose_ids_enter_no_module_defers_everything_to_w():
    module, ref = _RawIds(CFG.d_model), _RawIds(CFG.d_model)
    comp = StageCompute(module, True, False, 1.0)
    tok, _ = DEFAULT_WORKLOAD.microbatch(CFG, 0, 0)
    out = comp.forward(0, tok)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
    with FlopCounterMode(display=False) as fi:
        assert comp.backward_input(0, grad) is None
    assert fi.get_total_flops() == 0 and all(p.grad is None for p in module.parameters())
    comp.backward_weight(0)
    torch.autograd.backward(ref(tok), grad)
    for a, b in zip(module.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


class _Detached(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h):
        return self.lin(h).detach()  # sends a tensor that needs no gradient


def test_stage_whose_output_needs_no_gradient():
    comp = StageCompute(_Detached(CFG.d_model), False, False, 1.0)
    h = torch.randn(CFG.micro_batch_size, CFG.seq_len, CFG.d_model)
    out = comp.forward(0, h)
    torch.testing.assert_close(comp.backward_input(0, torch.ones_like(out)), torch.zeros_like(h))
    comp.backward_weight(0)
    assert comp.pending() == [] and comp.module.lin.weight.grad is None


def test_fused_mode_skips_the_trunk_hook_and_refuses_i():
    """Under a plan of fused B (StageCompute.split = False) F installs no global module
    hook (it slowed every module call of the first stage) and B's gradients are unchanged."""
    x, tgt = DEFAULT_WORKLOAD.microbatch(CFG, 0, 0)
    want = _plain_grads(DEFAULT_WORKLOAD, 2, x, tgt)
    parts, comps = _stages(DEFAULT_WORKLOAD, 2)
    for c in comps:
        c.split = False
    hooks = []
    real = nn.modules.module.register_module_forward_hook
    nn.modules.module.register_module_forward_hook = lambda h: hooks.append(h) or real(h)
    try:
        _forward(comps, x, tgt)
    finally:
        nn.modules.module.register_module_forward_hook = real
    assert not hooks
    gx = comps[1].backward_full(0)
    comps[0].backward_full(0, gx)
    for m, w in zip(parts, want):
        for n, p in m.named_parameters():
            assert torch.allclose(p.grad, w[n], atol=1e-6), n
    _forward(comps, x, tgt, g=1)
    with pytest.raises(RuntimeError, match="fused backward"):
        comps[1].backward_input(1)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_first_stage_leaves_its_whole_backward_to_w(family):
    """By default the first stage's I does nothing (it sends no gradient, nothing waits for
    it) and its W is one plain backward: the FLOPs and gradients of fused B, all of it
    deferrable; shared weights there (a tied embedding) need no analysis."""
    from executor.models import llama
    from executor.models.flavours import LLAMA
    wl = DEFAULT_WORKLOAD if family == "gpt" else llama.workload()
    cfg = CFG if family == "gpt" else ModelConfig(**LLAMA["debug"].shape(), micro_batch_size=2)
    tok, _ = wl.microbatch(cfg, 0, 0)
    module = wl.build_stage(cfg, 0, 2)
    ref = copy.deepcopy(module)
    comp = StageCompute(module, True, False, 1.0, wl.loss_fn)
    out = comp.forward(0, tok)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    with FlopCounterMode(display=False) as fi:
        assert comp.backward_input(0, grad) is None
    assert fi.get_total_flops() == 0 and all(p.grad is None for p in module.parameters())
    assert comp.pending() == [0]
    with FlopCounterMode(display=False) as fw:
        comp.backward_weight(0)
    y = ref(tok)
    with FlopCounterMode(display=False) as fb:
        torch.autograd.backward(y, grad)
    assert fw.get_total_flops() == fb.get_total_flops() and comp.pending() == []
    for (n, a), b in zip(module.named_parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad), n
