"""Random fault schedules for `recycle chaos`: pure data, drawn deterministically per seed.

A schedule is a grid, a run length and a list of faults written as `recycle train` flags
(--kill R:S@I, --rejoin R:S@I, --stall R:S@I:SECONDS), plus, with --service, one SIGKILL
of the service and its outage. Liveness is simulated iteration by iteration while drawing,
so a schedule never kills a dead worker, never rejoins a live one and never leaves the
run with no plan: any halt or crash it provokes is the runtime's fault, not the schedule's.

Half the schedules are elastic: the run keeps peer-memory snapshots (--snapshot-every K),
so plans move workers between stages and a stage may lose every worker (one moves in and
the job rolls back to a snapshot, or to its start). Their faults also come in the kinds
that exercise it (`Fault.why`): a whole stage lost, a whole node (a replica row: one
machine locally) lost and later added back as one, a kill of a snapshot holder, and a
kill in the iteration of a move, of the mover or of the stage it moves to.

Liveness follows the runtime: a rejoin `R:S@J` keeps the worker out (dead) until the run
reaches J, when its new process starts and is admitted before J trains, so it may be
killed again only from J+1 on.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from recycle.chaos.liveness import LOCAL_HORIZON, Liveness

Worker = tuple[int, int]

GRIDS = ((2, 2), (3, 2), (2, 3))  # D x S with D >= 2 and D*S <= 6 (a 2-core machine)
MAX_KILLS_PER_ITERATION = 2  # single kills; a stage or node lost together comes on top
P_REJOIN = 0.75  # a killed worker comes back...
REJOIN_DELAY = (1, 4)  # ...this many iterations later
P_DONOR_KILL = 0.5  # kill the same-stage peer a rejoining worker loads its state from
# Under a service a stalled worker reported as suspect is declared failed once it has been
# silent for the suspect grace (a quarter of the 10 s heartbeat timeout): stalls stay short
# of that there, so a stall never turns into a death the schedule did not plan for.
STALL_S = {False: (0.5, 4.0), True: (0.5, 1.5)}
P_ELASTIC = 0.5  # a schedule keeps snapshots and draws the elastic kinds below
SNAPSHOT_EVERY = (1, 3)  # its K
P_GROUP = 0.5  # a drawn kill becomes the loss of a whole stage or node
P_NODE_BACK = 0.75  # a lost node may come back (every worker of it at once), and then
#                     does with P_REJOIN, as any rejoin
P_HOLDER = 0.5  # a single kill picks a snapshot holder
P_MOVE_KILL = 0.5  # a move in this iteration draws a kill of the mover or its new stage
GROUP_KINDS = ("stage", "node")


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "rejoin" | "stall"
    worker: Worker
    iteration: int
    seconds: Optional[float] = None  # stalls only
    # kills and rejoins: what the draw aimed at ("random", "donor", "stage", "node",
    # "holder", "move"); reporting only, the flags are the same
    why: str = ""

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
    snapshot_every: int = 0  # > 0: an elastic schedule (--snapshot-every K)

    @property
    def grid(self) -> str:
        return f"{self.replicas}x{self.stages}"

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def to_args(self) -> list[str]:
        """The `recycle train` flags: the grid, the run length and every fault."""
        args = ["-d", str(self.replicas), "-s", str(self.stages), "-m", str(self.microbatches),
                "--iterations", str(self.iterations)]
        if self.snapshot_every:
            args += ["--snapshot-every", str(self.snapshot_every)]
        for f in self.faults:
            args += f.flag()
        return args

    def kinds(self) -> set[str]:
        """The elastic kinds of fault this schedule draws (see the module docstring)."""
        out = {f.why for f in self.faults if f.kind == "kill" and f.why in
               (*GROUP_KINDS, "holder", "move")}
        nodes = {(f.worker[0], f.iteration) for f in self.faults
                 if f.kind == "rejoin" and f.why == "node"}
        return out | ({"node add"} if nodes else set())

    def describe(self) -> str:
        parts = ([f"K{self.snapshot_every}"] if self.snapshot_every else []) + \
            [" ".join(f.short() for f in self.faults) or "-"]
        if self.outage:
            parts.append(f"svc-kill@{self.outage.at_s:g}s+{self.outage.outage_s:g}s")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "index": self.index, "service": self.service,
                "snapshot_every": self.snapshot_every, "replicas": self.replicas,
                "stages": self.stages,
                "microbatches": self.microbatches, "iterations": self.iterations,
                "faults": [{"kind": f.kind, "worker": list(f.worker), "iteration": f.iteration,
                            **({"seconds": f.seconds} if f.seconds is not None else {}),
                            **({"why": f.why} if f.why else {})}
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
    K = rng.randint(*SNAPSHOT_EVERY) if rng.random() < P_ELASTIC else 0
    faults = _faults(rng, D, S, N, M, service, K)
    outage = None
    if service:
        # Early enough to land inside the run (service runs last ~15-30 s here).
        outage = ServiceOutage(at_s=round(rng.uniform(2.0, 10.0), 1),
                               outage_s=round(rng.uniform(1.0, 15.0), 1))
    return Schedule(seed, index, D, S, M, N, tuple(faults), outage, service, K)


def horizon(replicas: int, stages: int, microbatches: int, service: bool) -> float:
    """What moves are weighed over: a local run's, or the service's default for the job."""
    if not service:
        return LOCAL_HORIZON
    from api.jobs.runtime import ServiceConfig  # the service's own rule, not a copy of it
    from planner.job import JobSpec
    return ServiceConfig().elastic_horizon_of(JobSpec.uniform(replicas, stages, microbatches))


def _faults(rng: random.Random, D: int, S: int, N: int, M: int, service: bool,
            K: int = 0) -> list[Fault]:
    # every membership the runtime may reach (moves included)
    alive = Liveness(D, S, M, snapshots=K > 0, horizon=horizon(D, S, M, service))
    back_at: dict[Worker, tuple[int, str]] = {}  # dead worker -> (iteration due back, why)
    # Iterations of the random kills (donor kills come on top); with replacement, so an
    # iteration may get two. The first always lands: everyone is live then and D >= 2.
    targets = sorted(rng.randrange(N) for _ in range(rng.randint(1, 3 if service else 4)))
    stalls_left = rng.randint(0, 2)
    out: list[Fault] = []
    grid = [(r, s) for r in range(D) for s in range(S)]

    def rejoin_at(i: int) -> Optional[int]:
        if i + 1 <= N - 2 and rng.random() < P_REJOIN:  # back in time to train a little
            return rng.randint(i + 1, min(i + REJOIN_DELAY[1], N - 2))
        return None

    def kill(w: Worker, i: int, why: str, back: Optional[int] = -1) -> None:
        out.append(Fault("kill", w, i, why=why))
        j = rejoin_at(i) if back == -1 else back
        if j is not None:
            back_at[w] = (j, "node" if why == "node" else "")
            out.append(Fault("rejoin", w, j, why=back_at[w][1]))

    for i in range(N):
        back = sorted(w for w, (j, _) in back_at.items() if j == i)
        for w in back:
            del back_at[w]
        killed: list[Worker] = []
        dead = alive.dead() - set(back)
        # a victim: live in every reachable membership, and no order of this iteration's
        # events leaves the run without a plan
        fits = lambda ws: (all(w not in back and w not in killed and w not in dead  # noqa: E731
                               for w in ws) and alive.after(back, killed + list(ws)) is not None)
        joined = alive.after(back, []) or []
        for w in back:  # donor kills: peers of the stage the rejoining worker may fill
            stages = alive.stage_of(w, joined)
            donors = [p for p in grid if alive.stage_of(p, joined) & stages and fits([p])]
            if donors and len(killed) < MAX_KILLS_PER_ITERATION and rng.random() < P_DONOR_KILL:
                killed.append(rng.choice(donors))
                kill(killed[-1], i, "donor")
        for _ in range(targets.count(i)):
            group = _group(rng, alive, D, S, fits) if K and not killed and \
                rng.random() < P_GROUP else None
            if group is not None:
                why, ws = group
                j = rejoin_at(i) if why == "node" and rng.random() < P_NODE_BACK else None
                for w in ws:
                    kill(w, i, why, j if why == "node" else -1)
                killed += ws
                continue
            if sum(1 for f in out if f.kind == "kill" and f.iteration == i) >= \
                    MAX_KILLS_PER_ITERATION:
                break
            victims = [w for w in grid if fits([w])]
            holders = [w for w in victims if w in alive.holders()] if K else []
            if holders and rng.random() < P_HOLDER:
                killed.append(rng.choice(holders))
                kill(killed[-1], i, "holder")
            elif victims:
                killed.append(rng.choice(victims))
                kill(killed[-1], i, "random")
        if K and killed and rng.random() < P_MOVE_KILL:  # a kill while a move is under way
            victims = sorted(w for w in alive.movers(alive.after(back, killed) or [])
                             if fits([w]))
            if victims:
                killed.append(rng.choice(victims))
                kill(killed[-1], i, "move")
        alive.states = alive.after(back, killed)
        if stalls_left and rng.random() < stalls_left / max(1, N - i):
            stalls_left -= 1
            lo, hi = STALL_S[service]
            live = sorted(set(grid) - alive.dead())
            out.append(Fault("stall", rng.choice(live), i, round(rng.uniform(lo, hi), 1)))
    order = {"kill": 0, "rejoin": 1, "stall": 2}
    return sorted(out, key=lambda f: (f.iteration, order[f.kind], f.worker))


def _group(rng: random.Random, alive: Liveness, D: int, S: int, fits
           ) -> Optional[tuple[str, list[Worker]]]:
    """A whole stage (every worker filling it in every reachable membership) or a whole
    node (a replica row's live workers) whose loss leaves a plan; None if none does."""
    options = [("stage", sorted(alive.fillers(s))) for s in range(S)] + \
        [("node", sorted(w for w in ((r, s) for s in range(S)) if w not in alive.dead()))
         for r in range(D)]
    options = [(why, ws) for why, ws in options
               if len(ws) >= (1 if why == "stage" else 2) and fits(ws)]
    return rng.choice(options) if options else None
