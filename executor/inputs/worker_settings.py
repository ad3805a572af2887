"""What every worker process of a run needs to know, as one typed value: written whole by
the coordinator into its store (key `config`) and read back whole by executor/worker.py,
so no field is re-defaulted on the way. Never a secret: the store is unauthenticated (the
service's worker token reaches workers apart, see worker.py)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Optional

from executor.compute.config import ModelConfig, TrainingSettings
from executor.runtime.peer_snapshots.cadence import AUTO, DEFAULT_BUDGET, DEFAULT_LOG_MEMORY
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
    timeout: float = 5.0
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 1
    snapshot_every: int = AUTO  # peer-memory snapshots every K iterations (0: off, -1: auto)
    snapshot_memory: str = DEFAULT_BUDGET  # the host-memory budget of auto (cadence.py)
    log_memory: str = DEFAULT_LOG_MEMORY  # the boundary logs' (runtime/replay/)
    resume: Optional[str] = None  # the checkpoint a first incarnation starts from
    device: str = "auto"
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
        return cls(spec.cfg, spec.training, spec.job, spec.iterations, run_id,
                   workload=spec.model, timeout=spec.timeout, checkpoint_dir=checkpoint_dir,
                   checkpoint_every=spec.checkpoint_every, resume=resume, device=spec.device,
                   local_workers=None if spec.external else spec.job.replicas * spec.job.stages,
                   kills=[list(k) for k in f.kills], stalls=[list(k) for k in f.stalls],
                   slows=[list(k) for k in f.slows], snapshot_every=spec.snapshot_every,
                   snapshot_memory=spec.snapshot_memory, log_memory=spec.log_memory,
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
                      "job": JobSpec.model_validate(d["job"])})
