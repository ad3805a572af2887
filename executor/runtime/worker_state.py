"""A worker process's own facts, typed (docs/executor.md, "One iteration"): who it is, which
slot it fills, what it has trained, which plan versions it has seen and entered. The agent
loop, the plan fence and the state sync read and write these, nothing else of each other."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

Worker = tuple[int, int]


@dataclass
class WorkerState:
    home: Worker  # who this worker is: its first slot, id "R.S" (heartbeats, incarnations)
    incarnation: int = 1  # which process of this worker we are (membership)
    me: Worker = None  # the slot it fills now, which a plan's roles may change
    # holds no trained state of its stage: restarted, or moved in; it comes from a holder
    fresh: bool = False
    entered: bool = False  # has been admitted to some plan version
    leaving: bool = False  # training ended for us (done, fenced out, halted): exit 0
    done: int = -1  # last iteration this worker has stepped
    # the oldest copy a rollback to peer-memory snapshots may use: -1 (the run's start,
    # rebuilt from the seed) for a run from its seed, None for a resumed one
    origin: Optional[int] = -1
    version: int = -1  # newest plan version seen (the fence)
    refused: int = -1  # newest version refused (another job's): not asked for again
    asked: int = -1  # newest version on which we asked to be admitted
    in_version: Optional[int] = None  # newest version entered with its state in place
    restored_at: int = -1  # the iteration of the last rollback to peer-memory snapshots
    writer: bool = False  # this worker writes its stage's checkpoint parts and snapshots
    last_compute: Optional[tuple[int, float]] = None  # (iteration, s per micro-batch)
    losses: dict = field(default_factory=dict)  # the last stage's, ALLREDUCE to OPT
    # the disk checkpoints it reported when a version's entry gathered what members hold
    # (iteration -> parts: stage_state/disk_tier.py); what it restores from, if chosen
    disk: dict = field(default_factory=dict)

    def __post_init__(self):
        self.me = self.me or self.home
        self.fresh = self.fresh or self.incarnation > 1

    @property
    def name(self) -> str:
        return f"{self.home[0]}.{self.home[1]}"
