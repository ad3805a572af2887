"""`recycle profile` (executor/compute/measure/profile.py): measured on the workers' thread count, each
figure a median with its spread, activation memory on CPU too, bad devices refused."""
import json

import pytest
import torch
from typer.testing import CliRunner

from executor.compute.model import ModelConfig, Workload, lm_loss
from executor.compute.measure.profile import profile
from planner.job import JobSpec

CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
SMALL = ["--vocab", "32", "--seq-len", "8", "--d-model", "16", "--heads", "2", "--layers", "2",
         "--micro-batch-size", "2"]


def test_profile_runs_on_the_workers_thread_count_and_restores_it(monkeypatch):
    seen = []

    def loss(out, targets):  # a real loss that notes the threads it runs on
        seen.append(torch.get_num_threads())
        return lm_loss(out, targets)

    before = torch.get_num_threads()
    monkeypatch.setenv("RECYCLE_THREADS", "1")
    job = profile(CFG, 2, 2, 2, repeats=2, workload=Workload(loss_fn=loss))
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before
    assert job.memory is not None and min(job.memory.activation) > 0  # measured on CPU


def test_profile_cli_writes_medians_spreads_and_memory(tmp_path):
    from recycle.cli import app
    out, det = tmp_path / "job.json", tmp_path / "details.json"
    r = CliRunner().invoke(app, ["profile", *SMALL, "-s", "2", "--repeats", "3",
                                 "-o", str(out), "--details", str(det)])
    assert r.exit_code == 0, r.output
    job = JobSpec.model_validate_json(out.read_text())
    assert job.memory is not None and all(a > 0 for a in job.memory.activation)
    assert all(c > a for a, c in zip(job.memory.activation, job.memory.capacity))
    rows = json.loads(det.read_text())
    assert len(rows) == 2 and all(r["rounds"] == 3 for r in rows)
    assert all(set(r["spread"]) >= {"F", "I", "W", "OPT"} for r in rows)
    assert "spread" in r.output and "act. bytes" in r.output


@pytest.mark.parametrize("args,message", [
    (["--device", "cuda"], "no CUDA device on this machine"),
    (["--device", "tpu"], "--device must be auto, cpu or cuda"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"),
])
def test_profile_bad_input_is_one_line_exit_2(args, message):
    if args[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    from recycle.cli import app
    r = CliRunner().invoke(app, ["profile", *SMALL, *args])
    err = r.stderr if getattr(r, "stderr", None) else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], err
