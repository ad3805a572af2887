"""What one worker process runs by, as one value: the run's settings (executor/inputs/
worker_settings.py, read whole from the store) and what this process adds (its slot's
faults, its device, where it starts). executor/worker.py builds it; each part of the
runtime takes the fields it needs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, Workload
from executor.timeouts import Timeouts
from planner.job import JobSpec


@dataclass(frozen=True)
class WorkerConfig:
    model: ModelConfig
    job: JobSpec
    iterations: int
    training: TrainingSettings = TrainingSettings()
    workload: Workload = DEFAULT_WORKLOAD
    timeouts: Timeouts = Timeouts()
    device: torch.device = torch.device("cpu")
    local_workers: Optional[int] = None  # workers sharing this machine (None: one a GPU)
    start_iteration: int = 0  # the run's first (after a resume, the checkpoint's + 1)
    # the parts of the checkpoint the run resumed from (any shape: loaded by name), the
    # run's origin a rollback may go back to; empty for a run from its seed
    origin_parts: tuple = ()
    load_origin: bool = False  # this process starts from them (a first incarnation)
    checkpoint_dir: Optional[str] = None
    run_id: str = ""  # marked in the parts this run writes (a restore takes only its own)
    # where the shape in force puts its checkpoint parts inside an iteration's directory
    # ("": the job's own stages; checkpoint/store.py shape_dir for a cut)
    part_shape: str = ""
    checkpoint_every: int = 1
    # iterations in which an injected fault may target this worker (a mid-iteration stop)
    fault_iterations: frozenset = frozenset()
    slows: tuple = ()  # (from iteration, factor): --slow's stretch of this worker
    snapshot_every: int = 0  # peer-memory snapshots: 0 off, -1 auto, K
    snapshot_budget: int = 2 ** 62  # bytes this worker's snapshots may hold (auto)
    log_budget: int = 0  # bytes its boundary log may hold (runtime/replay/; 0: off)

    @property
    def stages(self) -> int:
        return self.job.stages

    @property
    def from_seed(self) -> bool:
        """The run started from its seed (not resumed): any stage's state before the first
        step can be rebuilt exactly, a copy a rollback may use."""
        return not self.origin_parts and self.start_iteration == 0
