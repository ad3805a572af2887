"""Torch compute layer: stage split, I/W split, reference training, local plan execution."""
import math
from functools import lru_cache

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from executor.compute.data import microbatch
from executor.compute.one_process.local import run_plan_locally
from executor.compute.model import (ModelConfig, Workload, build_full, build_stage, layer_range,
                            lm_loss)
from executor.compute.measure.profile import profile
from executor.compute.one_process.reference import Summary, compare, train_reference
from executor.compute.stage import StageCompute
from planner.solvers.backends import solve
from planner.job import JobSpec
from planner.plan import Mode

torch.set_num_threads(1)
CFG = ModelConfig()


def test_config_and_data_are_deterministic():
    assert ModelConfig.from_dict(CFG.to_dict()) == CFG
    tok, tgt = microbatch(CFG, 3, 5)
    assert tok.shape == tgt.shape == (CFG.micro_batch_size, CFG.seq_len)
    assert tok.dtype == torch.long and torch.equal(tok[:, 1:], tgt[:, :-1])
    assert torch.equal(microbatch(CFG, 3, 5)[0], tok)
    assert not torch.equal(microbatch(CFG, 3, 6)[0], tok)
    assert not torch.equal(microbatch(CFG, 4, 5)[0], tok)


def test_layer_range_spreads_evenly():
    assert [layer_range(4, s, 3) for s in range(3)] == [(0, 2), (2, 3), (3, 4)]
    assert [layer_range(2, s, 4) for s in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


@pytest.mark.parametrize("stages", [1, 2, 3, 6])
def test_stages_concatenated_equal_full_model(stages):
    full = build_full(CFG)
    parts = [build_stage(CFG, s, stages) for s in range(stages)]
    split = [(n, p) for m in parts for n, p in m.named_parameters()]
    assert [n for n, _ in split] == [n for n, _ in full.named_parameters()]
    for (_, a), b in zip(split, full.parameters()):
        assert torch.equal(a, b)
    tok, _ = microbatch(CFG, 0, 0)
    x = tok
    with torch.no_grad():
        for m in parts:
            x = m(x)
        torch.testing.assert_close(x, full(tok), atol=1e-6, rtol=0)


def _chain(stages, g=0, it=0):
    parts = [build_stage(CFG, s, stages) for s in range(stages)]
    comps = [StageCompute(m, s == 0, s == stages - 1, 0.5) for s, m in enumerate(parts)]
    comps[0].split_first = True  # these tests split every stage (StageCompute.split_first)
    tok, tgt = microbatch(CFG, it, g)
    x = tok
    for c in comps:
        x = c.forward(g, x, tgt if c.is_last else None)
    return parts, comps, tok, tgt


def _native_grads(tok, tgt):
    full = build_full(CFG)
    (lm_loss(full(tok), tgt) * 0.5).backward()
    return {n: p.grad for n, p in full.named_parameters()}


def test_i_then_w_matches_native_backward():
    parts, comps, tok, tgt = _chain(3)
    grad, input_grads = None, []
    for c in reversed(comps):
        grad = c.backward_input(0, grad)
        input_grads.append(grad)
        # every parameter of these models is deferred: I leaves param.grad untouched
        assert all(p.grad is None for p in c.module.parameters())
    assert input_grads[-1] is None and all(t is not None for t in input_grads[:-1])
    for c in comps:
        c.backward_weight(0)
        assert c.pending() == []
    ref = _native_grads(tok, tgt)
    got = {n: p.grad for m in parts for n, p in m.named_parameters()}
    assert set(got) == set(ref)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=1e-6, rtol=0, msg=n)


def test_backward_full_equals_split():
    parts_a, comps_a, _, _ = _chain(2)
    parts_b, comps_b, _, _ = _chain(2)
    ga, gb = None, None
    for ca, cb in zip(reversed(comps_a), reversed(comps_b)):
        ga = ca.backward_full(0, ga)
        gb = cb.backward_input(0, gb)
        cb.backward_weight(0)
    for pa, pb in zip((p for m in parts_a for p in m.parameters()),
                      (p for m in parts_b for p in m.parameters())):
        assert torch.equal(pa.grad, pb.grad)


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()
        self.ln_masks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.__name__)
        if func.__name__.startswith("native_layer_norm_backward"):
            self.ln_masks.append(tuple(args[-1]))  # which of (input, weight, bias) it computes
        return func(*args, **(kwargs or {}))


def test_w_does_not_recompute():
    (m,), (c,), tok, tgt = _chain(1)
    c.backward_input(0)  # the first W of a graph structure also checks direct_w against
    c.backward_weight(0)  # the engine (both compute its Linear groups): count a later one
    c.zero_grad()
    c.forward(0, tok, tgt)
    with FlopCounterMode(display=False) as fi:
        c.backward_input(0)
    ops_w, ops_b = _OpNames(), _OpNames()
    with FlopCounterMode(display=False) as fw, ops_w:
        c.backward_weight(0)
    loss = lm_loss(m(tok), tgt)
    with FlopCounterMode(display=False) as fb, ops_b:
        loss.backward()
    i, w, b = fi.get_total_flops(), fw.get_total_flops(), fb.get_total_flops()
    assert w > 0 and i + w == b, (i, w, b)  # W does exactly the weight products, once
    # W re-runs nothing of I: no attention/GELU/softmax backward, and its layer-norm
    # backwards compute only the affine parameters' gradients, never the input's
    trunk = ("attention", "gelu", "softmax", "nll_loss")
    assert not any(t in n for n in ops_w.names for t in trunk), ops_w.names
    assert ops_w.ln_masks and all(not m[0] for m in ops_w.ln_masks), ops_w.ln_masks
    assert any("backward" in n for n in ops_b.names)


