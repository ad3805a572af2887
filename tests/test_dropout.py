"""Keyed randomness (issue 35 item 1, docs/design.md section 7): every draw a forward makes
comes from generators seeded by (seed, iteration, global micro-batch, layer), so dropout
is exact under failures. Before it, a dropout model's workers drew from their processes'
own RNG and no run with failures (nor without) equalled the reference.

Models: a GPT-2-style plain nn.Module with nn.Dropout(0.1) split by `?split=`, a Workload
of its own (stage-level keys, functional dropout), Hugging Face GPT-2 at its configured
dropout (0.1); in one process and as real worker processes with a SIGKILL and a rejoin,
fp32 and bf16."""
import dataclasses
import io
import logging

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn

from examples import dropout_lm
from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.one_process.local import run_plan_locally
from executor.compute.one_process.reference import compare, train_reference
from executor.compute.stage import StageCompute
from executor.compute.units import StageUnits
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.inputs.workload_name import load_workload
from executor.launch.launcher import train
from planner.job import JobSpec
from planner.solvers.backends import solve

CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
TOL = 1e-5
BF16_TOL = 1e-4  # as tests/test_training_features.py's (a master weight's bf16 rounding)
GPT = dropout_lm.name(2)
OWN = "examples.dropout_lm:workload"
HF_GPT2 = "hf:gpt2?n_layer=2&n_embd=16&n_head=2&vocab_size=32&n_positions=16"


def _hf_cfg():
    from executor.models.families import architecture
    return ModelConfig(micro_batch_size=2, **architecture(
        HF_GPT2, d_model=None, n_layers=None, n_heads=None, seq_len=8, vocab=None))


def _models():
    out = [(GPT, CFG), (OWN, CFG)]
    try:
        import transformers  # noqa: F401
        out.append((HF_GPT2, _hf_cfg()))
    except ImportError:
        pass
    return out


MODELS = _models()
IDS = ["gpt-split", "workload", "hf-gpt2"][:len(MODELS)]


def _forward(units, module, it, g, x):
    with units.forward(it, g):
        return module(x)


def test_draws_are_a_function_of_the_key_and_leave_the_process_rng_alone():
    wl = load_workload(GPT)
    m = wl.build_stage(CFG, 0, 2)
    units = StageUnits(m, 0, CFG.seed, torch.device("cpu"))
    x = wl.microbatch(CFG, 0, 0)[0]
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = _forward(units, m, 3, 5, x)
    assert torch.equal(torch.random.get_rng_state(), before)  # a fork: nothing moved
    torch.rand(7)  # whatever the process drew meanwhile
    assert torch.equal(_forward(units, m, 3, 5, x), a)  # same key, same mask
    assert not torch.equal(_forward(units, m, 3, 6, x), a)  # another micro-batch
    assert not torch.equal(_forward(units, m, 4, 5, x), a)  # another iteration
    other = StageUnits(m, 0, CFG.seed + 1, torch.device("cpu"))
    assert not torch.equal(_forward(other, m, 3, 5, x), a)  # another seed


def test_the_stage_split_does_not_change_the_draws():
    """Draws are keyed by the layer's place in the whole model, not the stage's."""
    wl = load_workload(GPT)
    runs = [train_reference(CFG, 2, 2, 2, s, workload=wl) for s in (1, 2, 3)]
    for r in runs[1:]:
        assert max(abs(a - b) for a, b in zip(r.losses, runs[0].losses)) <= TOL
    quiet = dataclasses.replace(wl, build_stage=lambda c, s, n: wl.build_stage(c, s, n).eval())
    assert runs[0].losses != train_reference(CFG, 2, 2, 2, 1, workload=quiet).losses  # it drew


