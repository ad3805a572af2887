"""Failure models of a dedicated cluster: what fails, how often, what it takes down, how
long until it is back. `sample` turns one into a trace (trace.Event) the simulator runs,
as it runs a spot trace.

A model is a list of causes, each with a rate per GPU-hour, a scope (what one event takes
down), a repair time (until the unit is back: repaired, or replaced by a spare host) and
how it is found:
  scope  "gpu"     one GPU: its worker (a worker is a host's GPUs: tensor parallel inside
                   the host, as Llama 3 ran, so a GPU's loss is its worker's);
         "host"    one host: its worker;
         "switch"  a top-of-rack switch or its cable: every worker under the switch;
         "job"     the whole job (a dependency it cannot train without);
  hang   found only when a watchdog fires (`watchdog_s` after the fault): until then the
         synchronous job waits on the hung worker, so every policy stalls, and then it
         is failed as a crash is;
  planned  announced maintenance: the job is drained first (a checkpoint, no work
         lost), then the unit is down for its repair time.
Events of a cause arrive as a Poisson process with rate `rate * gpus` per hour, each on a
unit drawn uniformly; repair times are exponential with the cause's mean (a unit that
fails again while down is not failed twice: the event is dropped, as a real one would
find nothing left to break).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from planner.simulation.trace import Event, Trace, TraceError

SCOPES = ("gpu", "host", "switch", "job")


@dataclass(frozen=True)
class Cause:
    name: str
    rate: float  # events per GPU-hour
    scope: str  # SCOPES
    repair_h: float  # mean hours until the unit is back
    hang: bool = False  # found only by the watchdog
    planned: bool = False  # announced: drained first
    count: Optional[int] = None  # events in the source's record (presets), for the report


@dataclass(frozen=True)
class FailureModel:
    name: str
    gpus_per_worker: int  # a worker (one grid slot) is this many GPUs: a host's, with TP
    workers_per_switch: int  # consecutive workers (rank order) under one switch
    watchdog_s: float  # a hang is found this long after it starts
    causes: tuple[Cause, ...]
    hours: float = 24.0  # the span of the source's record: a draw's default length
    source: str = ""  # where the numbers come from
    assumptions: tuple[str, ...] = ()  # what the source does not give and we assumed

    def __post_init__(self):
        for c in self.causes:
            if c.scope not in SCOPES:
                raise TraceError(f"cause {c.name!r}: scope {c.scope!r}; choose from "
                                 f"{', '.join(SCOPES)}")
            if not (c.rate >= 0 and c.repair_h >= 0):
                raise TraceError(f"cause {c.name!r}: rate and repair time must be >= 0")

    def expected(self, gpus: int, hours: float) -> dict[str, float]:
        """Events per cause a run of `gpus` GPUs for `hours` expects."""
        return {c.name: c.rate * gpus * hours for c in self.causes}


def sample(model: FailureModel, replicas: int, stages: int, hours: float,
           seed: int = 0) -> Trace:
    """One draw of the model over a D x S grid of workers (each `gpus_per_worker` GPUs)
    for `hours`: fail and recover events in time order."""
    if hours <= 0 or not math.isfinite(hours):
        raise TraceError("the failure model needs a finite, positive --hours")
    rng = random.Random(seed)
    W = replicas * stages
    gpus = W * model.gpus_per_worker
    T = hours * 3600.0
    raw: list[tuple[float, Cause, tuple]] = []
    for c in model.causes:
        t = 0.0
        rate_s = c.rate * gpus / 3600.0
        while rate_s > 0:
            t += rng.expovariate(rate_s)
            if t >= T:
                break
            raw.append((t, c, _units(model, c, W, stages, rng)))
    raw.sort(key=lambda x: x[0])
    down_until: dict[tuple, float] = {}  # worker -> when it is back
    events: list[Event] = []
    for t, c, workers in raw:
        hit = tuple(w for w in workers if down_until.get(w, -1.0) <= t)
        if not hit:
            continue
        found = t + (model.watchdog_s if c.hang else 0.0)
        back = found + rng.expovariate(1.0 / (c.repair_h * 3600.0)) if c.repair_h > 0 else found
        for w in hit:
            down_until[w] = back
        events.append(Event(found, "fail", hit, cause=c.name,
                            hang_s=model.watchdog_s if c.hang else 0.0, planned=c.planned))
        if back < T:
            events.append(Event(back, "recover", hit, cause=c.name))
    events.sort(key=lambda e: (e.time, e.kind != "recover"))  # a repair before a failure
    return Trace(events, end=T, source=f"failure model {model.name}, seed {seed}")


def _units(model: FailureModel, c: Cause, W: int, stages: int, rng) -> tuple:
    """The workers one event of `c` takes down (rank r = replica * S + stage)."""
    def worker(r):
        return divmod(r, stages)

    if c.scope == "job":
        return tuple(worker(r) for r in range(W))
    if c.scope == "switch":
        k = max(1, model.workers_per_switch)
        first = rng.randrange(0, W, k) if W >= k else 0
        return tuple(worker(r) for r in range(first, min(W, first + k)))
    return (worker(rng.randrange(W)),)  # a GPU's or a host's: its worker


# ---- presets ------------------------------------------------------------------------------
# Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4 and table 5: Llama 3 405B
# pre-training on 16,384 H100 GPUs, a 54-day snapshot: 466 job interruptions, 47 planned
# (automated maintenance: firmware upgrades, operator-initiated configuration or dataset
# updates) and 419 unexpected, by root cause below; more than 90% effective training time.
LLAMA3_GPU_HOURS = 16_384 * 54 * 24


def _llama3() -> FailureModel:
    def c(name, count, scope, repair_h, **kw):
        return Cause(name, count / LLAMA3_GPU_HOURS, scope, repair_h, count=count, **kw)

    gpu_h, host_h = 4.0, 8.0
    return FailureModel(
        "llama3-405b", gpus_per_worker=8, workers_per_switch=2, watchdog_s=600.0,
        hours=54 * 24.0,
        causes=(
            c("faulty GPU", 148, "gpu", gpu_h),
            c("GPU HBM3 memory", 72, "gpu", gpu_h),
            c("software bug", 54, "host", 0.25),
            c("network switch or cable", 35, "switch", 2.0),
            c("host maintenance (unplanned)", 32, "host", host_h),
            c("GPU SRAM memory", 19, "gpu", gpu_h),
            c("GPU system processor", 17, "gpu", gpu_h),
            c("NIC", 7, "host", host_h),
            c("NCCL watchdog timeout", 7, "host", 0.25, hang=True),
            c("silent data corruption", 6, "gpu", gpu_h),
            c("GPU thermal interface and sensor", 6, "gpu", gpu_h),
            c("SSD", 3, "host", host_h),
            c("power supply", 3, "host", host_h),
            c("server chassis", 2, "host", host_h),
            c("IO expansion board", 2, "host", host_h),
            c("dependency", 2, "job", 0.5),
            c("CPU", 2, "host", host_h),
            c("system memory", 2, "host", host_h),
            c("planned maintenance", 47, "job", 0.25, planned=True),
        ),
        source="Meta, The Llama 3 Herd of Models (2024), section 3.3.4, table 5: 16,384 "
               "H100 GPUs, 54 days, 466 interruptions (47 planned, 419 unexpected)",
        assumptions=(
            "a worker is a host of 8 GPUs (tensor parallel inside it, as the paper's 405B "
            "run: TP 8, PP 16, DP 128), so a GPU's failure takes its host's worker down",
            "a top-of-rack switch or its cable serves 2 hosts (16 GPUs a rack, the paper's "
            "cluster)",
            "repair or replacement: 4 h for a GPU, 8 h for a host's other parts, 2 h for a "
            "switch or cable, 15 min for a software bug or a hang (the process restarted), "
            "30 min for a dependency; exponential around those means (the paper gives none)",
            "NCCL watchdog timeouts are hangs, found 10 min after they start (PyTorch's "
            "default collective timeout); every other cause is found at once",
            "planned maintenance takes the whole job down for 15 min, drained first",
        ))


PRESETS = {"llama3-405b": _llama3}


def preset(name: str) -> FailureModel:
    if name not in PRESETS:
        raise TraceError(f"unknown failure model {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]()
