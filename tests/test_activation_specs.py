"""Activations of any shape and dtype (and tuples of them) between stages, their spec
agreed once per plan version (executor/runtime/transport/wire.py, World.activation_spec).

Real worker processes and gloo worlds: exact against the one-process reference with a
SIGKILL and a rejoin; the wire itself between two real processes (bf16, int, bool, a
tuple in one message, gradients of the floating tensors only); a stage whose output
changes shape between micro-batches halts the run with one clear line."""
import io
import multiprocessing
import time

import pytest
import torch
from rich.console import Console

from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import compare, train_reference
from executor.compute.stage import StageCompute
from executor.inputs.workload_name import load_workload
from executor.launch.launcher import train
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.runtime.transport.comm import FWD, World
from executor.runtime.transport.endpoints import connect_store, host_store
from executor.runtime.transport.wire import ActivationSpec, ActivationSpecError
from planner.job import JobSpec

CFG = ModelConfig(vocab=8, seq_len=6, d_model=8, n_heads=2, n_layers=2, micro_batch_size=2)
M = 2
WL = "tests.activation_workloads:"


def _train(tmp_path, model: str, D: int, iterations: int, faults=Faults()):
    out = io.StringIO()
    spec = LaunchSpec(CFG, JobSpec.uniform(D, 2, M), iterations, faults, deadline_s=50,
                      summary_path=str(tmp_path / "summary.json"), run_dir=str(tmp_path),
                      model=model, **sections(timeout=4.0))
    res = train(spec, console=Console(file=out, width=200))
    res.output = out.getvalue()
    return res


class _Pass(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, *args):
        h, pos = args[0] if len(args) == 1 else args
        return h * self.w, pos


def _tuples_supported() -> bool:
    """StageCompute takes and returns tuples (executor/compute/stage.py, item 3's compute side)."""
    try:
        out = StageCompute(_Pass(), False, False, 1.0).forward(0, (torch.ones(1, 2), torch.arange(2)))
        return isinstance(out, tuple)
    except Exception:  # noqa: BLE001 - a StageCompute of tensors only
        return False


@pytest.mark.hard_timeout(120)
@pytest.mark.parametrize("model", [
    "odd",
    pytest.param("tuple_", marks=pytest.mark.skipif(
        not _tuples_supported(), reason="StageCompute does not take tuple activations yet "
                                        "(compute side of issue 8 item 3)")),
])
def test_any_activation_killed_and_rejoined_is_exact(tmp_path, model):
    """odd: one float64 (b, T, 3d) tensor; tuple_: (bf16 hidden, int64 positions, bool
    mask). D=2, worker 1:1 SIGKILLed mid-iteration 1 and rejoined at 2: the re-routed
    micro-batches and the rejoined worker agree on the spec of every new plan version."""
    res = _train(tmp_path, WL + model, 2, 4, Faults(kills=[(1, 1, 1)], rejoins=[(1, 1, 2)]))
    assert res.summary is not None, f"halted: {res.halted}\n{res.output}"
    ref = train_reference(CFG, 2, M, 4, 2, workload=load_workload(WL + model))
    diffs = compare(res.summary, ref, 1e-5)
    assert not diffs, "\n".join(diffs) + "\n" + res.output
    failed = [p["failed"] for p in res.summary.plans]  # killed, then back
    assert [[1, 1]] in failed and failed[-1] == [], (failed, res.output)


@pytest.mark.hard_timeout(120)
def test_output_changing_shape_halts_with_one_line(tmp_path):
    res = _train(tmp_path, WL + "changes", 1, 2)
    assert res.summary is None
    assert "stage 0's output for micro-batch" in res.halted, res.halted
    assert "was agreed for this stage boundary" in res.halted and "\n" not in res.halted
    assert "float64[2, 5, 24]" in res.halted and "float64[2, 6, 24]" in res.halted
    assert res.model_error  # `recycle train` exits 2 on it, not 3 ("restore a checkpoint")


# ---- the wire between two real processes ------------------------------------------------
ACT = (torch.randn(2, 3, 4).to(torch.bfloat16), torch.arange(6).view(2, 3),
       torch.tensor([[True, False, True], [False, True, True]]), torch.randn(5, dtype=torch.float64))


