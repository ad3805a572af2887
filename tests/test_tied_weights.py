"""Weights tied across stages (issue 22 item 1): an embedding on stage 0 that is also the
head on the last stage, each stage holding a copy (executor/runtime/steps/tied.py), and a plain
nn.Module factory split by module names (executor/models/modules.py).

The reference with the weight truly shared (one stage) and the split reference (copies,
the gradient summed owner + mirror) must agree; the in-process runner and real worker
processes (SIGKILL of a worker on either tied stage, then its rejoin, with and without
clipping) must equal the split reference within 1e-5, and the copies stay bit-identical."""
import dataclasses
import io

import pytest
import torch
from rich.console import Console

from examples.tied_lm import AlbertLM, TiedLM, pieces, workload
from executor.compute.one_process.local import run_plan_locally
from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.one_process.reference import compare, train_reference
from executor.inputs.workload_name import check_workload, load_workload
from executor.launch.launcher import train
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.models.modules import module_workload
from executor.runtime.steps.tied import Tie, ties_of
from planner.job import JobSpec
from planner.solvers.backends import solve
from planner.solvers.timeline import Mode

pytestmark = pytest.mark.hard_timeout(150)
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
TOL = 1e-5
NAME = "examples.tied_lm:TiedLM?split=" + ",".join(pieces(2))


def test_split_finds_the_tie_and_keeps_full_model_names():
    wl = workload()
    s0, s1 = wl.build_stage(CFG, 0, 2), wl.build_stage(CFG, 1, 2)
    assert ties_of(s0) == ties_of(s1) == [Tie(((0, "emb.weight"), (1, "head.weight")))]
    assert torch.equal(s0.emb.weight, s1.head.weight)
    full = dict(wl.build_stage(CFG, 0, 1).named_parameters())
    assert ties_of(wl.build_stage(CFG, 0, 1)) == []  # one stage: truly shared, no copy
    assert {n for n, _ in s0.named_parameters()} | {n for n, _ in s1.named_parameters()} \
        == set(full) | {"head.weight"}


def test_copies_sum_like_one_shared_weight():
    """Split reference (copies, owner + mirror) = one-stage reference (one tensor), and the
    copies are equal bit for bit after every step."""
    one = train_reference(CFG, 2, 2, 4, 1, workload=workload())
    two = train_reference(CFG, 2, 2, 4, 2, workload=workload())
    assert max(abs(a - b) for a, b in zip(one.losses, two.losses)) <= TOL
    assert torch.equal(two.state[0]["emb.weight"], two.state[1]["head.weight"])
    ref = one.state[0]["emb.weight"]
    assert float((two.state[0]["emb.weight"] - ref).abs().max()) <= TOL


@pytest.mark.parametrize("clip", [0.0, 0.05])
@pytest.mark.parametrize("dead", [(1, 1), (0, 0)], ids=["mirror-stage", "owner-stage"])
def test_in_process_runner_with_a_failure_equals_reference(clip, dead):
    tr = TrainingSettings(clip=clip)
    ref = train_reference(CFG, 2, 2, 4, 2, training=tr, workload=workload())
    plan = solve(JobSpec.uniform(2, 2, 2), [], solver="greedy")
    got = run_plan_locally(CFG, plan, 4, {1: [list(dead)]}, workload=workload(), training=tr)
    assert not compare(got, ref, TOL)
    assert torch.equal(got.state[0]["emb.weight"], got.state[1]["head.weight"])


def test_a_split_that_leaves_out_a_piece_is_refused():
    wl = module_workload(TiedLM, ["emb", "blocks.0", "norm", "head"])
    with pytest.raises(ValueError, match="leaves out parameters of the model: blocks.1"):
        wl.build_stage(CFG, 0, 2)
    with pytest.raises(ValueError, match="no submodule 'blocks.7'"):
        module_workload(TiedLM, ["emb", "blocks.7"]).build_stage(CFG, 0, 2)


def test_factory_and_split_on_the_command_line():
    wl = check_workload(NAME, CFG, 2)
    assert ties_of(wl.build_stage(CFG, 1, 2))
    with pytest.raises(ValueError, match="give split=PIECE"):
        load_workload("examples.tied_lm:TiedLM?pieces=emb")
    with pytest.raises(ValueError, match="not an nn.Sequential"):
        module_workload(TiedLM).build_stage(CFG, 0, 1)
    seq = module_workload(lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(),
                                                      torch.nn.Linear(4, 4)))
    assert [n for n, _ in seq.build_stage(CFG, 1, 2).named_parameters()] == ["2.weight", "2.bias"]


ALBERT = "examples.tied_lm:AlbertLM?split=" + ",".join(pieces(3))


