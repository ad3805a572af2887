"""Checkpoints in torch.distributed.checkpoint format (executor/checkpoint/).

Real worker processes and SIGKILLs: a halt (every replica of a stage lost) leaves a DCP
checkpoint that `--resume` continues exactly; periodic checkpoints (`--checkpoint-every`)
resume with the run's own `--lr`; each stage part loads with torch's own DCP API in a
script that cannot import this project; bad `--resume` / `--device` input is one line
and exit code 2.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from executor.compute.model import DEFAULT_WORKLOAD as WL
from executor.compute.config import TrainingSettings
from executor.compute.one_process.reference import checksum, compare, train_reference
from executor.inputs.launch_spec import Faults
from planner.job import JobSpec
from test_executor_runtime import CFG, M, TOL, assert_exact, logs, reference, run

pytestmark = pytest.mark.hard_timeout(150)

# Only torch (`python -I` ignores PYTHONPATH and the current directory): the parts are read
# by DCP's metadata and loaders alone, and loading them imports nothing of this project.
OUTSIDE = r"""
import sys, torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
part, out = sys.argv[1], sys.argv[2]
dcp_to_torch_save(part, out + ".torch_save.pt")
meta = FileSystemReader(part).read_metadata()
sd = {k: torch.empty(m.size, dtype=m.properties.dtype)
      for k, m in meta.state_dict_metadata.items()
      if isinstance(m, TensorStorageMetadata) and k.startswith("model.")}
dcp.load(sd, checkpoint_id=part, no_dist=True)
torch.save(sd, out + ".dcp_load.pt")
print("torch only" if not any(m.split(".")[0] in ("executor", "planner") for m in sys.modules)
      else "the project was imported")
