"""W without the engine for Linear and norm groups (executor/compute/backward/direct_w.py): used
only where the first micro-batch of a graph structure proved it bit-identical to the
engine, and then bit-identical on later micro-batches too."""
from __future__ import annotations

import copy

import torch

from benchmarks.executor_bench import bench_config
from executor.compute.stage import StageCompute
from executor.inputs.workload_name import load_workload

torch.set_num_threads(1)


def _run(comp, xs, ys, grad, engine_only=False):
    for g, (x, y) in enumerate(zip(xs, ys)):
        comp.forward(g, x, y)
        comp.backward_input(g, grad)
        if engine_only:
            plan = comp._plans._plan
            plan.direct = [False] * len(plan.groups)
    for g in reversed(range(len(xs))):  # W deferred, in another order
        comp.backward_weight(g)
    return [p.grad for p in comp.module.parameters()]


def test_llama_stages_take_the_direct_way_with_the_engines_bits():
    cfg, wl = bench_config("llama:debug"), load_workload("llama:debug")
    for stage in (0, 1):
        first, last = stage == 0, stage == 1
        mbs = [wl.microbatch(cfg, 0, g) for g in range(3)]
        xs = [m[0] for m in mbs]
        if not first:
            with torch.no_grad():
                xs = [wl.build_stage(cfg, 0, 2)(x) for x in xs]
        ys = [m[1] for m in mbs] if last else [None] * 3
        grad = None if last else torch.randn(cfg.micro_batch_size, cfg.seq_len, cfg.d_model,
                                             generator=torch.Generator().manual_seed(5))
        module = wl.build_stage(cfg, stage, 2)
        direct = StageCompute(module, first, last, 1 / 3, wl.loss_fn)
        engine = StageCompute(copy.deepcopy(module), first, last, 1 / 3, wl.loss_fn)
        direct.split_first = engine.split_first = True  # stage 0 split too
        got = _run(direct, xs, ys, grad)
        want = _run(engine, xs, ys, grad, engine_only=True)
        recipes = direct._plans._plan.direct
        kinds = {k for r in recipes if r for k, _ in r}
        assert kinds == {"MmBackward0", "MulBackward0"}, recipes  # Linears and RMSNorms
        assert sum(1 for r in recipes if r) >= len(recipes) - 1  # (stage 0: the embedding)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        # and plain autograd agrees
        ref = copy.deepcopy(module)
        for p in ref.parameters():
            p.grad = None
        for x, y in zip(xs, ys):
            xin = x if first else x.detach().requires_grad_(True)
            out = ref(xin)
            if last:
                (wl.loss_fn(out, y) / 3).backward()
            else:
                out.backward(grad)
        for a, b in zip(got, ref.parameters()):
            torch.testing.assert_close(a, b.grad, atol=1e-6, rtol=1e-5)


def test_linear_with_bias_and_a_raw_weight_broadcast():
    """addmm (Linear with bias), a LayerNorm's affine parameters and a mul by a broadcast
    raw parameter take the direct way; a parameter beside the trunk still gets its
    gradient in I; all equal to autograd."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(6, 6)
            self.norm = torch.nn.LayerNorm(6)
            self.scale = torch.nn.Parameter(torch.randn(1, 6))
            self.b = torch.nn.Linear(6, 6)
            self.odd = torch.nn.Parameter(torch.randn(6))

        def forward(self, x):
            h = self.b(torch.tanh(self.norm(self.a(x.reshape(-1, 6)))) * self.scale)
            return h + torch.nn.functional.gelu(self.odd)

    torch.manual_seed(3)
    m = M()
    ref = copy.deepcopy(m)
    comp = StageCompute(m, False, False, 1.0)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 6, generator=gen) for _ in range(3)]
    grad = torch.randn(4, 6, generator=gen)
    for g, x in enumerate(xs):
        comp.forward(g, x)
        comp.backward_input(g, grad)
    for g in range(3):
        comp.backward_weight(g)
    kinds = sorted(k for r in comp._plans._plan.direct if r for k, _ in r)
    assert kinds == ["AddmmBackward0", "AddmmBackward0", "MulBackward0",
                     "NativeLayerNormBackward0"]
    for x in xs:
        ref(x.clone().requires_grad_(True)).backward(grad)
    for (n, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=n)
