"""What every worker process of a run needs to know, as one typed value: written whole by
the coordinator into its store (key `config`) and read back whole by executor/worker.py,
so no field is re-defaulted on the way. How the run checkpoints and recovers ([checkpoint])
and talks ([comm]) are RunConfig's sections as the coordinator resolved them (the
checkpoint directory made absolute, the checkpoint resumed from found), not field copies:
a setting added to a section reaches every worker with nothing else written. Never a
secret: the store is unauthenticated (the
service's worker token reaches workers apart, see worker.py)."""
from __future__ import annotations

import json
import dataclasses
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Optional

from executor.compute.config import ModelConfig, TrainingSettings
from executor.inputs.run_config import CheckpointSection, CommSection
from planner.job import JobSpec

if TYPE_CHECKING:
    from executor.inputs.launch_spec import LaunchSpec


@dataclass(frozen=True)
class WorkerSettings:
    model: ModelConfig
    training: TrainingSettings  # optimizer, schedule, clipping, precision, data
    job: JobSpec
    iterations: int
    run_id: str
    workload: str = "gpt"  # --model NAME: every worker loads the same Workload
    # checkpoint_dir absolute, resume the checkpoint a first incarnation starts from
    checkpoint: CheckpointSection = CheckpointSection()
    comm: CommSection = CommSection()  # timeout, device
    local_workers: Optional[int] = None  # workers on this machine (None: torchrun'd)
    kills: list = field(default_factory=list)  # [r, s, iteration]: where to wait for a signal
    stalls: list = field(default_factory=list)
    slows: list = field(default_factory=list)  # [r, s, iteration, factor]
    service: Optional[dict] = None  # url and job id of the plan service (no token)

    @classmethod
    def of(cls, spec: "LaunchSpec", run_id: str, checkpoint_dir: str, resume: Optional[str],
           service=None) -> "WorkerSettings":
        """The workers' part of a local run, with what the coordinator adds: the run's id,
        where checkpoints go, the checkpoint resumed from, the service to follow."""
        f = spec.faults
        ck = dataclasses.replace(spec.checkpoint, checkpoint_dir=checkpoint_dir, resume=resume)
        return cls(spec.cfg, spec.training, spec.job, spec.iterations, run_id,
                   workload=spec.model, checkpoint=ck, comm=spec.comm,
                   local_workers=None if spec.external else spec.job.replicas * spec.job.stages,
                   kills=[list(k) for k in f.kills], stalls=[list(k) for k in f.stalls],
                   slows=[list(k) for k in f.slows],
                   service=service.worker_config() if service else None)

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if k not in ("model", "training", "job")}
        d.update(model=self.model.to_dict(), training=self.training.to_dict(),
                 job=self.job.model_dump(mode="json"))
        return json.dumps(d)

    @classmethod
    def from_json(cls, text) -> "WorkerSettings":
        d = json.loads(text)
        return cls(**{**d, "model": ModelConfig.from_dict(d["model"]),
                      "training": TrainingSettings.from_dict(d["training"]),
                      "job": JobSpec.model_validate(d["job"]),
                      "checkpoint": CheckpointSection(**d["checkpoint"]),
                      "comm": CommSection(**d["comm"])})
