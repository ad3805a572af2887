"""What one worker process runs by, as one value: the run's settings (executor/inputs/
worker_settings.py, read whole from the store) and what this process adds (its slot's
faults, its device, where it starts). executor/worker.py builds it; each part of the
runtime takes the fields it needs. How it checkpoints and keeps peer-memory copies is the
run's [checkpoint] section itself (run_config.py declares and defaults each setting once);
what this process derives from it (the cadence, its share of the host's memory) is read
here, not copied."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import torch

from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, Workload
from executor.inputs.run_config import CheckpointSection
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
    # --checkpoint-dir (absolute; None: no disk tier), --checkpoint-every, --snapshot-every,
    # --snapshot-memory, --log-memory, as the run resolved them
    checkpoint: CheckpointSection = CheckpointSection()
    run_id: str = ""  # marked in the parts this run writes (a restore takes only its own)
    # where the shape in force puts its checkpoint parts inside an iteration's directory
    # ("": the job's own stages; checkpoint/store.py shape_dir for a cut)
    part_shape: str = ""
    # iterations in which an injected fault may target this worker (a mid-iteration stop)
    fault_iterations: frozenset = frozenset()
    slows: tuple = ()  # (from iteration, factor): --slow's stretch of this worker

    @property
    def checkpoint_dir(self) -> Optional[str]:
        return self.checkpoint.checkpoint_dir

    @property
    def snapshot_every(self) -> int:
        """Peer-memory snapshots: 0 off, -1 auto, K (peer_snapshots/cadence.py)."""
        return self.checkpoint.snapshot_cadence

    @cached_property
    def snapshot_budget(self) -> int:
        """Bytes this worker's snapshots may hold (auto): its share of the host's."""
        from executor.runtime.peer_snapshots.cadence import budget_bytes
        return budget_bytes(self.checkpoint.snapshot_memory, self.local_workers or 1)

    @cached_property
    def log_budget(self) -> int:
        """Bytes its boundary log may hold (runtime/replay/; 0: off)."""
        from executor.runtime.peer_snapshots.cadence import log_budget
        return log_budget(self.checkpoint.log_memory, self.local_workers or 1)

    @property
    def stages(self) -> int:
        return self.job.stages

    @property
    def from_seed(self) -> bool:
        """The run started from its seed (not resumed): any stage's state before the first
        step can be rebuilt exactly, a copy a rollback may use."""
        return not self.origin_parts and self.start_iteration == 0
