"""`--model NAME` (built-in or package.module:factory) for `recycle train` and `profile`:
the name reaches every worker, and the reference trains the same workload."""
import json

import pytest
from typer.testing import CliRunner

from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import Summary, compare, train_reference
from executor.inputs.workload_name import load_workload
from planner.job import JobSpec
from recycle.cli import app

MLP = "examples.mlp_workload:workload"
SMALL = ["--vocab", "8", "--seq-len", "4", "--d-model", "16", "--layers", "2",
         "--micro-batch-size", "2"]
CFG = ModelConfig(vocab=8, seq_len=4, d_model=16, n_layers=2, micro_batch_size=2)


def one_line_exit_2(r, says):
    err = r.stderr if getattr(r, "stderr", None) else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], err


@pytest.mark.hard_timeout(120)
def test_train_user_model_killed_and_rejoined_is_exact(tmp_path):
    out = tmp_path / "summary.json"
    r = CliRunner().invoke(app, ["train", "--model", MLP, *SMALL, "-d", "2", "-s", "2",
                                 "-m", "2", "--iterations", "4", "--kill", "1:0@1",
                                 "--rejoin", "1:0@2", "--timeout", "4",
                                 "--run-dir", str(tmp_path), "--summary", str(out)])
    assert r.exit_code == 0, r.output
    got = Summary.load(str(out))
    ref = train_reference(CFG, 2, 2, 4, 2, workload=load_workload(MLP))
    assert not compare(got, ref, 1e-5), r.output
    assert compare(got, train_reference(CFG, 2, 2, 4, 2))  # not the built-in GPT's run
    failed = [p["failed"] for p in json.loads(out.read_text())["plans"]]
    assert [[1, 0]] in failed and failed[-1] == [], failed  # killed, then back
    # its checkpoint names the model: resuming it as the built-in GPT is refused
    r = CliRunner().invoke(app, ["train", *SMALL, "-d", "2", "-s", "2", "-m", "2",
                                 "--iterations", "6", "--model", "gpt",
                                 "--resume", str(tmp_path / "checkpoints")])
    one_line_exit_2(r, f"was trained with workload='{MLP}', this run asks 'gpt' (--model)")


def test_profile_user_model_writes_a_plannable_job(tmp_path):
    job = tmp_path / "job.json"
    r = CliRunner().invoke(app, ["profile", "--model", MLP, *SMALL, "-d", "2", "-s", "2",
                                 "--repeats", "2", "-o", str(job)])
    assert r.exit_code == 0, r.output
    spec = JobSpec.model_validate_json(job.read_text())
    gpt = tmp_path / "gpt.json"
    r = CliRunner().invoke(app, ["profile", *SMALL, "-s", "2", "--repeats", "2", "-o", str(gpt)])
    assert r.exit_code == 0, r.output
    # the MLP's stages hold other parameters than the GPT's: OPT's all-reduce estimate shows it
    assert spec.cost.OPT != JobSpec.model_validate_json(gpt.read_text()).cost.OPT
    r = CliRunner().invoke(app, ["plan", str(job), "--fail", "0:1"])
    assert r.exit_code == 0, r.output


BAD = {
    "not_a_workload": "def workload():\n    return {'build_stage': None}\n",
    "random_init": ("import torch\nfrom examples.mlp_workload import workload as mlp\n"
                    "from executor.compute.model import Workload\n"
                    "def build(cfg, s, S):\n    return torch.nn.Linear(4, 4)\n"
                    "def workload():\n    return Workload(build_stage=build, "
                    "loss_fn=mlp().loss_fn, microbatch=mlp().microbatch)\n"),
    "broken": "import no_such_package_here\n",
}


@pytest.mark.parametrize("model,says", [
    ("no_such_mod_9:workload", "cannot import no_such_mod_9: ModuleNotFoundError"),
    ("examples.mlp_workload:nothing", "has no 'nothing'"),
    ("lama", "neither a built-in (gpt, llama, llama:debug"),
    ("bad_not_a_workload:workload", "returned a dict, not an executor.compute.model.Workload"),
    ("bad_random_init:workload", "two builds of stage 0 have different parameters"),
    ("bad_broken:workload", "cannot import bad_broken"),
])
@pytest.mark.parametrize("command", ["train", "profile"])
def test_bad_model_is_one_line_exit_2(tmp_path, monkeypatch, command, model, says):
    for name, text in BAD.items():
        (tmp_path / f"bad_{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    extra = ["--run-dir", str(run_dir)] if command == "train" else ["-o", str(tmp_path / "j.json")]
    r = CliRunner().invoke(app, [command, "--model", model, *SMALL, *extra])
    one_line_exit_2(r, says)
    assert not list(run_dir.iterdir())  # refused before any worker started
