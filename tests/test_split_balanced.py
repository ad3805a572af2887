"""`--split balanced`: boundaries that balance profiled per-layer cost, honoured by
layer_range for every family, end to end (profile, then train exact against the
reference on the same split), and its bad input."""
import dataclasses
import itertools
import random

import pytest
import torch
from typer.testing import CliRunner

from executor.compute.model import ModelConfig, build_full, build_stage, layer_range
from executor.compute.one_process.reference import Summary, compare
from executor.models import llama
from executor.models.balance import balanced_boundaries, stage_costs
from planner.job import JobSpec
from recycle.cli import app


def one_line_exit_2(r, says):
    err = r.stderr if getattr(r, "stderr", None) else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], err


def splits(L, S):
    """Every contiguous split of L blocks into S stages (boundaries non-decreasing)."""
    return itertools.combinations_with_replacement(range(L + 1), S - 1)


def test_balanced_boundaries_are_optimal_against_brute_force():
    rng = random.Random(7)
    for _ in range(300):
        L, S = rng.randint(0, 7), rng.randint(1, 5)
        costs = [rng.randint(1, 40) for _ in range(L + 2)]
        got = balanced_boundaries(costs, S)
        assert len(got) == S - 1 and list(got) == sorted(got)
        key = lambda b: (max(stage_costs(costs, b)), sum(c * c for c in stage_costs(costs, b)))
        best = min(key(b) for b in splits(L, S))
        assert key(got) == best, (costs, S, got)


def test_costly_ends_get_fewer_blocks():
    # a head worth three blocks: the last stage keeps one block, stage 0 takes three
    assert balanced_boundaries([1, 10, 10, 10, 10, 30], 2) == (3,)
    assert balanced_boundaries([30, 10, 10, 10, 10, 1], 2) == (1,)
    # ties in the bottleneck go to the evener split, not an idle stage 0
    assert balanced_boundaries([1, 10, 10, 10, 10, 40], 3) == (2, 4)
    assert balanced_boundaries([1, 10, 10, 10, 10, 1], 2) == (2,)


def test_layer_range_honours_boundaries_and_refuses_bad_ones():
    assert [layer_range(6, s, 3, (1, 5)) for s in range(3)] == [(0, 1), (1, 5), (5, 6)]
    assert [layer_range(2, s, 3, (0, 0)) for s in range(3)] == [(0, 0), (0, 0), (0, 2)]
    assert layer_range(6, 0, 1, (1, 5)) == (0, 6)  # the unsplit model holds every block
    assert layer_range(4, 1, 2, ()) == (2, 4)
    for bad in [(3, 2), (1,), (1, 7), (-1, 2)]:
        with pytest.raises(ValueError, match="do not split 6 layers into 3 stages"):
            layer_range(6, 0, 3, bad)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_both_families_build_the_balanced_split(family):
    cfg = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_kv_heads=1, n_layers=5,
                      micro_batch_size=2, boundaries=(3, 4))
    build, full = ((build_stage, build_full) if family == "gpt"
                   else (llama.build_stage, llama.build_full))
    parts = [build(cfg, s, 3) for s in range(3)]
    blocks = [sorted(int(k) for k in (p.blocks if family == "gpt" else p.layers))
              for p in parts]
    assert blocks == [[0, 1, 2], [3], [4]]
    ref = dict(full(cfg).named_parameters())
    got = {n: t for p in parts for n, t in p.named_parameters()}
    assert got.keys() == ref.keys() and all(torch.equal(got[n], ref[n]) for n in ref)


# A GPT whose head (vocab 8192) costs about four blocks: balanced gives stage 0 more blocks.
# Its 262,144 head weights also caught `--reference` running on every core while the
# workers run on one: its stage-1 checksum was 0.0039 off theirs (Adam magnifies the
# rounding of near-zero gradients), with or without --split balanced.
SHAPE = ["--vocab", "8192", "--d-model", "32", "--layers", "4", "--seq-len", "16",
         "--micro-batch-size", "4"]


@pytest.mark.hard_timeout(150)
def test_profile_then_train_balanced_is_exact(tmp_path):
    job = tmp_path / "job.json"
    r = CliRunner().invoke(app, ["profile", *SHAPE, "-d", "2", "-s", "2", "-m", "2",
                                 "--repeats", "2", "--split", "balanced", "-o", str(job)])
    assert r.exit_code == 0, r.output
    spec = JobSpec.model_validate_json(job.read_text())
    assert len(spec.layer_cost) == 4 + 2
    bounds = balanced_boundaries(spec.layer_cost, 2)
    assert spec.layer_cost[-1] > spec.layer_cost[1] and bounds[0] > 2, (spec.layer_cost, bounds)
    assert f"balanced boundaries {list(bounds)}" in r.output
    r = CliRunner().invoke(app, ["plan", str(job), "--fail", "0:1"])  # the planner ignores it
    assert r.exit_code == 0, r.output
    run, ref, even = (tmp_path / f"{n}.json" for n in ("run", "ref", "even"))
    common = ["train", *SHAPE, "--iterations", "2"]
    r = CliRunner().invoke(app, [*common, "--job", str(job), "--kill", "0:1@1", "--timeout",
                                 "4", "--run-dir", str(tmp_path), "--summary", str(run)])
    assert r.exit_code == 0, r.output  # --split balanced is the default for this job
    r = CliRunner().invoke(app, [*common, "--job", str(job), "--split", "balanced",
                                 "--reference", "--summary", str(ref)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, [*common, "-d", "2", "-s", "2", "-m", "2", "--reference",
                                 "--summary", str(even)])
    assert r.exit_code == 0, r.output
    a, b, c = (Summary.load(str(p)) for p in (run, ref, even))
    assert not compare(a, b, 1e-5), compare(a, b, 1e-5)
    # the same model trained alike, its blocks held by other stages than the even split's
    assert all(abs(x - y) < 1e-5 for x, y in zip(a.losses, c.losses))
    assert abs(sum(a.param_checksums) - sum(c.param_checksums)) < 1e-3
    assert abs(a.param_checksums[0] - c.param_checksums[0]) > 1e-3


def test_split_bad_input_gets_one_line(tmp_path):
    plain, costed = tmp_path / "plain.json", tmp_path / "costed.json"
    plain.write_text(JobSpec.uniform(2, 2, 2).model_dump_json())
    costed.write_text(JobSpec.uniform(2, 2, 2).model_copy(
        update={"layer_cost": [5, 9, 9, 9, 9, 20]}).model_dump_json())
    cases = [
        (["train", "--split", "balanced"], "--split balanced needs per-layer costs: pass --job"),
        (["train", "--split", "balanced", "--job", str(plain)],
         f"--job {plain} has none; write it with `recycle profile --split balanced`"),
        (["train", "--job", str(costed), "--split", "layers"],
         "was profiled on the balanced split"),
        (["train", "--job", str(costed), "--layers", "6"],
         "has per-layer costs of 4 blocks, this model has 6"),
        (["train", "--split", "diagonal"], "--split must be one of layers, balanced, not 'diagonal'"),
        (["profile", "--split", "diagonal", "-o", str(tmp_path / "x.json")],
         "--split must be one of layers, balanced, not 'diagonal'"),
    ]
    for args, says in cases:
        one_line_exit_2(CliRunner().invoke(app, args), says)
    assert not (tmp_path / "x.json").exists()
