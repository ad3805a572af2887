"""Training features kept exact under failures (issue 8 item 5): the learning-rate
schedule, clipping by the global gradient norm over all stages (optimistic step, redone
from the pre-step copy when the clip applies), bf16 autocast, and their options.

The multi-process test runs the real `recycle train` (worker processes, gloo, a SIGKILL
and a rejoin) against the one-process reference; it takes --model so other workloads can
be added to its parameters.
"""
import dataclasses
import glob
import json
import math
import re

import pytest
import torch
from typer.testing import CliRunner

from executor.compute.one_process.local import LocalRunner, run_plan_locally
from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.one_process.reference import Summary, compare, train_reference
from executor.inputs.workload_name import load_workload
from executor.models.families import architecture
from executor.optim.clip import coefficient
from executor.optim.schedule import lr_at
from planner.job import JobSpec
from planner.solvers.backends import solve
from recycle.cli import app

SMALL = ["--vocab", "32", "--seq-len", "8", "--d-model", "16", "--layers", "2",
         "--micro-batch-size", "2"]
CLIP = 1.25  # the GPT below: global norms 1.05..1.44, so iterations 1, 4, 5 clip, 0, 2, 3 not
# Per --model: a max norm between its iterations' global norms (reference, these sizes).
# The plain-nn example's norms are 0.91..1.17: 1.12 clips iterations 1-3 only. Add a
# model to the test's parameters with its value here.
# llama:debug's are 2.16..2.38: 2.25 clips iterations 0 and 4-5.
CLIPS = {"gpt": CLIP, "examples.mlp_workload:workload": 1.12, "llama:debug": 2.25}
# Per --model: its shape flags (a flavour fixes all but the context length).
SHAPES = {"gpt": SMALL, "examples.mlp_workload:workload": SMALL,
          "llama:debug": ["--seq-len", "8", "--micro-batch-size", "2"]}
TRAINING = ["--lr-schedule", "cosine", "--warmup", "2", "--min-lr-ratio", "0.2"]
ITERS = 6


CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_layers=2, micro_batch_size=2)


def training_for(clip: float = CLIP) -> TrainingSettings:
    return TrainingSettings(clip=clip, lr_schedule="cosine", warmup_iters=2,
                            total_iters=ITERS, min_lr_ratio=0.2)