def test_pending_reset_and_order_checks():
    parts, comps, tok, tgt = _chain(2)
    first, last = comps
    a1 = first.forward(1, microbatch(CFG, 0, 1)[0])
    assert first.pending() == [0, 1] and last.pending() == [0]
    g = last.backward_input(0)
    with torch.no_grad():
        expected = float(lm_loss(parts[1](parts[0](tok)), tgt))
    assert last.pending() == [0] and abs(last.loss(0) - expected) < 1e-6
    with pytest.raises(RuntimeError):
        last.backward_input(0)  # I twice
    with pytest.raises(RuntimeError):
        first.backward_weight(0)  # W before I
    first.backward_full(0, g)
    assert any(p.grad is not None for p in parts[0].parameters())
    for c in comps:
        c.reset()
    assert first.pending() == last.pending() == []
    assert all(p.grad is None for m in parts for p in m.parameters())
    assert a1.requires_grad is False


def test_user_workload_with_plain_layers():
    def build(cfg, stage, stages):
        torch.manual_seed(stage)
        if stage == 0:
            return nn.Sequential(nn.Embedding(cfg.vocab, 8), nn.Linear(8, 8))
        return nn.Sequential(nn.Tanh(), nn.Linear(8, cfg.vocab))

    wl = Workload(build_stage=build)
    tok, tgt = microbatch(CFG, 0, 0)
    parts = [build(CFG, s, 2) for s in range(2)]
    comps = [StageCompute(m, s == 0, s == 1, 1.0, wl.loss_fn) for s, m in enumerate(parts)]
    comps[0].backward_full(0, comps[1].backward_full(0) if comps[1].forward(
        0, comps[0].forward(0, tok), tgt) is not None else None)
    ref = [build(CFG, s, 2) for s in range(2)]
    lm_loss(ref[1](ref[0](tok)), tgt).backward()
    for a, b in zip((p for m in parts for p in m.parameters()),
                    (p for m in ref for p in m.parameters())):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)


def test_reference_loss_falls():
    s = train_reference(CFG, replicas=2, microbatches=2, iterations=40, stages=2)
    assert abs(s.losses[0] - math.log(CFG.vocab)) < 0.1
    assert sum(s.losses[-5:]) / 5 < 0.7 * math.log(CFG.vocab), s.losses
    back = Summary.from_json(s.to_json())
    assert back.losses == s.losses and back.param_checksums == s.param_checksums
    assert compare(s, back, 1e-5) == []
    assert compare(s, Summary(s.losses[:-1] + [0.0], s.param_checksums), 1e-5)


ITERS, M = 3, 2


@lru_cache(maxsize=None)
def _reference(D):
    return train_reference(CFG, D, M, ITERS, 2)


def _assert_matches(ref, got):
    assert compare(ref, got, 1e-5) == []
    worst = max(float((ref.state[s][n] - got.state[s][n]).abs().max())
                for s in range(len(ref.state)) for n in ref.state[s])
    assert worst < 1e-5, worst


@pytest.mark.parametrize("split", [True, False], ids=["split", "fused"])
@pytest.mark.parametrize("D,failed", [
    (2, []), (2, [(0, 1)]), (3, []), (3, [(1, 0)]),
    (3, [(0, 1), (2, 1)]),  # two failed, same stage
    (3, [(0, 0), (1, 1)]),  # two failed, different stages
])
def test_local_plan_equals_reference(D, failed, split):
    plan = solve(JobSpec.uniform(D, 2, M), failed, mode=Mode(split_backward=split))
    assert any(a.op == ("W" if split else "B") for w in plan.workers for a in w.actions)
    _assert_matches(_reference(D), run_plan_locally(CFG, plan, ITERS))


def test_local_midway_failure_and_rejoin():
    job = JobSpec.uniform(3, 2, M)
    events = {1: [(1, 0)], 2: solve(job, [])}  # fails during iteration 1, back for 2
    _assert_matches(_reference(3), run_plan_locally(CFG, solve(job, []), ITERS, events))


def test_profile_gives_a_valid_job():
    details = []
    job = profile(CFG, stages=2, replicas=2, microbatches=4, repeats=2,
                  memory_budget=10**7, details=details)
    assert job.stages == 2 and min(job.cost.F + job.cost.I + job.cost.W + job.cost.OPT) >= 1
    assert job.memory is not None and min(job.memory.activation) > 0
    assert job.slots(0) >= 1
    for d in details:  # what a micro-batch holds from I to W is measured, and charged
        assert d["store_bytes"] > 0 and d["activation_bytes"] >= d["saved_bytes"]
        assert d["activation_bytes"] >= d["store_bytes"]