"""


def outside_load(part, tmp_path, name):
    script = tmp_path / "outside.py"
    script.write_text(OUTSIDE)
    out = str(tmp_path / name)
    r = subprocess.run([sys.executable, "-I", str(script), part, out], capture_output=True,
                       text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "torch only" in r.stdout
    return (torch.load(out + ".torch_save.pt", weights_only=False),
            torch.load(out + ".dcp_load.pt", weights_only=True))


def test_halt_writes_dcp_checkpoint_that_loads_outside_and_resumes_exactly(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    # every worker SIGKILLed in iteration 2 and none due back: the run halts (a stage lost
    # whole no longer does: its copy on disk, or the start, is restored)
    res = run(first, 2, 2, 4, faults=Faults(kills=[(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]))
    assert res.summary is None and "no worker is due back" in res.halted, res.halted
    assert f"--resume {res.checkpoint}" in res.output
    man = json.load(open(os.path.join(res.checkpoint, "recycle.json")))
    k = man["iteration"]
    assert man["format"] == "recycle.ckpt/v3" and 0 <= k <= 1 and len(man["losses"]) == k + 1
    # Each stage part, read by torch alone, holds the parameters of the reference after k.
    ref = train_reference(CFG, 2, M, k + 1, 2)
    assert [sum(row) / len(row) for row in man["losses"]] == pytest.approx(ref.losses, abs=TOL)
    for s in range(2):
        full, loaded = outside_load(os.path.join(res.checkpoint, f"stage{s}"), tmp_path, f"s{s}")
        assert set(full) == {"model", "optim"} and full["optim"]["state"]
        for name, want in ref.state[s].items():
            assert torch.allclose(full["model"][name], want, atol=TOL), name
            assert torch.equal(loaded[f"model.{name}"], full["model"][name])
    second = tmp_path / "second"
    second.mkdir()
    res2 = run(second, 2, 2, 4, resume=res.checkpoint)
    assert_exact(res2, 2, 2, 4, second)


def _reference_with_lr_switch(cfg, D, S, iterations, switch_at, lr):
    """The reference loop with the learning rate changed before iteration `switch_at`."""
    mods = [WL.build_stage(cfg, s, S) for s in range(S)]
    opts = [WL.make_optimizer(TrainingSettings(), m.parameters()) for m in mods]
    n = D * M
    for it in range(iterations):
        if it == switch_at:
            for o in opts:
                for g in o.param_groups:
                    g["lr"] = lr
        for g in range(n):
            x, targets = WL.microbatch(cfg, it, g)
            for m in mods:
                x = m(x)
            (WL.loss_fn(x, targets) / n).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
    return [checksum(m) for m in mods]


@pytest.fixture(scope="module")
def periodic(tmp_path_factory):
    """4 iterations with --checkpoint-every 2: checkpoints of iterations 1 and 3."""
    d = tmp_path_factory.mktemp("periodic")
    res = run(d, 2, 2, 4, checkpoint_every=2)
    assert_exact(res, 2, 2, 4, d)
    return d / "checkpoints"


def test_periodic_checkpoints_and_resume_honours_lr(periodic, tmp_path):
    names = sorted(os.listdir(periodic))
    assert names == ["iter000001", "iter000003"], names
    for n in names:
        assert sorted(os.listdir(periodic / n)) == ["recycle.json", "stage0", "stage1"]
    # Continue from iteration 1's checkpoint with another --lr: it is honoured.
    from executor.launch.launcher import train
    from executor.inputs.launch_spec import LaunchSpec, sections
    from rich.console import Console
    import io
    spec = LaunchSpec(CFG, JobSpec.uniform(2, 2, M), 4, training=TrainingSettings(lr=1e-2),
                      run_dir=str(tmp_path),
                      deadline_s=50, **sections(resume=str(periodic / "iter000001"), timeout=4.0))
    res = train(spec, console=Console(file=io.StringIO()))
    assert res.summary is not None, logs(tmp_path)
    want = _reference_with_lr_switch(CFG, 2, 2, 4, 2, 1e-2)
    assert res.summary.param_checksums == pytest.approx(want, rel=TOL, abs=TOL)
    assert res.summary.losses[:2] == pytest.approx(reference(2, 2, 4).losses[:2], abs=TOL)
    unchanged = reference(2, 2, 4).param_checksums
    assert res.summary.param_checksums != pytest.approx(unchanged, rel=TOL, abs=TOL)


SMALL = ["--vocab", "32", "--seq-len", "8", "--d-model", "16", "--heads", "2", "--layers", "2",
         "--micro-batch-size", "2", "-m", "2", "--iterations", "6"]


def _cli(*args):
    from recycle.cli import app
    r = CliRunner().invoke(app, ["train", *args])
    return r.exit_code, (r.stderr if hasattr(r, "stderr") and r.stderr else r.output)


@pytest.mark.parametrize("case,args,message", [
    ("missing", ["--resume", "/nonexistent/ck"], "no checkpoint at /nonexistent/ck"),
    ("a file", ["--resume", "@file"], "is not a recycle checkpoint directory"),
    ("garbage manifest", ["--resume", "@garbage"], "cannot read"),
    ("empty dir", ["--resume", "@empty"], "holds no complete recycle checkpoint"),
    # another grid resumes when it keeps the global batch (M follows D); else one line
    ("a grid that cannot keep the batch", ["-d", "3", "--resume", "@ck"],
     "trained a global batch of 4 micro-batches (2x2x2, -d x -s x -m), this run 3x2x2 "
     "takes 6: -d must divide 4 (1, 2, 4)"),
    ("an M that breaks the batch", ["-d", "1", "-m", "2", "--resume", "@ck"],
     "give -m 4 (or leave -m out)"),
    ("another d-model", ["--d-model", "32", "--resume", "@ck"], "d_model=16, this run asks 32"),
    ("another seed", ["--seed", "5", "--resume", "@ck"], "seed=0, this run asks 5"),
    ("too few iterations", ["--iterations", "2", "--resume", "@ck"], "--iterations must be more than 4"),
    ("checkpoint every 0", ["--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
    ("checkpoint dir a file", ["--checkpoint-dir", "@file"], "is not a directory"),
    ("cuda where none", ["--device", "cuda"], "no CUDA device on this machine"),
    ("unknown device", ["--device", "tpu"], "--device must be auto, cpu or cuda"),
])
def test_bad_resume_and_device_input_is_one_line_exit_2(periodic, tmp_path, case, args, message):
    if case == "cuda where none" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    (tmp_path / "file").write_text("not a checkpoint")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "recycle.json").write_bytes(os.urandom(64))
    (tmp_path / "empty").mkdir()
    subst = {"@file": str(tmp_path / "file"), "@garbage": str(tmp_path / "garbage"),
             "@empty": str(tmp_path / "empty"), "@ck": str(periodic)}
    code, err = _cli(*SMALL, *[subst.get(a, a) for a in args])
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def _as_flat_v2(directory) -> dict:
    """Rewrite a manifest as checkpoints were written before the training settings left
    ModelConfig: format v2, one flat `model` dict holding both, no `training`."""
    path = os.path.join(directory, "recycle.json")
    with open(path) as fh:
        d = json.load(fh)
    d["model"] = {**d.pop("training"), **d["model"]}
    d["format"] = "recycle.ckpt/v2"
    with open(path, "w") as fh:
        json.dump(d, fh)
    return d


def test_a_manifest_from_before_the_split_still_loads_and_resumes(periodic, tmp_path):
    """A v2 checkpoint (model and training settings in one dict) loads as the two dicts
    and resumes exactly; its training settings are still checked (Adam's betas) and still
    fill the flags left out of `--resume DIR` (the lr)."""
    import shutil

    from executor.checkpoint import Manifest, read_checkpoint
    from executor.inputs.train_options import resumed_defaults
    old = tmp_path / "old"
    shutil.copytree(periodic, old)
    flat = _as_flat_v2(old / "iter000001")
    assert "lr" in flat["model"] and "training" not in flat
    man = Manifest.load(str(old / "iter000001"))
    assert man.training == TrainingSettings().to_dict() and "lr" not in man.model
    assert man.model == {**CFG.to_dict(), "workload": "gpt"}
    job = JobSpec.uniform(2, 2, M)
    ck = str(old / "iter000001")
    read_checkpoint(ck, job, CFG, TrainingSettings(lr=1e-2), 4)  # the lr: resumable
    # activation checkpointing changes memory and time, not the numbers: resumable too
    read_checkpoint(ck, job, CFG, TrainingSettings(activation_checkpointing="full"), 4)
    # so is an [optimizer] setting (--weight-decay): the optimizer is built from the run's
    read_checkpoint(ck, job, CFG, TrainingSettings(weight_decay=0.1), 4)
    with pytest.raises(ValueError, match=r"betas=\[0.9, 0.95\], this run asks \[0.8, 0.95\]"):
        read_checkpoint(ck, job, CFG, TrainingSettings(betas=(0.8, 0.95)), 4)
    assert resumed_defaults(man)["lr"] == TrainingSettings().lr
    (tmp_path / "run").mkdir()
    res = run(tmp_path / "run", 2, 2, 4, resume=ck)
    assert_exact(res, 2, 2, 4, tmp_path / "run")
    written = json.loads((tmp_path / "run" / "checkpoints" / "iter000003" / "recycle.json")
                         .read_text())  # a new checkpoint of the resumed run: both dicts
    assert written["format"] == "recycle.ckpt/v3" and written["training"]["lr"] == 3e-3


def test_resume_defaults_are_seen_as_such_another_schedule_drops_the_cosine_floor(tmp_path):
    """The flags --resume fills in are told apart from flags given through the context's
    parameter source. Compared with click's own enum, not the one typer vendors, that was
    never true: a cosine checkpoint resumed with --lr-schedule constant was refused for the
    checkpoint's --min-lr-ratio, and M never followed another -d."""
    from executor.checkpoint.manifest import Manifest
    from executor.compute.config import ModelConfig, TrainingSettings
    ck = tmp_path / "ck"
    ck.mkdir()
    training = TrainingSettings(lr_schedule="cosine", min_lr_ratio=0.2, total_iters=4).to_dict()
    Manifest(2, 2, 2, ModelConfig().to_dict(), 3, [[4.0] * 4] * 4, training=training).save(str(ck))
    code, err = _cli("--resume", str(ck), "--lr-schedule", "constant", "--iterations", "4")
    assert code == 2 and "--iterations must be more than 4" in err, err
    code, err = _cli("--resume", str(ck), "-d", "1", "--iterations", "4")
    assert code == 2 and "--iterations must be more than 4" in err, err  # M followed: 4
