"""Activation checkpointing with the I/W split (issue 35 item 3): `--activation-checkpointing
none|full|selective[:N]` for the built-in GPT and Llama, Hugging Face and module-factory
models. A recomputed layer keeps only its input from F, is recomputed once per
micro-batch in I (in W on the first stage, whose I does nothing; in B when fused) and
never again in W; after I only what W reads stays (recompute.trim). Gradients are bit for
bit those without checkpointing, the recomputation draws the forward's dropout mask, and
runs through a SIGKILL equal the reference without checkpointing."""
import io
import logging

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from examples import dropout_lm
from executor.compute.backward import recompute
from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.one_process.local import run_plan_locally
from executor.compute.backward.recompute import Policy
from executor.compute.one_process.reference import compare, train_reference
from executor.compute.stage import StageCompute
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.inputs.train_options import checkpointing_of
from executor.inputs.workload_name import load_workload
from executor.launch.launcher import train
from executor.models.families import architecture
from planner.job import JobSpec
from planner.plan import Mode
from planner.solvers.backends import solve
from recycle.cli import app

TOL = 1e-5
HF_GPT2 = "hf:gpt2?n_layer=3&n_embd=16&n_head=2&vocab_size=32&n_positions=16"
HF_LLAMA = ("hf:llama?hidden_size=16&intermediate_size=32&num_hidden_layers=3"
            "&num_attention_heads=2&num_key_value_heads=1&vocab_size=32&max_position_embeddings=16")


def _has_hf() -> bool:
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


MODELS = ["gpt", "llama:debug", dropout_lm.name(3)] + ([HF_GPT2, HF_LLAMA] if _has_hf() else [])


def cfg_of(name: str) -> ModelConfig:
    if name.startswith(("llama", "hf:")):
        return ModelConfig(micro_batch_size=2, **architecture(
            name, d_model=None, n_layers=None, n_heads=None, seq_len=8, vocab=None))
    return ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=3, micro_batch_size=2)


def test_policy_names_and_which_blocks():
    assert [str(Policy.parse(t)) for t in ("none", "full", "selective", "selective:3")] == \
        ["none", "full", "selective:2", "selective:3"]
    assert [b for b in range(6) if Policy.parse("selective:2").recomputes(b)] == [1, 3, 5]
    assert all(Policy.parse("full").recomputes(b) for b in range(4))
    assert not any(Policy.parse("none").recomputes(b) for b in range(4))
    for bad in ("some", "selective:0", "selective:x", "full:2", "selective:", ""):
        with pytest.raises(ValueError, match="--activation-checkpointing must be"):
            Policy.parse(bad)


def _one_microbatch(name, cfg, stage, stages, checkpointing, split=True):
    """F, I, W (or F, B) of micro-batch 0 on `stage`: recomputations in I and in W, the
    bytes held after F and after I, and every gradient."""
    wl = load_workload(name)
    m = wl.build_stage(cfg, stage, stages)
    first, last = stage == 0, stage == stages - 1
    c = StageCompute(m, first, last, 1.0, wl.loss_fn, stage=stage, seed=cfg.seed,
                     checkpointing=checkpointing, track_memory=True)
    c.split = split
    x, t = wl.microbatch(cfg, 0, 0)
    with torch.no_grad():  # the stage's input (eval: the same on every call)
        for s in range(stage):
            prev = wl.build_stage(cfg, s, stages).eval()
            x = prev(*x) if isinstance(x, tuple) else prev(x)
    out = c.forward(0, x, t if last else None)
    gen = torch.Generator().manual_seed(1)
    grad = None if last else tuple(torch.randn(o.shape, generator=gen)
                                   for o in (out if isinstance(out, tuple) else (out,))
                                   if o.is_floating_point())
    grad = grad[0] if grad is not None and len(grad) == 1 else grad
    held_f = c.held_bytes(0)
    n0 = recompute.recomputations()
    gx = c.backward_input(0, grad) if split else c.backward_full(0, grad)
    n1 = recompute.recomputations()
    held_i = c.held_bytes(0) if split else 0
    if split:
        c.backward_weight(0)
    grads = [p.grad for p in m.parameters()] + (list(gx) if isinstance(gx, tuple) else [gx])
    return n1 - n0, recompute.recomputations() - n1, held_f, held_i, grads


@pytest.mark.parametrize("name", MODELS)
def test_recomputed_once_in_i_never_in_w_and_the_same_gradients(name, caplog):
    cfg = cfg_of(name)
    with caplog.at_level(logging.WARNING, logger="recycle.compute"):
        for stage in (0, 1, 2):
            i, w, f_none, i_none, g_none = _one_microbatch(name, cfg, stage, 3, "none")
            assert (i, w) == (0, 0)
            i, w, f_full, i_full, g_full = _one_microbatch(name, cfg, stage, 3, "full")
            assert all(torch.equal(a, b) for a, b in zip(g_none, g_full) if a is not None)
            assert f_full < f_none  # F keeps the recomputed layers' inputs only
            if stage == 0:  # its I does nothing: the one recomputation is in W
                assert i == 0 and w >= 1
            else:
                assert i >= 1 and w == 0, (stage, i, w)  # in I, not a second time in W
                # after I: what W reads, no more (less wherever a block is recomputed; a
                # piece of a norm and a head alone keeps as much: W reads all it saves)
                assert i_full < i_none if stage == 1 else i_full <= i_none
            i, w, *_ = _one_microbatch(name, cfg, stage, 3, "full", split=False)
            assert i >= 1 and w == 0  # fused B: once
    assert not [r for r in caplog.records if "recomputed again" in r.getMessage()]


