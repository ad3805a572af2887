"""Random fault schedules for `recycle chaos`: pure data, drawn deterministically per seed.

A schedule is a grid, a run length and a list of faults written as `recycle train` flags
(--kill R:S@I, --rejoin R:S@I, --stall R:S@I:SECONDS), plus, with --service, one SIGKILL
of the service and its outage. Liveness is simulated iteration by iteration while drawing,
so a schedule never kills a dead worker, never rejoins a live one, kills at most two
workers per iteration and never leaves a stage without a live worker: any halt or crash
it provokes is the runtime's fault, not the schedule's.

Liveness follows the runtime: a rejoin `R:S@J` keeps the worker out (dead) until the run
reaches J, when its new process starts and is admitted before J trains, so it may be
killed again only from J+1 on.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from recycle.chaos.liveness import Liveness

Worker = tuple[int, int]

GRIDS = ((2, 2), (3, 2), (2, 3))  # D x S with D >= 2 and D*S <= 6 (a 2-core machine)
MAX_KILLS_PER_ITERATION = 2
P_REJOIN = 0.75  # a killed worker comes back...
REJOIN_DELAY = (1, 4)  # ...this many iterations later
P_DONOR_KILL = 0.5  # kill the same-stage peer a rejoining worker loads its state from
# Under a service a stalled worker reported as suspect is declared failed once it has been
# silent for the suspect grace (a quarter of the 10 s heartbeat timeout): stalls stay short
# of that there, so a stall never turns into a death the schedule did not plan for.
STALL_S = {False: (0.5, 4.0), True: (0.5, 1.5)}


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "rejoin" | "stall"
    worker: Worker
    iteration: int
    seconds: Optional[float] = None  # stalls only

    @property
    def target(self) -> str:
        return f"{self.worker[0]}:{self.worker[1]}@{self.iteration}"

    def flag(self) -> list[str]:
        value = self.target + (f":{self.seconds:g}" if self.kind == "stall" else "")
        return [f"--{self.kind}", value]

    def short(self) -> str:
        return self.kind[0] + self.target + (f"/{self.seconds:g}s" if self.kind == "stall" else "")


@dataclass(frozen=True)
class ServiceOutage:
    at_s: float  # seconds after `recycle train` starts: SIGKILL the service
    outage_s: float  # then restart it on the same DB and port this much later


@dataclass(frozen=True)
class Schedule:
    seed: int
    index: int
    replicas: int
    stages: int
    microbatches: int
    iterations: int
    faults: tuple[Fault, ...] = ()
    outage: Optional[ServiceOutage] = None  # set only for --service schedules
    service: bool = False

    @property
    def grid(self) -> str:
        return f"{self.replicas}x{self.stages}"

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def to_args(self) -> list[str]:
        """The `recycle train` flags: the grid, the run length and every fault."""
        args = ["-d", str(self.replicas), "-s", str(self.stages), "-m", str(self.microbatches),
                "--iterations", str(self.iterations)]
        for f in self.faults:
            args += f.flag()
        return args

    def describe(self) -> str:
        parts = [" ".join(f.short() for f in self.faults) or "-"]
        if self.outage:
            parts.append(f"svc-kill@{self.outage.at_s:g}s+{self.outage.outage_s:g}s")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "index": self.index, "service": self.service,
                "replicas": self.replicas, "stages": self.stages,
                "microbatches": self.microbatches, "iterations": self.iterations,
                "faults": [{"kind": f.kind, "worker": list(f.worker), "iteration": f.iteration,
                            **({"seconds": f.seconds} if f.seconds is not None else {})}
                           for f in self.faults],
                "outage": None if self.outage is None else
                {"at_s": self.outage.at_s, "outage_s": self.outage.outage_s}}


def draw(seed: int, runs: int, service: bool = False) -> list[Schedule]:
    """`runs` schedules; schedule k depends only on (seed, k, service), so `--runs 1` repeats
    the first schedule of `--runs 5`."""
    return [draw_one(seed, k, service) for k in range(runs)]


def draw_one(seed: int, index: int, service: bool = False) -> Schedule:
    rng = random.Random(f"recycle-chaos/{seed}/{index}/{'service' if service else 'local'}")
    D, S = rng.choice(GRIDS)
    M = rng.randint(2, 4)
    # Fewer iterations with a service: a death is only declared there after a suspect
    # grace or a heartbeat timeout, so each fault costs seconds.
    N = rng.randint(8, 10) if service else rng.randint(12, 16)
    faults = _faults(rng, D, S, N, M, service)
    outage = None
    if service:
        # Early enough to land inside the run (service runs last ~15-30 s here).
        outage = ServiceOutage(at_s=round(rng.uniform(2.0, 10.0), 1),
                               outage_s=round(rng.uniform(1.0, 15.0), 1))
    return Schedule(seed, index, D, S, M, N, tuple(faults), outage, service)


def _faults(rng: random.Random, D: int, S: int, N: int, M: int, service: bool) -> list[Fault]:
    alive = Liveness(D, S, M)  # every membership the runtime may reach (moves included)
    back_at: dict[Worker, int] = {}  # dead worker -> the iteration it is due back
    # Iterations of the random kills (donor kills come on top); with replacement, so an
    # iteration may get two. The first always lands: everyone is live then and D >= 2.
    targets = sorted(rng.randrange(N) for _ in range(rng.randint(1, 3 if service else 4)))
    stalls_left = rng.randint(0, 2)
    out: list[Fault] = []
    grid = [(r, s) for r in range(D) for s in range(S)]

    def kill(w: Worker, i: int) -> None:
        out.append(Fault("kill", w, i))
        if i + 1 <= N - 2 and rng.random() < P_REJOIN:  # back in time to train a little
            j = rng.randint(i + 1, min(i + REJOIN_DELAY[1], N - 2))
            back_at[w] = j
            out.append(Fault("rejoin", w, j))

    for i in range(N):
        back = sorted(w for w, j in back_at.items() if j == i)
        for w in back:
            del back_at[w]
        killed: list[Worker] = []
        # a victim: live in every reachable membership, and no order of this iteration's
        # events leaves a stage without a live worker
        fits = lambda w: (w not in back and w not in killed and w not in dead  # noqa: E731
                          and alive.after(back, killed + [w]) is not None)
        dead = alive.dead() - set(back)
        joined = alive.after(back, []) or []
        for w in back:  # donor kills: peers of the stage the rejoining worker may fill
            stages = alive.stage_of(w, joined)
            donors = [p for p in grid if alive.stage_of(p, joined) & stages and fits(p)]
            if donors and len(killed) < MAX_KILLS_PER_ITERATION and rng.random() < P_DONOR_KILL:
                killed.append(rng.choice(donors))
                kill(killed[-1], i)
        for _ in range(targets.count(i)):
            if len(killed) >= MAX_KILLS_PER_ITERATION:
                break
            victims = [w for w in grid if fits(w)]
            if victims:
                killed.append(rng.choice(victims))
                kill(killed[-1], i)
        alive.states = alive.after(back, killed)
        if stalls_left and rng.random() < stalls_left / max(1, N - i):
            stalls_left -= 1
            lo, hi = STALL_S[service]
            live = sorted(set(grid) - alive.dead())
            out.append(Fault("stall", rng.choice(live), i, round(rng.uniform(lo, hi), 1)))
    order = {"kill": 0, "rejoin": 1, "stall": 2}
    return sorted(out, key=lambda f: (f.iteration, order[f.kind], f.worker))
