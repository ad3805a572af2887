"""executor/inputs/launch_spec.py: a local run is one typed value, checked once when it is made;
each field no run could carry out is one line naming its flag."""
import dataclasses

import pytest

from executor.compute.config import ModelConfig
from executor.inputs.launch_spec import Faults, LaunchSpec
from executor.inputs.run_config import CheckpointSection, CommSection
from planner.errors import UserError
from planner.job import JobSpec

JOB = JobSpec.uniform(2, 2, 2)


def launch(job, iterations, **fields) -> LaunchSpec:
    return LaunchSpec.build(ModelConfig(), job, iterations, **fields)


def spec(**fields) -> LaunchSpec:
    return launch(JOB, 4, **fields)


@pytest.mark.parametrize("fields,says", [
    (dict(iterations=0), "--iterations must be at least 1, not 0"),
    (dict(timeout=0.0), "--timeout must be positive"),
    (dict(timeout=float("nan")), "--timeout must be positive"),
    (dict(solver="simplex"), "unknown solver 'simplex'"),
    (dict(store_port=70000), "--store-port must be a port number"),
    (dict(checkpoint_every=0), "--checkpoint-every must be at least 1"),
    (dict(snapshot_every="often"), "--snapshot-every must be auto, off or a number"),
    (dict(log_memory="lots"), "--log-memory"),
    (dict(deadline_s=0.0), "deadline_s must be positive"),
    (dict(device="tpu"), "--device must be auto, cpu or cuda"),
    (dict(faults=Faults(kills=[(2, 0, 1)])), "--kill 2:0@1: no worker 2:0 in a 2x2 grid"),
    (dict(faults=Faults(kills=[(0, 0, 4)])), "training has iterations 0..3"),
    (dict(faults=Faults(rejoins=[(0, 1, 2)])), "--rejoin 0:1@2: no --kill or --stall"),
    (dict(faults=Faults(kills=[(0, 1, 1)], restarts=[(0, 1, 0)])), "--restart 0:1@0: no --kill"),
    (dict(job=JobSpec.uniform(9, 8, 2)), "worker processes on this machine is over"),
])
def test_a_field_no_run_could_carry_out_is_one_line(fields, says):
    fields.setdefault("iterations", 4)
    with pytest.raises(UserError) as e:
        launch(fields.pop("job", JOB), fields.pop("iterations"), **fields)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_paths_are_checked_without_being_created(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    for flag, fields in (("--run-dir", dict(run_dir=str(afile))),
                         ("--checkpoint-dir", dict(checkpoint_dir=str(afile))),
                         ("--summary", dict(summary_path=str(tmp_path / "no" / "s.json")))):
        with pytest.raises(UserError, match=flag):
            spec(**fields)
    made = spec(checkpoint_dir=str(tmp_path / "new" / "ck"), run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "new").exists() and not (tmp_path / "r").exists()
    assert made.grid == (2, 2, 2)


def test_every_change_is_checked_too_and_external_workers_may_rejoin_unkilled():
    ok = spec(faults=Faults(rejoins=[(0, 1, 2)]), external=True)  # torchrun's own restart
    with pytest.raises(UserError, match="--rejoin 0:1@2"):
        dataclasses.replace(ok, comm=dataclasses.replace(ok.comm, external=False))
    with pytest.raises(TypeError):
        LaunchSpec(ModelConfig(), JOB, 4, kills=[(0, 1, 1)])  # no loose fault lists


def test_faults_from_flags_and_their_rejoin_entries():
    f = Faults.from_flags(kill=["0:1@1", "1:0@2"], rejoin=["0:1@3"], restart=["1:0@3"],
                          stall=["1:1@0:2.5"], slow=["0:0@1:0.5"])
    assert f.kills == ((0, 1, 1), (1, 0, 2)) and f.stalls == ((1, 1, 0, 2.5),)
    assert f.rejoin_entries == [(0, 1, 3, False), (1, 0, 3, True)]
    assert Faults(kills=[[0, 1, 1]]) == Faults(kills=((0, 1, 1),))  # lists from JSON
    with pytest.raises(ValueError, match="expected REPLICA:STAGE@ITERATION"):
        Faults.from_flags(kill=["0-1@1"])
    spec(faults=f)  # all of them fit a 2x2 grid of 4 iterations


def test_the_model_and_its_training_settings_travel_apart_and_whole():
    """ModelConfig holds the model only; TrainingSettings the optimizer, schedule, clip,
    precision and data. The workers' settings carry both and read both back whole."""
    import json

    from executor.compute.config import TrainingSettings, split_flat
    from executor.inputs.worker_settings import WorkerSettings
    with pytest.raises(TypeError):
        ModelConfig(lr=1e-2)  # no training field in the model's config
    cfg = ModelConfig(vocab=32, d_model=16, boundaries=(1,))
    tr = TrainingSettings(lr=1e-2, betas=(0.8, 0.9), precision="bf16", lr_schedule="cosine",
                          warmup_iters=1, total_iters=5, min_lr_ratio=0.3, clip=0.5,
                          data="/x.bin")
    ws = WorkerSettings(cfg, tr, JOB, 5, "r1", kills=[[0, 1, 2]])
    back = WorkerSettings.from_json(ws.to_json())
    assert back == ws and back.training.betas == (0.8, 0.9) and back.model.boundaries == (1,)
    assert set(json.loads(ws.to_json())["model"]) == set(cfg.to_dict())
    model, training = split_flat({**cfg.to_dict(), **tr.to_dict(), "workload": "gpt"})
    assert TrainingSettings.from_dict(training) == tr and model["workload"] == "gpt"
    assert LaunchSpec(cfg, JOB, 5, training=tr).training is tr


def test_the_recovery_and_comm_settings_are_the_run_configs_sections_not_copies(tmp_path):
    """[checkpoint] and [comm] are declared and defaulted once (run_config.py) and travel
    whole: no type between the command line and a worker re-declares one of their settings,
    and what a worker reads back is the section the coordinator resolved."""
    from dataclasses import fields

    from executor.inputs.worker_settings import WorkerSettings
    from executor.runtime.worker_config import WorkerConfig
    settings = {f.name for kind in (CheckpointSection, CommSection) for f in fields(kind)}
    for kind in (LaunchSpec, WorkerSettings, WorkerConfig):
        own = {f.name for f in fields(kind)} - ({"device"} if kind is WorkerConfig else set())
        assert not settings & own, kind.__name__  # (a worker's device: the one it picked)
    made = spec(snapshot_every="3", log_memory="1G", timeout=7.0, checkpoint_every=2)
    where = str(tmp_path / "ck")
    ws = WorkerSettings.from_json(WorkerSettings.of(made, "r", where, None).to_json())
    assert ws.checkpoint == dataclasses.replace(made.checkpoint, checkpoint_dir=where)
    assert ws.comm == made.comm and ws.comm.timeout == 7.0
    conf = WorkerConfig(ws.model, ws.job, 4, checkpoint=ws.checkpoint, local_workers=4)
    assert (conf.snapshot_every, conf.checkpoint_dir) == (3, where)
    assert conf.log_budget == 2 ** 30 // 4  # 1G shared by the host's four workers
    assert WorkerConfig(ws.model, ws.job, 4).snapshot_every == -1  # auto, as `train`'s default
