"""Which iterations a worker snapshots: every K-th, K the user's or chosen from what a
snapshot costs (`--snapshot-every auto`, the default; docs/executor.md, "Peer-memory
snapshots").

auto: the run's first iteration is snapshotted (a run from its seed also has its start),
and each stage's writer publishes what that snapshot cost: the copy on the training
thread, the send's CPU on the sender thread (counted twice: the holder's receive costs
about as much, on cores the trainers may share) and the state's bytes. The first worker to step the deciding iteration (CALIBRATION iterations
later) chooses K for all: the smallest K whose snapshot costs at most TARGET of K
iterations on the dearest stage, or off when the copies a worker keeps of the largest stage
do not fit its share of the host-memory budget. The choice is written once (compare_set),
so every worker snapshots the same iterations: a rollback needs one iteration every stage
has a copy of.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Optional

from executor.protocol import SNAP_COST, SNAP_EVERY

AUTO = -1  # `snapshot_every` value of --snapshot-every auto (0: off, K >= 1: every K)
# The share of an iteration a snapshot's measured cost may take: 1%, for about 2% in fact.
# The measure (copy + twice the send's CPU) missed about half of what a snapshot cost where
# four CPU workers share two cores (benchmarks/results/snapshot_auto.md: at 2% runs paid
# 3.7%); where GPUs train and the host is idle the real cost is below the measure.
TARGET = 0.01
CALIBRATION = 4  # iterations after the first before K is chosen (the first send is done)
# Copies of one stage's state a worker may hold: up to 3 of its own stage (local.py) and a
# holder's newest two of another's (host.py).
COPIES_HELD = 5
EVERY_KEY, COST_KEY = SNAP_EVERY, SNAP_COST


def parse_every(text) -> int:
    """--snapshot-every: auto (AUTO), off or 0 (0), or K >= 1 iterations."""
    value = str(text).strip().lower()
    if value == "auto":
        return AUTO
    if value == "off":
        return 0
    try:
        k = int(value)
    except ValueError:
        k = -2
    if k < 0:
        raise ValueError(f"--snapshot-every must be auto, off or a number of iterations "
                         f"(0: off), not {text!r}")
    return k


def every_text(k: int) -> str:
    return "auto" if k == AUTO else "off" if k == 0 else str(k)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.I)


def parse_budget(text: str, flag: str = "--snapshot-memory") -> tuple[str, float]:
    """--snapshot-memory (or `flag`): a share of the host's memory ("25%") or bytes ("8G",
    "512M"). Returns ("share", fraction) or ("bytes", n)."""
    value = str(text).strip()
    if value.endswith("%"):
        try:
            pct = float(value[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise ValueError(f"{flag} must be a share of the host's memory in "
                             f"(0, 100]% or a size like 8G, not {text!r}")
        return "share", pct / 100
    m = _SIZE.match(value)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"{flag} must be a share of the host's memory like "
                         f"25% or a size like 8G, not {text!r}")
    return "bytes", float(m[1]) * 1024 ** "_kmgt".index((m[2] or "_").lower())


def host_memory() -> int:
    """This host's memory in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 1024 ** 3


def budget_bytes(text: str, local_workers: int, flag: str = "--snapshot-memory") -> int:
    """One worker's share of the host-memory budget."""
    kind, value = parse_budget(text, flag)
    total = value * host_memory() if kind == "share" else value
    return int(total / max(1, local_workers))


@dataclass(frozen=True)
class Choice:
    every: int  # 0: off
    why: str

    def to_json(self) -> str:
        return json.dumps({"every": self.every, "why": self.why})

    @classmethod
    def from_json(cls, text) -> "Choice":
        d = json.loads(text)
        return cls(int(d["every"]), d.get("why", ""))