def test_the_recomputation_draws_the_forwards_dropout_mask(monkeypatch):
    """The recomputation re-seeds the layer: the same mask, the same gradients. Not
    re-seeded, it draws another mask and the gradients differ."""
    name, cfg = dropout_lm.name(3), cfg_of(dropout_lm.name(3))
    *_, g_none = _one_microbatch(name, cfg, 1, 3, "none")
    *_, g_full = _one_microbatch(name, cfg, 1, 3, "full")
    assert all(torch.equal(a, b) for a, b in zip(g_none, g_full) if a is not None)
    monkeypatch.setattr(recompute._Frame, "seeded", property(lambda f: False, lambda f, v: None),
                        raising=False)
    *_, g_unseeded = _one_microbatch(name, cfg, 1, 3, "full")
    assert not all(torch.equal(a, b) for a, b in zip(g_none, g_unseeded) if a is not None)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("checkpointing", ["full", "selective:2"])
@pytest.mark.parametrize("split", [True, False], ids=["iw-split", "fused-b"])
def test_in_process_runner_with_a_failure_equals_the_reference_without(name, checkpointing,
                                                                      split):
    cfg, wl = cfg_of(name), load_workload(name)
    ref = train_reference(cfg, 2, 2, 3, 2, workload=wl)  # no checkpointing
    plan = solve(JobSpec.uniform(2, 2, 2), [], solver="greedy",
                 mode=Mode(split_backward=split, staggered=True))
    got = run_plan_locally(cfg, plan, 3, {1: [[1, 1]]}, workload=wl,
                           training=TrainingSettings(activation_checkpointing=checkpointing))
    assert not compare(got, ref, TOL), compare(got, ref, TOL)


def test_a_job_profiled_with_checkpointing_sets_the_runs(tmp_path):
    """`profile --activation-checkpointing full` measures less activation memory and
    records the setting; `train --job` takes it, and refuses another in one line."""
    specs = {}
    for ac in ("none", "full"):
        out = tmp_path / f"{ac}.json"
        r = CliRunner().invoke(app, ["profile", "--model", "llama:debug", "-s", "2", "--repeats",
                                     "1", "--seq-len", "8", "--activation-checkpointing", ac,
                                     "-o", str(out)])
        assert r.exit_code == 0, r.output
        specs[ac] = JobSpec.load(str(out))
    none, full = specs["none"], specs["full"]
    assert none.activation_checkpointing is None
    assert full.activation_checkpointing == "full"
    assert full.memory.activation[0] < none.memory.activation[0] / 4  # the embedding stage
    assert full.memory.activation[1] < none.memory.activation[1]
    assert none.spec_hash() == none.model_copy(update={}).spec_hash()  # field omitted: old hash
    assert checkpointing_of(None, full) == "full" and checkpointing_of("full", full) == "full"
    assert checkpointing_of(None, none) == "none" and checkpointing_of("full", none) == "full"
    r = CliRunner().invoke(app, ["train", "--job", str(tmp_path / "full.json"), "--model",
                                 "llama:debug", "--activation-checkpointing", "none"])
    assert r.exit_code == 2 and "the --job was profiled with full" in r.stderr, r.output


@pytest.mark.parametrize("command", ["train", "profile"])
@pytest.mark.parametrize("value", ["some", "selective:0", "full:2"])
def test_a_bad_value_is_one_line_exit_2(command, value):
    r = CliRunner().invoke(app, [command, "--activation-checkpointing", value])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--activation-checkpointing must be" in lines[0], r.output


# ---- real worker processes -------------------------------------------------------------------

@pytest.mark.hard_timeout(150)
@pytest.mark.parametrize("name,checkpointing", [(dropout_lm.name(3), "full"),
                                                ("llama:debug", "full"),
                                                ("llama:debug", "selective:2")],
                         ids=["dropout-gpt-full", "llama-full", "llama-selective"])
def test_workers_through_a_kill_and_rejoin_equal_the_reference_without(tmp_path, name,
                                                                       checkpointing):
    cfg = cfg_of(name)
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(name))
    out = io.StringIO()
    spec = LaunchSpec(cfg, JobSpec.uniform(2, 2, 2), 4,
                      Faults(kills=[(1, 1, 1)], rejoins=[(1, 1, 2)]), deadline_s=110,
                      run_dir=str(tmp_path), model=name,
                      training=TrainingSettings(activation_checkpointing=checkpointing),
                      **sections(timeout=4.0))
    res = train(spec, console=Console(file=out, width=200))
    assert res.summary is not None, f"halted: {res.halted}\n{out.getvalue()}"
    assert "SIGKILL worker" in out.getvalue() and "is back" in out.getvalue()
    assert not compare(res.summary, ref, TOL), compare(res.summary, ref, TOL)
    logs = "".join(p.read_text() for p in tmp_path.rglob("*.log"))
    assert "recomputed again" not in logs and "nothing is recomputed" not in logs
