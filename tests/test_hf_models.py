"""`--model hf:CONFIG` (issue 22 item 2): Hugging Face causal LMs built from a config, split
into stages (executor/models/hf.py). Tiny GPT-2 (embedding tied to the head) and Llama
(rotary: position ids cross the stage boundary): the stages chained give transformers'
own logits, and 2x2 worker processes through a SIGKILL and a rejoin equal the one-process
reference within 1e-5. Skipped without transformers (the `hf` extra)."""
import io
import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

pytest.importorskip("transformers")

from executor.compute.model import ModelConfig  # noqa: E402
from executor.compute.one_process.reference import compare, train_reference  # noqa: E402
from executor.inputs.workload_name import check_workload, load_workload  # noqa: E402
from executor.launch.launcher import train  # noqa: E402
from executor.inputs.launch_spec import Faults, LaunchSpec, sections  # noqa: E402
from executor.models.families import architecture  # noqa: E402
from executor.models.hf import hf_config  # noqa: E402
from executor.models.modules import seeded_build  # noqa: E402
from executor.runtime.steps.tied import Tie, ties_of  # noqa: E402
from planner.job import JobSpec  # noqa: E402

pytestmark = pytest.mark.hard_timeout(150)
GPT2 = "hf:gpt2?n_layer=2&n_embd=16&n_head=2&vocab_size=32&n_positions=16"
LLAMA = ("hf:llama?hidden_size=16&intermediate_size=32&num_hidden_layers=2"
         "&num_attention_heads=2&num_key_value_heads=1&vocab_size=32&max_position_embeddings=16")
TOL = 1e-5


def cfg_of(name, **kw):
    shape = architecture(name, d_model=None, n_layers=None, n_heads=None, seq_len=8, vocab=None)
    return ModelConfig(micro_batch_size=2, **dict(shape, **kw))


def _chain(stages, x):
    for m in stages:
        x = m(*x) if isinstance(x, tuple) else m(x)
    return x


@pytest.mark.parametrize("name,tied", [(GPT2, True), (LLAMA, False),
                                       (LLAMA + "&tie_word_embeddings=true", True)],
                         ids=["gpt2", "llama", "llama-tied"])
@pytest.mark.parametrize("boundaries", [(), (0,), (2,)], ids=["even", "none-first", "none-last"])
def test_stages_chained_give_transformers_logits(name, tied, boundaries):
    from transformers import AutoModelForCausalLM
    cfg = cfg_of(name, boundaries=boundaries)
    wl = check_workload(name, cfg, 2)  # two builds: identical parameters
    x, _ = wl.microbatch(cfg, 0, 0)
    # eval: GPT-2's dropout (0.1, kept) draws nothing, so the two forwards compare
    stages = [wl.build_stage(cfg, s, 2).eval() for s in range(2)]
    full = seeded_build(cfg, lambda: AutoModelForCausalLM.from_config(hf_config(name))).eval()
    assert torch.equal(_chain(stages, x), full(x).logits)
    assert ties_of(stages[0]) == ([Tie(((0, "embed.weight"), (1, "head.weight")))] if tied else [])
    if "llama" in name:  # hidden states and position ids cross the boundary
        h = stages[0](x)
        assert isinstance(h, tuple) and h[1].dtype == torch.int64


def test_config_json_and_bad_names(tmp_path):
    conf = hf_config(GPT2).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(conf))
    assert architecture(f"hf:{tmp_path}", d_model=None, n_layers=None, n_heads=None,
                        seq_len=None, vocab=None)["n_layers"] == 2
    assert hf_config(f"hf:{tmp_path}/config.json?n_layer=3").n_layer == 3
    assert hf_config(GPT2).resid_pdrop == 0.1  # the config's dropout, keyed (test_dropout.py)
    assert hf_config(GPT2 + "&resid_pdrop=0.0").resid_pdrop == 0.0
    assert hf_config(LLAMA).head_dim == 8  # derived at construction from the overrides
    for bad, why in [("hf:nosuchmodel", "neither a config.json nor a transformers model type"),
                     ("hf:gpt2?n_wings=2", "has no field 'n_wings'"),
                     (f"hf:{tmp_path}/missing.json", "cannot read")]:
        with pytest.raises(ValueError, match=why):
            load_workload(bad)
    with pytest.raises(ValueError, match="--seq-len 32 is longer than"):
        load_workload(GPT2).build_stage(cfg_of(GPT2, seq_len=32), 0, 2)
    with pytest.raises(ValueError, match="--layers 3 contradicts --model hf:gpt2"):
        architecture(GPT2, d_model=None, n_layers=3, n_heads=None, seq_len=None, vocab=None)


def test_cli_refuses_a_bad_hf_name_in_one_line(tmp_path):
    from recycle.cli import app
    res = CliRunner().invoke(app, ["train", "--model", "hf:gpt2?n_wings=2", "--iterations", "1"])
    assert res.exit_code == 2, res.output
    assert "n_wings" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("name,dead", [(GPT2, (1, 1)), (GPT2, (0, 0)), (LLAMA, (0, 1))],
                         ids=["gpt2-kill-head-stage", "gpt2-kill-embedding-stage", "llama"])
def test_sigkill_and_rejoin_2x2_equal_reference(tmp_path, name, dead):
    cfg = cfg_of(name)
    out = io.StringIO()
    spec = LaunchSpec(cfg, JobSpec.uniform(2, 2, 2), 4,
                      Faults(kills=[(*dead, 1)], rejoins=[(*dead, 2)]), deadline_s=100,
                      run_dir=str(tmp_path), model=name, **sections(timeout=4.0))
    res = train(spec, console=Console(file=out, width=200))
    assert res.summary is not None, f"halted: {res.halted}\n{out.getvalue()}"
    assert "SIGKILL worker" in out.getvalue() and "is back" in out.getvalue()
    ref = train_reference(cfg, 2, 2, 4, 2, workload=load_workload(name))
    diffs = compare(res.summary, ref, TOL)
    assert not diffs, "\n".join(diffs) + "\n" + out.getvalue()


def test_per_layer_profile_of_a_rotary_model_for_split_balanced():
    """`recycle profile --split balanced` feeds each layer the previous one's output: a
    Llama stage's output is (hidden, position ids), whose gradient message is one tensor."""
    from executor.compute.measure.profile import profile_layers
    from executor.models.balance import balanced_boundaries
    cfg = cfg_of(LLAMA)
    costs = profile_layers(cfg, repeats=1, workload=load_workload(LLAMA))
    assert len(costs) == cfg.n_layers + 2 and min(costs) >= 1
    assert len(balanced_boundaries(costs, 2)) == 1


@pytest.mark.parametrize("stages", [1, 3], ids=["tie-within-one-stage", "tie-across-3-stages"])
def test_in_process_runner_with_a_failure_equals_reference(stages):
    """One stage: the embedding and the head are one parameter used twice (deferred W of a
    reused weight); three stages: a tie between stage 0 and stage 2 over a middle stage."""
    from executor.compute.one_process.local import run_plan_locally
    from planner.job import JobSpec
    from planner.solvers.backends import solve
    cfg = cfg_of(GPT2)
    wl = load_workload(GPT2)
    ref = train_reference(cfg, 2, 2, 3, stages, workload=wl)
    plan = solve(JobSpec.uniform(2, stages, 2), [], solver="greedy")
    got = run_plan_locally(cfg, plan, 3, {1: [[1, stages - 1]]}, workload=wl)
    assert not compare(got, ref, TOL)