def test_albert_reuse_within_and_across_stages():
    """One block object at every layer: used twice within stage 0 (layers 0 and 1) and
    once on stage 1 (layer 2, a tie of every block parameter), plus the tied head."""
    cfg = dataclasses.replace(CFG, n_layers=3)
    wl = load_workload(ALBERT)
    ties = ties_of(wl.build_stage(cfg, 0, 2))
    assert len(ties) == 7 and Tie(((0, "blocks.0.fc1.weight"), (1, "blocks.2.fc1.weight"))) in ties
    one = train_reference(cfg, 2, 2, 3, 1, workload=wl)
    two = train_reference(cfg, 2, 2, 3, 2, workload=wl)
    assert max(abs(a - b) for a, b in zip(one.losses, two.losses)) <= TOL
    plan = solve(JobSpec.uniform(2, 2, 2), [], solver="greedy")
    assert not compare(run_plan_locally(cfg, plan, 3, {1: [[0, 1]]}, workload=wl), two, TOL)


def _run(tmp_path, cfg, kills, rejoins, model=NAME, mode=Mode(), training=TrainingSettings()):
    out = io.StringIO()
    spec = LaunchSpec(cfg, JobSpec.uniform(2, 2, 2), 4, Faults(kills=kills, rejoins=rejoins),
                      training=training, deadline_s=90, run_dir=str(tmp_path),
                      model=model, mode=mode,
                      **sections(timeout=4.0))
    res = train(spec, console=Console(file=out, width=200))
    assert res.summary is not None, f"halted: {res.halted}\n{out.getvalue()}"
    return res, out.getvalue()


@pytest.mark.parametrize("dead,clip", [((1, 1), 0.0), ((0, 0), 0.05)],
                         ids=["kill-mirror", "kill-owner-clipped"])
def test_processes_sigkill_and_rejoin_on_a_tied_stage_equal_reference(tmp_path, dead, clip):
    tr = TrainingSettings(clip=clip)
    res, out = _run(tmp_path, CFG, [(*dead, 1)], [(*dead, 2)], training=tr)
    assert "SIGKILL worker" in out and "is back" in out
    ref = train_reference(CFG, 2, 2, 4, 2, training=tr, workload=load_workload(NAME))
    diffs = compare(res.summary, ref, TOL)
    assert not diffs, "\n".join(diffs) + "\n" + out


def test_processes_albert_fused_backward_synchronous_with_a_kill(tmp_path):
    """The shared-weight reuse case through a SIGKILL and a rejoin, under the other
    schedule family (fused B, synchronous optimizer: a barrier after every iteration)."""
    cfg = dataclasses.replace(CFG, n_layers=3)
    res, out = _run(tmp_path, cfg, [(1, 0, 1)], [(1, 0, 2)], model=ALBERT,
                    mode=Mode(split_backward=False, staggered=False))
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(ALBERT))
    diffs = compare(res.summary, ref, TOL)
    assert not diffs, "\n".join(diffs) + "\n" + out


def test_processes_albert_split_backward_kill_on_stage_1(tmp_path):
    cfg = dataclasses.replace(CFG, n_layers=3)
    res, out = _run(tmp_path, cfg, [(0, 1, 2)], [(0, 1, 3)], model=ALBERT)
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(ALBERT))
    diffs = compare(res.summary, ref, TOL)
    assert not diffs, "\n".join(diffs) + "\n" + out


def test_exchange_keys_are_deleted_once_every_worker_is_past_them():
    from executor.compute.one_process.local import LocalRunner
    from executor.runtime.steps.tied import TiedExchange
    runner = LocalRunner(CFG, solve(JobSpec.uniform(2, 2, 2), [], solver="greedy"), workload())
    for it in range(3):
        runner.iteration(it)
    gone = [TiedExchange.key("grad", 0, 0, 1), TiedExchange.key("value", 0, 0, 0),
            TiedExchange.key("grad", 0, 1, 1), TiedExchange.key("value", 0, 1, 0)]
    kept = [TiedExchange.key("grad", 0, 2, 1), TiedExchange.key("value", 0, 2, 0)]
    assert not any(runner.store.check([k]) for k in gone)
    assert runner.store.check(kept)  # iteration 2 is committed only when 3 is stepped


def test_a_gradient_view_travels_without_its_flat_buffer():
    from executor.runtime.steps.tied import _pack, _unpack
    flat = torch.arange(100_000, dtype=torch.float32)  # the stage's all-reduced gradients
    blob = _pack({0: flat[10:20]})
    assert len(blob) < 4_000 and torch.equal(_unpack(blob)[0], flat[10:20])
