"""Job spec: the grid, the per-stage costs and the memory model (DESIGN section 5).

Durations are integers in one unit chosen by whoever writes the spec. Everything the
planner derives (per-worker durations, capacities in micro-batches, delays) lives here so
that every back-end, the validator and the lower bound read the same numbers.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

Duration = Annotated[int, Field(strict=True, ge=0)]
Positive = Annotated[int, Field(strict=True, ge=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cost(_Strict):
    F: list[Duration]
    I: list[Duration]  # noqa: E741 - the action letter of DESIGN section 2
    W: list[Duration]
    OPT: list[Duration]


class P2P(_Strict):
    intra: Duration = 0
    cross: Duration = 0


class Memory(_Strict):
    activation: list[Duration]
    capacity: list[Duration]


class JobSpec(_Strict):
    replicas: Positive
    stages: Positive
    microbatches: Positive
    cost: Cost
    p2p: P2P = P2P()
    memory: Optional[Memory] = None
    # Optional straggler model: speed[d][s] > 0 scales worker (d, s)'s durations by 1/speed.
    speed: Optional[list[list[Annotated[float, Field(gt=0, le=100)]]]] = None

    @model_validator(mode="after")
    def _check_shapes(self) -> "JobSpec":
        S = self.stages
        for name in ("F", "I", "W", "OPT"):
            got = len(getattr(self.cost, name))
            if got != S:
                raise ValueError(f"cost.{name} has {got} entries, expected one per stage ({S})")
        if self.memory is not None:
            for name in ("activation", "capacity"):
                got = len(getattr(self.memory, name))
                if got != S:
                    raise ValueError(f"memory.{name} has {got} entries, expected {S}")
            for s in range(S):
                if self.memory.capacity[s] < self.memory.activation[s]:
                    raise ValueError(
                        f"memory.capacity[{s}]={self.memory.capacity[s]} cannot hold even one "
                        f"micro-batch (activation {self.memory.activation[s]})")
        if self.speed is not None:
            if len(self.speed) != self.replicas or any(len(r) != S for r in self.speed):
                raise ValueError(f"speed must be {self.replicas} rows of {S} factors")
        return self

    # ---- derived numbers (cached: the spec is frozen) ------------------------------
    @property
    def num_microbatches(self) -> int:
        return self.replicas * self.microbatches

    def owner(self, g: int) -> int:
        """Replica a global micro-batch belongs to."""
        return g // self.microbatches

    def duration(self, op: str, replica: int, stage: int) -> int:
        if op == "B":
            return self.duration("I", replica, stage) + self.duration("W", replica, stage)
        base = getattr(self.cost, op)[stage]
        if self.speed is None or base == 0:
            return base
        return max(1, round(base / self.speed[replica][stage]))

    def delay(self, replica_a: int, replica_b: int) -> int:
        return self.p2p.intra if replica_a == replica_b else self.p2p.cross

    @cached_property
    def min_delay(self) -> int:
        return min(self.p2p.intra, self.p2p.cross) if self.replicas > 1 else self.p2p.intra

    def slots(self, stage: int) -> Optional[int]:
        """How many micro-batches one worker of `stage` can hold at once (None: no limit)."""
        if self.memory is None or self.memory.activation[stage] == 0:
            return None
        return self.memory.capacity[stage] // self.memory.activation[stage]

    def spec_hash(self) -> str:
        canon = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @classmethod
    def load(cls, path: str) -> "JobSpec":
        with open(path) as fh:
            return cls.model_validate_json(fh.read())

    @classmethod
    def uniform(cls, replicas: int, stages: int, microbatches: int, *, F: int = 10, I: int = 10,
                W: int = 8, OPT: int = 5, intra: int = 1, cross: int = 2,
                activation: Optional[int] = 4, capacity: Optional[int] = 40) -> "JobSpec":
        """A job whose stages all cost the same: handy for tests and benchmarks."""
        memory = None
        if activation is not None and capacity is not None:
            memory = Memory(activation=[activation] * stages, capacity=[capacity] * stages)
        return cls(replicas=replicas, stages=stages, microbatches=microbatches,
                   cost=Cost(F=[F] * stages, I=[I] * stages, W=[W] * stages, OPT=[OPT] * stages),
                   p2p=P2P(intra=intra, cross=cross), memory=memory)