@pytest.fixture(autouse=True)
def one_thread():
    """The in-process parts use one thread, as every worker does (RECYCLE_THREADS): on a
    shared machine idle OpenMP threads spinning cost more than they bring at these sizes."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def one_line_exit_2(r, says):
    err = r.stderr if getattr(r, "stderr", None) else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], err


# ---- learning-rate schedule ---------------------------------------------------------------
def test_lr_schedule_values_at_known_iterations():
    c = TrainingSettings(lr=1.0, lr_schedule="cosine", warmup_iters=4, total_iters=14,
                         min_lr_ratio=0.1)
    assert [lr_at(c, i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]  # linear warm-up
    assert lr_at(c, 4) == 1.0  # cosine starts at the peak
    assert lr_at(c, 9) == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert lr_at(c, 14) == lr_at(c, 100) == pytest.approx(0.1)  # the floor, also past the end
    assert all(lr_at(c, i) > lr_at(c, i + 1) for i in range(4, 14))
    flat = dataclasses.replace(c, lr_schedule="constant")
    assert [lr_at(flat, i) for i in (0, 3, 4, 50)] == [0.25, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="total_iters"):
        lr_at(dataclasses.replace(c, total_iters=0), 5)


# ---- clipping and the schedule, exact under a SIGKILL and a rejoin ---------------------------
@pytest.mark.hard_timeout(150)
@pytest.mark.parametrize("model", ["gpt", "llama:debug", "examples.mlp_workload:workload"])
def test_clip_and_cosine_exact_with_kill_and_rejoin(tmp_path, model):
    clip = CLIPS[model]
    out = tmp_path / "summary.json"
    r = CliRunner().invoke(app, ["train", "--model", model, *SHAPES[model], *TRAINING, "--clip",
                                 str(clip), "-d", "2",
                                 "-s", "2", "-m", "2", "--iterations", str(ITERS),
                                 "--kill", "1:0@2", "--rejoin", "1:0@4", "--timeout", "4",
                                 "--run-dir", str(tmp_path), "--summary", str(out)])
    logs = "".join(open(f).read() for f in sorted(glob.glob(str(tmp_path / "worker-*.log"))))
    assert r.exit_code == 0, r.output + logs
    got = Summary.load(str(out))
    cfg = CFG
    if model == "llama:debug":
        cfg = ModelConfig(**{**cfg.to_dict(), **architecture(model, seq_len=8)})
    ref = train_reference(cfg, 2, 2, ITERS, 2, training=training_for(clip),
                          workload=load_workload(model))
    assert not compare(got, ref, 1e-5), "\n".join(compare(got, ref, 1e-5))
    # the clip really applied in some iterations and not in others ...
    clipped = [n > clip for n in ref.grad_norms]
    assert any(clipped) and not all(clipped), ref.grad_norms
    # ... and the workers got there by redoing optimistic steps (each redo is logged)
    redone = {int(m) for m in re.findall(r"clip: redid step (\d+)", logs)}
    assert redone and redone <= {i for i, c in enumerate(clipped) if c}, (redone, clipped)
    recovery = json.loads(out.read_text())["recovery"]
    assert [e["kind"] for e in recovery] == ["kill", "rejoin"], recovery  # killed, then back
    # a longer run resumed from its checkpoint: the cosine horizon moves with --iterations
    if model != "gpt":  # resuming is the same code for every model
        return
    r = CliRunner().invoke(app, ["train", "--model", model, *SMALL, *TRAINING, "--clip",
                                 str(clip), "-d", "2", "-s", "2", "-m", "2",
                                 "--iterations", str(ITERS + 2),
                                 "--resume", str(tmp_path / "checkpoints"), "--timeout", "4",
                                 "--run-dir", str(tmp_path / "more"),
                                 "--summary", str(tmp_path / "more.json")])
    assert r.exit_code == 0, r.output
    note = f"with --iterations (the schedule's horizon) {ITERS + 2} (it trained with {ITERS})"
    assert note in re.sub(r"\s+", " ", r.output), r.output  # (rich wraps long lines)
    more = json.loads((tmp_path / "more.json").read_text())["losses"]
    assert more[:ITERS] == got.losses and len(more) == ITERS + 2


def test_local_runner_clips_like_the_reference_with_and_without_redo():
    """The in-process runner steps through the same StageStepper: the last stage steps
    first (optimistic, redone when clipped), stage 0 last (every norm in: exact)."""
    tr = training_for()
    plan = solve(JobSpec.uniform(2, 2, 2), [], solver="greedy")
    runner = LocalRunner(CFG, plan, training=tr)
    got = runner.summary([runner.iteration(i) for i in range(ITERS)])
    ref = train_reference(CFG, 2, 2, ITERS, 2, training=tr)
    assert not compare(got, ref, 1e-5)
    clipped = sum(n > CLIP for n in ref.grad_norms)
    last = [w.stepper.stats for k, w in runner.workers.items() if k[1] == 1]
    first = [w.stepper.stats for k, w in runner.workers.items() if k[1] == 0]
    assert all(s.optimistic == ITERS and s.redos == clipped for s in last)
    assert all(s.exact == ITERS and s.redos == 0 for s in first)
    assert 0 < coefficient(max(ref.grad_norms), CLIP) < 1
    # without clipping, or without the schedule, training differs: both features act
    for off in ({"clip": 0.0}, {"lr_schedule": "constant"}):
        assert compare(got, train_reference(CFG, 2, 2, ITERS, 2,
                                            training=dataclasses.replace(tr, **off)), 1e-5)


# ---- bf16 ----------------------------------------------------------------------------------
# Tolerance. A plan's bf16 run differs from the bf16 reference only as fp32 runs do: the
# fp32 gradients of the micro-batches are summed in another order (per worker, then over
# the peers), which costs ~3e-8 in fp32 (measured, this model). Here bf16 adds nothing:
# measured 0.0 (loss, checksums, every parameter), as bf16 x bf16 products are exact in
# fp32 and short sums of them rarely depend on the order. On larger models a difference
# of ~1e-8 in a master weight can flip the rounding of its bf16 cast (2^-8 relative) and
# show up downstream, so we allow 1e-4: still 4x under what tells bf16 from fp32 on this
# model (loss 4e-4..6e-4 relative, parameters 6e-3; asserted below, so the test would
# fail if autocast were not on in either). Script: benchmarks/step_bench.py --bf16-tol.
BF16_TOL = 1e-4


def test_bf16_plan_with_a_failure_matches_bf16_reference():
    wl = load_workload("examples.mlp_workload:workload")  # plain torch.nn layers
    cfg = ModelConfig(vocab=8, seq_len=4, d_model=16, n_layers=2, micro_batch_size=2)
    bf16 = TrainingSettings(precision="bf16", clip=0.5, total_iters=4)
    plan = solve(JobSpec.uniform(2, 2, 2), [], solver="greedy")
    got = run_plan_locally(cfg, plan, 4, {1: [[1, 0]]}, workload=wl, training=bf16)
    ref = train_reference(cfg, 2, 2, 4, 2, training=bf16, workload=wl)
    assert not compare(got, ref, BF16_TOL), compare(got, ref, BF16_TOL)
    fp32 = train_reference(cfg, 2, 2, 4, 2, training=dataclasses.replace(bf16, precision="fp32"),
                           workload=wl)
    assert compare(fp32, ref, BF16_TOL)  # bf16 really ran: fp32 is beyond the tolerance
    assert all(t.dtype == torch.float32 for s in got.state for t in s.values())  # fp32 masters


@pytest.mark.hard_timeout(120)
def test_bf16_llama_across_processes_with_kill_and_rejoin_matches_bf16_reference(tmp_path):
    """bf16 activations and gradients on the wire (any-dtype specs), the generic I/W split
    under autocast, a SIGKILL and a rejoin: the bf16 reference within BF16_TOL."""
    out = tmp_path / "summary.json"
    r = CliRunner().invoke(app, ["train", "--model", "llama:debug", *SHAPES["llama:debug"],
                                 "--precision", "bf16", "-d", "2", "-s", "2", "-m", "2",
                                 "--iterations", "4", "--kill", "1:0@1", "--rejoin", "1:0@2",
                                 "--timeout", "4", "--run-dir", str(tmp_path),
                                 "--summary", str(out)])
    assert r.exit_code == 0, r.output
    cfg = ModelConfig(**architecture("llama:debug", seq_len=8), micro_batch_size=2)
    bf16 = TrainingSettings(precision="bf16", total_iters=4)
    ref = train_reference(cfg, 2, 2, 4, 2, training=bf16, workload=load_workload("llama:debug"))
    got = Summary.load(str(out))
    assert not compare(got, ref, BF16_TOL), compare(got, ref, BF16_TOL)
    fp32 = train_reference(cfg, 2, 2, 4, 2, training=dataclasses.replace(bf16, precision="fp32"),
                           workload=load_workload("llama:debug"))
    assert compare(got, fp32, BF16_TOL)  # it really ran in bf16


# ---- options -------------------------------------------------------------------------------
@pytest.mark.parametrize("flags,says", [
    (["--precision", "fp16"], "--precision must be one of fp32, bf16"),
    (["--lr-schedule", "linear"], "--lr-schedule must be one of constant, cosine"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    (["--clip", "-0.5"], "--clip must be a finite norm >= 0"),
    (["--clip", "nan"], "--clip must be a finite norm >= 0"),
    (["--lr-schedule", "cosine", "--min-lr-ratio", "1.5"], "--min-lr-ratio must be within [0, 1]"),
    (["--lr-schedule", "cosine", "--min-lr-ratio", "nan"], "--min-lr-ratio must be within [0, 1]"),
    (["--min-lr-ratio", "0.5"], "--min-lr-ratio sets the floor of --lr-schedule cosine"),
    (["--lr-schedule", "cosine", "--warmup", "5"], "--warmup 5 leaves no iteration"),
])
def test_bad_training_options_are_one_line_exit_2(tmp_path, flags, says):
    r = CliRunner().invoke(app, ["train", "--iterations", "5", "--run-dir", str(tmp_path),
                                 *flags])
    one_line_exit_2(r, says)