def _peer(port: int, q) -> None:
    """Worker (0, 1): receives stage 0's activations, sends back gradient messages."""
    try:
        store = connect_store("127.0.0.1", port, 10)
        w = World(store, 0, (0, 1), [(0, 0), (0, 1)], 10.0, newer=lambda: None)
        got = w.recv_activation(0, (0, 0), 0, 0)
        # the spec is known now: the next receive is posted before its message is sent
        assert w.post_early(0, (0, 0), 1, 3, FWD) and w.early_count() == 1
        single = w.recv_activation(1, (0, 0), 0, 0)
        again = w.recv_activation(0, (0, 0), 1, 3)
        assert w.early_count() == 0 and all(torch.equal(a, b) for a, b in zip(again, got))
        q.put(("recv", [(t.dtype, t.shape, t.tolist()) for t in got], single.tolist()))
        # gradients for the floating tensors only: bf16 hidden and float64 vector
        w.send_grad((torch.ones(2, 3, 4, dtype=torch.bfloat16), torch.full((5,), 2.0, dtype=torch.float64)),
                    0, (0, 0), 0, 0)
        w.flush()
        time.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - report to the test
        q.put(("error", repr(exc)))


@pytest.mark.hard_timeout(60)
def test_tuple_of_any_dtypes_is_one_message_and_grads_cover_floats():
    store = host_store("127.0.0.1", 0, 10)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_peer, args=(store.port, q))
    p.start()
    try:
        w = World(store, 0, (0, 0), [(0, 0), (0, 1)], 10.0, newer=lambda: None)
        sent = []
        w.send = lambda t, *a, _s=w.send: sent.append(t) or _s(t, *a)
        w.send_activation(ACT, 0, (0, 1), 0, 0)
        w.send_activation(torch.arange(4, dtype=torch.int32), 1, (0, 1), 0, 0)
        w.send_activation(ACT, 0, (0, 1), 1, 3)
        grads = w.recv_grad(0, (0, 1), 0, 0)
        w.flush()
        kind, *rest = q.get(timeout=30)
        assert kind == "recv", rest
        got, single = rest
        assert [(d, tuple(s)) for d, s, _ in got] == [(t.dtype, tuple(t.shape)) for t in ACT]
        assert all(v == t.tolist() for (_, _, v), t in zip(got, ACT))
        assert single == [0, 1, 2, 3]
        # one message per hop: the tuple went as one uint8 buffer, the single tensor as itself
        assert [(t.dtype, t.numel()) for t in sent] == [(torch.uint8, 48 + 48 + 16 + 48),
                                                        (torch.int32, 4), (torch.uint8, 160)]
        assert isinstance(grads, tuple) and [g.dtype for g in grads] == [torch.bfloat16, torch.float64]
        assert grads[0].eq(1).all() and grads[1].eq(2).all()
        # the spec was agreed through the store, once, under this version
        assert ActivationSpec.from_json(store.get("recycle/v0/spec/0")) == ActivationSpec.of(ACT)
        with pytest.raises(ActivationSpecError, match=r"int64\[2, 4\].*was agreed"):
            w.send_activation((ACT[0], torch.zeros(2, 4, dtype=torch.int64), *ACT[2:]), 0, (0, 1), 1, 0)
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
        w.close()


def test_spec_round_trip_and_grad_spec():
    spec = ActivationSpec.of(ACT)
    assert ActivationSpec.from_json(spec.to_json()) == spec
    assert str(spec) == "(bfloat16[2, 3, 4], int64[2, 3], bool[2, 3], float64[5])"
    assert spec.grad().dtypes == (torch.bfloat16, torch.float64) and spec.grad().is_tuple
    back = spec.unpack(spec.pack(ACT))
    assert all(torch.equal(a, b) for a, b in zip(back, ACT))
    one = ActivationSpec.of(torch.zeros(3))
    assert not one.is_tuple and one.grad() == one
    with pytest.raises(ActivationSpecError, match=r"not \(list\)|not \(dict\)|Tensor"):
        ActivationSpec.of({"x": torch.zeros(1)})


def test_a_missing_gradient_is_zeros_on_the_device_of_the_others():
    # the CUDA path: a CPU zero among CUDA gradients broke the message's packing (the meta
    # device stands in for CUDA here: its tensors are never on the CPU either)
    from executor.runtime.transport.wire import grad_message
    spec = ActivationSpec.of(ACT).grad()
    out = grad_message(spec, (None, torch.empty(5, dtype=torch.float64, device="meta")))
    assert [t.device.type for t in out] == ["meta", "meta"]
    assert out[0].dtype == torch.bfloat16 and tuple(out[0].shape) == (2, 3, 4)
    assert [t.device.type for t in grad_message(spec, (None, None))] == ["cpu", "cpu"]
