"""Job spec: the grid, the per-stage costs and the memory model (docs/design.md section 5).

Durations are integers in one unit chosen by whoever writes the spec. Everything the
planner derives (per-worker durations, capacities in micro-batches, delays) lives here so
that every back-end, the validator and the lower bound read the same numbers.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

# ---- bounds on every integer a spec carries ------------------------------------------
# A spec is untrusted input (the service registers what a client posts), and every plan
# computed from it must fit where plans go: SQLite INTEGER columns (int64: the plan
# cache's and the service's `period`), CP-SAT's int64 domains, and JSON read by clients
# whose numbers are doubles. The rule:
#   1. each duration and delay (F, I, W, OPT, p2p) is at most MAX_DURATION = 10**12, each
#      memory figure at most MAX_MEMORY = 10**15; replicas, stages and micro-batches are
#      each at most MAX_COUNT = 10**6 (the API's worker indices share that bound), and
#      replicas*stages*microbatches at most MAX_CELLS = 2**30;
#   2. the horizon (`JobSpec.horizon`) is at most MAX_TIME = 2**53. It is the number of
#      actions a plan can hold, D*S*(3M+1), times the longest of them on the slowest worker
#      (F+I+W+OPT of a stage, divided by the worker's speed) plus the longest delay. Every
#      time a plan holds (starts, ends, period, makespan, lower bound) is at most that:
#      a schedule with no needless idling never waits longer than the sum of every action
#      and every message before it, even if one worker ends up with all D*M micro-batches
#      of its stage. So plan times fit in 53 bits (exact as JSON doubles), leaving 2**10 of
#      headroom under int64 for sums such as D*M*(F+I+W) in bounds and solvers.
# A spec over any bound is rejected by validation (HTTP 422 in the service) with the
# field and the limit in the reason.
MAX_DURATION = 10**12
MAX_MEMORY = 10**15
MAX_COUNT = 10**6
MAX_CELLS = 2**30
MAX_TIME = 2**53

Duration = Annotated[int, Field(strict=True, ge=0, le=MAX_DURATION)]
MemoryAmount = Annotated[int, Field(strict=True, ge=0, le=MAX_MEMORY)]
Positive = Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cost(_Strict):
    F: list[Duration]
    I: list[Duration]  # noqa: E741 - the action letter of docs/design.md section 2
    W: list[Duration]
    OPT: list[Duration]


class P2P(_Strict):
    intra: Duration = 0
    cross: Duration = 0


class Memory(_Strict):
    activation: list[MemoryAmount]
    capacity: list[MemoryAmount]


class JobSpec(_Strict):
    replicas: Positive
    stages: Positive
    microbatches: Positive
    cost: Cost
    p2p: P2P = P2P()
    memory: Optional[Memory] = None
    # Optional straggler model: speed[d][s] > 0 scales worker (d, s)'s durations by 1/speed.
    speed: Optional[list[list[Annotated[float, Field(gt=0, le=100)]]]] = None
    # Optional per-layer F+I+W [embedding, blocks..., head] (executor/models/balance.py).
    layer_cost: Optional[list[Duration]] = None
    # Optional move cost (planner/control/roles.py): bytes of one stage's parameters plus optimizer
    # state, per stage, and the link bandwidth in bytes per time unit of this spec. A worker
    # that changes stage loads state_bytes[s] at that bandwidth.
    state_bytes: Optional[list[Annotated[int, Field(strict=True, ge=0, le=2**50)]]] = None
    bandwidth: Optional[Annotated[float, Field(gt=0, le=1e18)]] = None
    # Optional: the activation checkpointing `memory` was measured under (`recycle profile
    # --activation-checkpointing full`); a run that recomputes less needs more than it says.
    activation_checkpointing: Optional[Annotated[str, Field(max_length=32)]] = None

    @model_serializer(mode="wrap")
    def _omit_no_state(self, handler):
        # Specs without a move cost dump as they did before these fields existed, so their
        # spec_hash (the plan cache's key) and stored JSON are unchanged.
        out = handler(self)
        if isinstance(out, dict):
            for name in ("state_bytes", "bandwidth", "activation_checkpointing"):
                if name in out and out[name] is None:
                    del out[name]
        return out

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
        if self.state_bytes is not None and len(self.state_bytes) != S:
            raise ValueError(f"state_bytes has {len(self.state_bytes)} entries, expected {S}")
        if self.speed is not None:
            if len(self.speed) != self.replicas or any(len(r) != S for r in self.speed):
                raise ValueError(f"speed must be {self.replicas} rows of {S} factors")
        cells = self.replicas * S * self.microbatches
        if cells > MAX_CELLS:
            raise ValueError(f"replicas*stages*microbatches = {cells} exceeds {MAX_CELLS}")
        if self.horizon > MAX_TIME:
            raise ValueError(
                f"durations too long for this grid: a plan could last up to {self.horizon:.3g} "
                f"(actions times the longest action plus the longest delay), over the limit "
                f"of 2**53; use a coarser time unit")
        return self

    @property
    def horizon(self) -> float:
        """An upper bound on every time in any plan of this job (see MAX_TIME above); a
        float, since speeds are (inf for a speed so small that durations overflow)."""
        S = self.stages
        longest = 0.0
        for s in range(S):
            total = self.cost.F[s] + self.cost.I[s] + self.cost.W[s] + self.cost.OPT[s]
            slowest = 1.0 if self.speed is None else min(row[s] for row in self.speed)
            longest = max(longest, total / slowest + 4)  # + 4: each op rounds up at most 1
        per_action = longest + max(self.p2p.intra, self.p2p.cross)
        return float(self.replicas * S * (3 * self.microbatches + 1)) * per_action

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

    def move_time(self, stage: int) -> int:
        """Time units to load `stage`'s state over the link (0 when the spec gives no
        state_bytes or bandwidth: a move then costs only the plan change)."""
        if self.state_bytes is None or self.bandwidth is None:
            return 0
        return int(-(-self.state_bytes[stage] // self.bandwidth))

    def spec_hash(self) -> str:
        canon = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def identity_hash(self) -> str:
        """The job's identity: its spec without `speed`. Speeds change at run time (a
        straggler, planner/speeds.py) while the job stays the same one: workers fence plans
        of other jobs by this, not by spec_hash (which keys cached plans)."""
        return self.model_copy(update={"speed": None}).spec_hash()

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