@pytest.mark.parametrize("name,cfg", MODELS, ids=IDS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_in_process_runner_with_a_failure_equals_reference(name, cfg, precision):
    wl = load_workload(name)
    tr = TrainingSettings(precision=precision)
    ref = train_reference(cfg, 2, 2, 3, 2, workload=wl, training=tr)
    plan = solve(JobSpec.uniform(2, 2, 2), [], solver="greedy")
    got = run_plan_locally(cfg, plan, 3, {1: [[1, 1]]}, workload=wl, training=tr)
    tol = TOL if precision == "fp32" else BF16_TOL
    assert not compare(got, ref, tol), compare(got, ref, tol)


class _Functional(nn.Module):
    """Draws without any dropout module: only a forward can show it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return F.dropout(self.lin(x), 0.5, self.training) + 0.01 * torch.randn_like(x)


class _Quiet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


def test_a_stage_whose_first_forward_draws_is_keyed_from_it_on():
    torch.manual_seed(0)
    m, x = _Functional(), torch.ones(2, 4)
    units = StageUnits(m, 1, 0, torch.device("cpu"))
    assert not units.draws.keyed and units.draws.probing  # nothing looks random
    first = _forward(units, m, 0, 0, x)  # keyed to find out
    assert units.draws.keyed and not units.draws.probing
    again = StageUnits(m, 1, 0, torch.device("cpu"))
    assert torch.equal(_forward(again, m, 0, 0, x), first)  # the probe's forward was keyed
    q = _Quiet()
    quiet = StageUnits(q, 1, 0, torch.device("cpu"))
    _forward(quiet, q, 0, 0, x)
    assert not quiet.draws.keyed and not quiet.draws.probing  # never keyed again


def test_a_module_with_its_own_generator_is_named(caplog):
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.gen = torch.Generator().manual_seed(1)

        def forward(self, x):
            return self.lin(x) + torch.rand(x.shape, generator=self.gen)

    with caplog.at_level(logging.WARNING, logger="recycle.compute"):
        StageCompute(nn.Sequential(Noisy()), True, True, 1.0, stage=0)
    lines = [r.getMessage() for r in caplog.records if "cannot key" in r.getMessage()]
    assert len(lines) == 1 and "0.gen" in lines[0], lines


@pytest.mark.parametrize("command", [["train", "--reference", "--iterations", "1"],
                                     ["profile", "--repeats", "1", "-o", "/dev/null"]])
def test_the_command_names_unkeyable_randomness_before_it_trains(command):
    from typer.testing import CliRunner

    from recycle.cli import app
    r = CliRunner().invoke(app, [*command, "--model",
                                 "tests.activation_workloads:own_generator?split=0,1,2"])
    assert r.exit_code == 0, r.output
    named = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: --model")]
    assert len(named) == 1 and "cannot key" in named[0] and "stage 0 1.gen" in named[0], r.output


def test_hf_keeps_the_configured_dropout():
    pytest.importorskip("transformers")
    from executor.compute.draws import random_parts
    wl = load_workload(HF_GPT2)
    assert random_parts(wl.build_stage(_hf_cfg(), 0, 2))  # GPT-2's 0.1: keyed
    quiet = load_workload(HF_GPT2 + "&resid_pdrop=0.0&embd_pdrop=0.0&attn_pdrop=0.0"
                          "&summary_first_dropout=0.0")
    assert not random_parts(quiet.build_stage(_hf_cfg(), 0, 2))


# ---- real worker processes -------------------------------------------------------------------

def _run(tmp_path, name, cfg, faults=Faults(), training=TrainingSettings()):
    out = io.StringIO()
    spec = LaunchSpec(cfg, JobSpec.uniform(2, 2, 2), 4, faults, deadline_s=110,
                      run_dir=str(tmp_path), model=name, training=training, **sections(timeout=4.0))
    res = train(spec, console=Console(file=out, width=200))
    assert res.summary is not None, f"halted: {res.halted}\n{out.getvalue()}"
    return res.summary, out.getvalue()


@pytest.mark.hard_timeout(150)
@pytest.mark.parametrize("name,cfg", MODELS[:2], ids=IDS[:2])
def test_workers_without_and_with_a_kill_and_rejoin_equal_the_reference(tmp_path, name, cfg):
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(name))
    clean, _ = _run(tmp_path / "clean", name, cfg)
    assert not compare(clean, ref, TOL), compare(clean, ref, TOL)
    killed, out = _run(tmp_path / "kill", name, cfg, Faults(kills=[(1, 1, 1)], rejoins=[(1, 1, 2)]))
    assert "SIGKILL worker" in out and "is back" in out
    assert not compare(killed, ref, TOL), compare(killed, ref, TOL) + [out]


@pytest.mark.hard_timeout(150)
def test_hf_gpt2_bf16_workers_with_a_kill_equal_the_bf16_reference(tmp_path):
    pytest.importorskip("transformers")
    cfg, bf16 = _hf_cfg(), TrainingSettings(precision="bf16", total_iters=4)
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(HF_GPT2), training=bf16)
    got, out = _run(tmp_path, HF_GPT2, cfg, Faults(kills=[(0, 0, 1)], rejoins=[(0, 0, 2)]),
                    training=bf16)
    assert not compare(got, ref, BF16_TOL), compare(got, ref, BF16_TOL) + [out]


@pytest.mark.hard_timeout(150)
def test_a_stage_lost_whole_moves_a_worker_and_its_replay_draws_the_same_masks(tmp_path):
    """Both workers of stage 1 die: a stage-0 worker moves there, loads the stage from
    peer memory and the run rolls back to that snapshot; the iterations trained again, on
    another worker and another stage, draw the masks the reference drew."""
    name, cfg = MODELS[0]
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(name))
    got, out = _run(tmp_path, name, cfg, Faults(kills=[(0, 1, 1), (1, 1, 2)]))
    assert "moves from stage 0 to stage 1" in out, out
    assert not compare(got, ref, TOL), compare(got, ref, TOL) + [out]
