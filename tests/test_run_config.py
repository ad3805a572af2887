"""One run config (executor/inputs/run_config.py): `recycle train --config FILE` with flags
overriding it, the run's own RUN_DIR/run.toml repeating it exactly, and bad files refused
in one line with exit code 2."""
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from executor.inputs.run_config import RunConfig, read_config
from recycle.cli import app

RUN = """
[grid]
replicas = 2
stages = 2
microbatches = 2
iterations = 3

[model]
d_model = 16
layers = 2
seed = 7

[faults]
kill = ["1:0@1"]
rejoin = ["1:0@2"]
"""


def test_the_tree_round_trips_through_toml(tmp_path):
    run = RunConfig.from_flags({"replicas": 3, "lr": 0.01, "kill": ["0:1@2"], "sync": True,
                                "min_lr_ratio": None, "data": None})
    path = tmp_path / "run.toml"
    path.write_text(run.to_toml())
    back = RunConfig.from_flags(read_config(str(path)))
    assert back == run and back.grid.replicas == 3 and back.faults.kill == ["0:1@2"]
    assert back.optimizer.lr == 0.01 and back.plan.sync is True
    (tmp_path / "run.json").write_text(json.dumps({"grid": {"replicas": 3}, "plan": {"sync": True}}))
    assert read_config(str(tmp_path / "run.json")) == {"replicas": 3, "sync": True}


@pytest.mark.parametrize("text, says", [
    ("[modle]\nd_model = 3\n", "unknown section [modle]"),
    ("[model]\nd_modell = 3\n", "[model] has no setting 'd_modell'"),
    ("[model]\nd_model = \"x\"\n", "[model] d_model must be int, not 'x'"),
    ("[faults]\nkill = \"1:0@1\"\n", "[faults] kill must be a list of strings"),
    ("[plan]\nsync = 1\n", "[plan] sync must be bool"),
    ("[model\n", "at the end of a table declaration"),
    ("model = 3\n", "[model] must be a table"),
])
def test_bad_config_files_are_one_line_exit_2(tmp_path, text, says):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = CliRunner().invoke(app, ["train", "--config", str(path)])
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in out.output


def _train(*args):
    return subprocess.run([sys.executable, "-m", "recycle.cli", "train", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.procs
def test_a_config_trains_flags_override_and_run_toml_repeats_the_run(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(RUN)
    a, b = tmp_path / "a", tmp_path / "b"
    got = _train("--config", str(cfg), "--iterations", "4", "--run-dir", str(a),
                 "--summary", str(tmp_path / "a.json"))
    assert got.returncode == 0, got.stderr
    assert "worker 1:0 failed" in got.stderr  # the file's fault schedule ran
    saved = read_config(str(a / "run.toml"))
    assert saved["iterations"] == 4 and saved["seed"] == 7 and saved["kill"] == ["1:0@1"]
    again = _train("--config", str(a / "run.toml"), "--run-dir", str(b),
                   "--summary", str(tmp_path / "b.json"))
    assert again.returncode == 0, again.stderr
    x, y = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert x["losses"] == y["losses"] and x["param_checksums"] == y["param_checksums"]
    assert len(x["losses"]) == 4


def test_train_options_are_the_settings_declared_once():
    """`recycle train` re-declared 53 of RunConfig's 57 fields with their own defaults;
    its options are now generated from the fields: every setting is an option with the
    field's default and help, and the command has no other but --config and --token."""
    import dataclasses

    import typer.main

    from executor.inputs.run_config import RunConfig
    from recycle.cli import app
    cmd = typer.main.get_command(app).commands["train"]
    options = {p.name: p for p in cmd.params}
    fields = {f.name: f for sec in dataclasses.fields(RunConfig)
              for f in dataclasses.fields(sec.type if isinstance(sec.type, type)
                                          else type(getattr(RunConfig(), sec.name)))}
    assert set(options) - set(fields) == {"config", "token"}, set(options) - set(fields)
    assert set(fields) <= set(options)
    defaults = RunConfig()
    for sec in dataclasses.fields(RunConfig):
        for f in dataclasses.fields(getattr(defaults, sec.name)):
            want = getattr(getattr(defaults, sec.name), f.name)
            got = options[f.name].default
            assert (got if got is not None else None) == want or (want == [] and not got), \
                (f.name, got, want)
            assert f.metadata["doc"], f"{f.name} has no help"


def test_an_optimizer_setting_reaches_training_a_checkpoint_and_a_resume_by_name():
    """--weight-decay was added as one declaration in [optimizer] (docs/design.md): it
    reaches TrainingSettings, a resume's defaults and its notes by its name, its range is
    its declaration's, and it changes what is trained."""
    from executor.checkpoint.manifest import RESUMABLE, Manifest
    from executor.compute.config import ModelConfig, TrainingSettings
    from executor.compute.one_process.reference import train_reference
    from executor.inputs.resolve import training_settings
    from executor.inputs.train_options import resume_changes, resumed_defaults
    run = RunConfig.from_flags({"weight_decay": 0.2, "iterations": 3})
    training = training_settings(run, min_lr_ratio=None)
    assert training.weight_decay == 0.2 and TrainingSettings().weight_decay == 0.01
    assert "weight_decay" in RESUMABLE
    man = Manifest(2, 2, 2, ModelConfig().to_dict(), 0, [], training=training.to_dict())
    assert resumed_defaults(man)["weight_decay"] == 0.2
    assert resume_changes(man.training, TrainingSettings(weight_decay=0.0, total_iters=3)) \
        == ["--weight-decay 0.0 (it trained with 0.2)"]
    with pytest.raises(ValueError, match=r"^--weight-decay must be a finite number >= 0, "):
        RunConfig.from_flags({"weight_decay": float("nan")})
    cfg = ModelConfig(vocab=16, seq_len=4, d_model=8, n_heads=2, n_layers=2, micro_batch_size=2)
    a = train_reference(cfg, 1, 2, 3, 2, training=TrainingSettings(weight_decay=0.0))
    b = train_reference(cfg, 1, 2, 3, 2, training=TrainingSettings(weight_decay=0.5))
    assert a.param_checksums != b.param_checksums