def choose(costs: list[dict], iteration_s: float, budget: int) -> Choice:
    """K from the stages' measured snapshot costs ({copy_s, send_s, bytes} each) and the
    time of an iteration; off when COPIES_HELD copies of the largest stage exceed `budget`."""
    largest = max((c["bytes"] for c in costs), default=0)
    mb = largest / 2 ** 20
    if largest * COPIES_HELD > budget:
        return Choice(0, f"off: {COPIES_HELD} copies of a {mb:.1f} MiB stage exceed the "
                         f"{budget / 2 ** 20:.0f} MiB a worker may hold (--snapshot-memory)")
    # the holder's receive costs about what the send does (loopback TCP is symmetric), on
    # cores the trainers may share: count the send twice
    cost = max((c["copy_s"] + 2 * c.get("send_s", 0.0) for c in costs), default=0.0)
    k = max(1, math.ceil(cost / (TARGET * max(iteration_s, 1e-6)) - 1e-9))
    return Choice(k, f"auto: a snapshot costs {1e3 * cost:.1f} ms of CPU (copy, send and "
                     f"receive of a "
                     f"{mb:.1f} MiB stage), an iteration {1e3 * iteration_s:.1f} ms: every "
                     f"{k} keeps it within {TARGET:.0%}")


class Cadence:
    """due(iteration) for one worker; with AUTO, measures and agrees on K through `store`."""

    def __init__(self, every: int, stages: int, first: int = 0, store=None,
                 budget: int = 2 ** 62, log: Callable[[str], None] = lambda msg: None):
        self.stages, self.first, self.store, self.budget, self.log = stages, first, store, budget, log
        self.auto = every == AUTO
        self.decide_at = first + CALIBRATION
        self.choice: Optional[Choice] = None if self.auto else Choice(every, "fixed")
        self._step_end: dict[int, float] = {}  # iteration -> when this worker stepped it
        self.own: Optional[dict] = None  # this worker's calibration snapshot's cost

    def due(self, iteration: int) -> bool:
        """Snapshot after stepping `iteration`? Called once per step."""
        if self.choice is None:  # only the calibration's steps are timed
            self._step_end[iteration] = time.perf_counter()
        if self.choice is None and iteration != self.first:
            self._read()  # chosen already (this process joined late, or another was first)
        if self.choice is None:
            if iteration == self.first:
                return True  # the calibration snapshot
            if iteration < self.decide_at:
                return False
            mine = self._propose(iteration)
            self.choice = Choice.from_json(self.store.compare_set(EVERY_KEY, "", mine.to_json()))
            self._said()
        k = self.choice.every
        return k > 0 and (iteration + 1) % k == 0

    def measured(self, stage: int, copy_s: float, send_s: float, nbytes: int,
                 writer: bool, store=None) -> None:
        """The calibration snapshot's cost (a writer's, send included, for everyone);
        `store`: the calling thread's own connection."""
        self.own = {"copy_s": copy_s, "send_s": send_s, "bytes": nbytes}
        if writer:
            (store or self.store).set(COST_KEY.format(stage), json.dumps(self.own))

    def _read(self) -> None:
        if self.store.check([EVERY_KEY]):
            self.choice = Choice.from_json(self.store.get(EVERY_KEY))
            self._said()

    def _said(self) -> None:
        c = self.choice
        self.log(f"snapshots every {c.every} iterations ({c.why})" if c.every
                 else f"snapshots {c.why}")

    def _propose(self, iteration: int) -> Choice:
        costs = []
        for s in range(self.stages):
            key = COST_KEY.format(s)
            if self.store.check([key]):
                costs.append(json.loads(self.store.get(key)))
        if self.own is not None:
            costs.append(self.own)
        # the fastest iteration since the first: the steady state (the first few carry the
        # warm-up, which made K too small when averaged in)
        # (consecutive iterations only, in order: a rollback re-steps an earlier one later)
        ends = self._step_end
        gaps = [ends[i + 1] - ends[i] for i in range(self.first, iteration)
                if i in ends and i + 1 in ends and ends[i + 1] > ends[i]]
        iteration_s = min(gaps, default=1.0)
        if not costs:  # nothing measured in this process (it joined late): be safe
            return Choice(10, "auto: no snapshot measured yet; every 10")
        return choose(costs, iteration_s, self.budget)


def log_budget(text: str, local_workers: int) -> int:
    """--log-memory: one worker's bytes (a share of the host or a size; off or 0: none).
    ValueError, naming the flag, for anything else."""
    if str(text).strip().lower() in ("off", "0", "0%"):
        return 0
    return budget_bytes(text, local_workers, "--log-memory")
