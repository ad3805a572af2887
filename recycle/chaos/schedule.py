"""Random fault schedules for `recycle chaos`: pure data, drawn deterministically per seed.

A schedule is a grid, a run length and a list of faults written as `recycle train` flags
(--kill R:S@I, --rejoin R:S@I, --stall R:S@I:SECONDS), plus, with --service, one SIGKILL
of the service and its outage. The run keeps the default flags (peer-memory snapshots on,
K chosen by `auto`), as a user would run it.

Schedules are drawn in the user's terms: worker R:S is of its home stage S, and nothing
is known of the roles, moves or snapshot holders the runtime plans. What a user can see
is what the schedule respects: it never kills a dead worker nor rejoins a live one; a
rejoin `R:S@J` lands before the kills of iteration J (its process is admitted before J
trains), so the worker is killable again from J+1 on; and after every iteration's events
at least S workers are live, except in a schedule that draws shape changes (P_SHRINK):
there at least ceil(S/2), the fewest a shape of a spec's units can run on; fewer would
pause the job (nothing is lost, but a rejoin cannot fire while it is paused). With fewer
than S live the pipeline is cut into fewer stages, locally (`--shape auto`, the default)
and by the service (a job registered with `shape=auto`, the default) alike. With
snapshots on every stage always has a copy (in peer memory, or the run's start built from
the seed), so any halt, crash or hang the schedule provokes is the runtime's fault.

Its kinds of fault (`Fault.why`, reporting only): random kills; donor kills (a peer of
the same home stage as a worker rejoining in that iteration); a whole home stage lost
(every live worker whose home stage is s); a whole node lost (a replica row's live
workers: one machine locally), maybe added back later as one; stalls; fewer live workers
than stages (a shape change); and with a service its SIGKILL and outage.

Harsher kinds (issue 42 item 5), drawn from a second stream of the same (seed, index), so
a schedule that draws none of them is the one drawn before; through a service all but
"resume" (its own stream again):
- "pause" (P_PAUSE): at one iteration the kills leave fewer live workers than any shape
  can run on (S with `--shape fixed` or a model that cannot change shape, else ceil(S/2)),
  at least one left, and every victim is due back. The run must pause, not halt: while it
  is paused no iteration advances, and the coordinator starts every pending rejoin at once
  (executor/launch/coordinator/admission.py `returning`), so they come back early; the
  schedule draws no kill until its own picture has them back.
- "rejoined kill" (P_REJOINED_KILL per rejoin): a worker killed again in the iteration it
  returns at, or the next one.
- "resume" (P_RESUME): the runner SIGKILLs the whole `recycle train` process group once
  iteration `Resume.after`'s line is logged, and runs `recycle train --resume` of its
  checkpoints on the same grid or another that keeps the global batch D x M
  (`Resume.replicas/stages/microbatches`), with faults of its own after the kill point.
- "dropout" / "mlp" (P_MODEL): a module-factory model (examples/dropout_lm.py DropoutGPT,
  examples/mlp_workload.py): neither can change shape, so fewer live workers than stages
  pause the run there (the schedule keeps S live unless it draws a pause).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

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
P_GROUP = 0.4  # a drawn kill becomes the loss of a whole home stage or node
P_NODE_BACK = 0.75  # a lost node may come back (every worker of it at once), and then
#                     does with P_REJOIN, as any rejoin
GROUP_KINDS = ("stage", "node")
P_SHRINK = 0.5  # a schedule may leave fewer live workers than stages (a shape change)
# The harsher kinds (module docstring), local schedules only:
P_PAUSE = 0.25  # a stretch with fewer live workers than any shape runs on, rejoins due
P_FIXED = 0.5  # a pause of the built-in GPT with S > 2 under `--shape fixed` (S = 2: always)
P_REJOINED_KILL = 0.3  # per rejoin: kill the worker again when it returns, or the next one
P_RESUME = 0.25  # the whole job SIGKILLed and resumed from its checkpoints
P_SAME_GRID = 0.5  # ...on the same grid (else another that keeps D x M)
P_MODEL = 0.3  # a module-factory model instead of the built-in GPT
# --model values: DropoutGPT split into its pieces for --layers 3 (runner.FACTORY_LAYERS)
MODELS = {"dropout": "examples.dropout_lm:DropoutGPT?split=emb,blocks.0,blocks.1,blocks.2,"
                     "norm,head",
          "mlp": "examples.mlp_workload:workload"}
MULTI_WHYS = GROUP_KINDS + ("pause",)  # kills that come on top of the single-kill limit


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" | "rejoin" | "stall"
    worker: Worker
    iteration: int
    seconds: Optional[float] = None  # stalls only
    # kills and rejoins: what the draw aimed at ("random", "donor", "stage", "node");
    # reporting only, the flags are the same
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
class Resume:
    """The whole job SIGKILLed once iteration `after`'s line is logged, then resumed from
    its checkpoints on this grid, with these faults (all after `after`)."""
    after: int
    replicas: int
    stages: int
    microbatches: int
    faults: tuple[Fault, ...] = ()

    @property
    def grid(self) -> str:
        return f"{self.replicas}x{self.stages}"


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
    # None: the default flags (snapshots on, K chosen by `auto`), as every drawn schedule;
    # else an explicit `--snapshot-every K` (a schedule written by hand; 0: off)
    snapshot_every: Optional[int] = None
    # None: the default (auto); else `--shape` ("fixed" drawn, "speed" by `chaos --shape`)
    shape: Optional[str] = None
    model: Optional[str] = None  # None: the built-in GPT; else a key of MODELS
    resume: Optional[Resume] = None

    @property
    def grid(self) -> str:
        return f"{self.replicas}x{self.stages}"

    @property
    def reshapes(self) -> bool:
        """Can the run cut its pipeline into fewer stages? Not under `--shape fixed`, nor
        for a module-factory model (its stages do not follow cfg.boundaries)."""
        return self.shape != "fixed" and self.model is None

    def run_floor(self) -> int:
        """The fewest live workers some shape runs on: fewer pause the run."""
        return -(-self.stages // 2) if self.reshapes else self.stages

    def final_grid(self) -> tuple[int, int, int]:
        """(D, S, M) of the run that ends the schedule (the resumed one, if any)."""
        r = self.resume
        return (self.replicas, self.stages, self.microbatches) if r is None else \
            (r.replicas, r.stages, r.microbatches)

    def resume_args(self) -> list[str]:
        """The resumed run's flags besides --resume: its grid (M left out when D changes: it
        follows D), the run length and its faults."""
        r = self.resume
        args = ["-d", str(r.replicas), "-s", str(r.stages)]
        if r.replicas == self.replicas:
            args += ["-m", str(r.microbatches)]
        args += ["--iterations", str(self.iterations)]
        if self.shape:
            args += ["--shape", self.shape]
        for f in r.faults:
            args += f.flag()
        return args

    def fresh_args(self) -> list[str]:
        """The final grid trained from scratch (a job killed before any checkpoint)."""
        D, S, M = self.final_grid()
        args = ["-d", str(D), "-s", str(S), "-m", str(M), "--iterations", str(self.iterations)]
        if self.shape:
            args += ["--shape", self.shape]
        for f in self.resume.faults:
            args += f.flag()
        return args

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def to_args(self) -> list[str]:
        """The `recycle train` flags: the grid, the run length and every fault (and an
        explicit K; none otherwise: the defaults)."""
        args = ["-d", str(self.replicas), "-s", str(self.stages), "-m", str(self.microbatches),
                "--iterations", str(self.iterations)]
        if self.snapshot_every is not None:
            args += ["--snapshot-every", str(self.snapshot_every)]
        if self.shape:
            args += ["--shape", self.shape]
        for f in self.faults:
            args += f.flag()
        return args

    def kinds(self) -> set[str]:
        """The group kinds of fault this schedule draws: a whole stage or node lost, a
        node added back, fewer live workers than stages (see the module docstring)."""
        out = {f.why for f in self.faults if f.kind == "kill" and f.why in GROUP_KINDS}
        nodes = {(f.worker[0], f.iteration) for f in self.faults
                 if f.kind == "rejoin" and f.why == "node"}
        low = self.fewest_live()
        out |= {"node add"} if nodes else set()
        out |= {"shape"} if self.reshapes and self.run_floor() <= low < self.stages else set()
        out |= {"pause"} if low < self.run_floor() else set()
        out |= {"rejoined kill"} if any(f.why == "rejoined" for f in self.of("kill")) else set()
        if self.resume is not None:
            out.add("resume")
            if self.final_grid() != (self.replicas, self.stages, self.microbatches):
                out.add("resume grid")
        if self.model is not None:
            out.add(self.model)
        return out

    def fewest_live(self) -> int:
        """The fewest live workers after any iteration's events (the user's picture)."""
        live, low = self.replicas * self.stages, self.replicas * self.stages
        for i in range(self.iterations):
            live += sum(1 for f in self.faults if f.kind == "rejoin" and f.iteration == i)
            live -= sum(1 for f in self.faults if f.kind == "kill" and f.iteration == i)
            low = min(low, live)
        return low

    def describe(self) -> str:
        k = self.snapshot_every
        parts = ([] if k is None else [f"K{k}" if k else "Koff"]) + \
            ([f"model={self.model}"] if self.model else []) + \
            ([f"shape={self.shape}"] if self.shape else []) + \
            [" ".join(f.short() for f in self.faults) or "-"]
        r = self.resume
        if r is not None:
            parts.append(f"| job-kill@{r.after} resume {r.grid} m{r.microbatches}: "
                         + (" ".join(f.short() for f in r.faults) or "-"))
        if self.outage:
            parts.append(f"svc-kill@{self.outage.at_s:g}s+{self.outage.outage_s:g}s")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"seed": self.seed, "index": self.index, "service": self.service,
                "snapshot_every": self.snapshot_every, "replicas": self.replicas,
                "stages": self.stages,
                "microbatches": self.microbatches, "iterations": self.iterations,
                "faults": [_fault_dict(f) for f in self.faults],
                "outage": None if self.outage is None else
                {"at_s": self.outage.at_s, "outage_s": self.outage.outage_s},
                "shape": self.shape, "model": self.model,
                "resume": None if self.resume is None else
                {"after": self.resume.after, "replicas": self.resume.replicas,
                 "stages": self.resume.stages, "microbatches": self.resume.microbatches,
                 "faults": [_fault_dict(f) for f in self.resume.faults]}}


def _fault_dict(f: Fault) -> dict:
    return {"kind": f.kind, "worker": list(f.worker), "iteration": f.iteration,
            **({"seconds": f.seconds} if f.seconds is not None else {}),
            **({"why": f.why} if f.why else {})}


def draw(seed: int, runs: int, service: bool = False) -> list[Schedule]:
    """`runs` schedules; schedule k depends only on (seed, k, service), so `--runs 1` repeats
    the first schedule of `--runs 5`."""
    return [draw_one(seed, k, service) for k in range(runs)]


def draw_one(seed: int, index: int, service: bool = False) -> Schedule:
    rng = random.Random(f"recycle-chaos/{seed}/{index}/{'service' if service else 'local'}")
    # the harsher kinds' choices: a stream of their own, so that a schedule drawing none of
    # them is the schedule this (seed, index) drew before they existed
    harsh = random.Random(f"recycle-chaos/{seed}/{index}/harsh")
    D, S = rng.choice(GRIDS)
    M = rng.randint(2, 4)
    # Fewer iterations with a service: a death is only declared there after a suspect
    # grace or a heartbeat timeout, so each fault costs seconds.
    N = rng.randint(8, 10) if service else rng.randint(12, 16)
    # a job spec's units are its stages, and a shape merges at most two of them (planner/
    # shapes/units.py): fewer live workers than ceil(S/2) fit no shape and pause the run
    shrink = rng.random() < P_SHRINK
    model = shape = None
    mode = "plain"
    rekill = 0.0
    # Through a service too, but for the whole job killed and resumed (the runner drives
    # `recycle train --resume` locally; a service job is registered again instead). The
    # service's draws use a stream of their own, so its old schedules stay too.
    hs = harsh if not service else random.Random(
        f"recycle-chaos/{seed}/{index}/harsh-service")
    if hs.random() < P_MODEL:
        model = hs.choice(sorted(MODELS))
    u = hs.random()
    mode = "pause" if u < P_PAUSE else "resume" if u < P_PAUSE + P_RESUME else "plain"
    if service and mode == "resume":
        mode = "plain"
    if mode == "pause" and model is None and (S == 2 or hs.random() < P_FIXED):
        shape = "fixed"  # S = 2 auto runs on one worker: fewer is none at all
    rekill = P_REJOINED_KILL
    harsh = hs
    reshapes = shape != "fixed" and model is None
    run_floor = -(-S // 2) if reshapes else S
    floor = run_floor if shrink and reshapes else S
    pause_at = harsh.randrange(1, N - 2) if mode == "pause" else None
    resume = None
    if mode == "resume":
        after = harsh.randint(2, N - 4)  # the job is killed once this iteration's line is out
        faults = _faults(rng, D, S, after + 1, service, floor, harsh=harsh, rekill=rekill)
        D2, S2, M2 = _resume_grid(harsh, D, S, M, model is None)
        later = _faults(harsh, D2, S2, N, service, S2, start=after + 1, many=(1, 2),
                        harsh=harsh, rekill=rekill)
        resume = Resume(after, D2, S2, M2, tuple(later))
    else:
        faults = _faults(rng, D, S, N, service, floor, harsh=harsh, rekill=rekill,
                         pause_at=pause_at, run_floor=run_floor)
    outage = None
    if service:
        # Early enough to land inside the run (service runs last ~15-30 s here).
        outage = ServiceOutage(at_s=round(rng.uniform(2.0, 10.0), 1),
                               outage_s=round(rng.uniform(1.0, 15.0), 1))
    return Schedule(seed, index, D, S, M, N, tuple(faults), outage, service, shape=shape,
                    model=model, resume=resume)


def resume_grids(D: int, S: int, M: int, reshapes: bool = True) -> list[tuple[int, int, int]]:
    """Grids (D', S', M') a checkpoint of D x S m M resumes on: the same global batch
    D' x M' = D x M, D' x S' <= 6 (a 2-core machine), 2 <= S' <= 3 (the tiny model's units:
    more stages than that leave one with no parameters), S' = S for a model that cannot
    change shape; the same grid first."""
    out = [(D, S, M)]
    for d in range(1, 7):
        for s in ((2, 3) if reshapes else (S,)):
            if d * s <= 6 and (D * M) % d == 0 and (d, s) != (D, S):
                out.append((d, s, D * M // d))
    return out


def _resume_grid(rng: random.Random, D: int, S: int, M: int, reshapes: bool
                 ) -> tuple[int, int, int]:
    grids = resume_grids(D, S, M, reshapes)
    return grids[0] if rng.random() < P_SAME_GRID or len(grids) == 1 else rng.choice(grids[1:])


def _faults(rng: random.Random, D: int, S: int, N: int, service: bool,
            floor: int, *, start: int = 0, many: Optional[tuple[int, int]] = None,
            harsh: Optional[random.Random] = None, rekill: float = 0.0,
            pause_at: Optional[int] = None, run_floor: Optional[int] = None) -> list[Fault]:
    """`floor`: the fewest live workers an iteration's events may leave; faults from
    iteration `start` on. `harsh` (with `rekill`): kills of workers in the iteration they
    return at or the next; `pause_at`: the iteration whose kills leave fewer than
    `run_floor` live (a pause), every victim due back."""
    grid = [(r, s) for r in range(D) for s in range(S)]
    live = set(grid)  # in the user's picture: started or rejoined, and not killed since
    back_at: dict[Worker, int] = {}  # dead worker -> the iteration it rejoins at
    # Iterations of the random kills (donor kills come on top); with replacement, so an
    # iteration may get two. The first always lands: everyone is live then and D >= 2.
    many = many or ((3, 7) if floor < S else (1, 3 if service else 4))  # a shape needs losses
    targets = sorted(rng.randrange(start, N) for _ in range(rng.randint(*many)))
    stalls_left = rng.randint(0, 2)
    out: list[Fault] = []
    rekill_at: dict[int, list[Worker]] = {}  # iteration -> rejoined workers to kill then

    def rejoin_at(i: int) -> Optional[int]:
        if i + 1 <= N - 2 and rng.random() < P_REJOIN:  # back in time to train a little
            return rng.randint(i + 1, min(i + REJOIN_DELAY[1], N - 2))
        return None

    def kill(ws: list[Worker], i: int, why: str, back: Optional[int] = -1) -> None:
        for w in ws:
            live.discard(w)
            out.append(Fault("kill", w, i, why=why))
            j = rejoin_at(i) if back == -1 else back
            if j is not None:
                back_at[w] = j
                out.append(Fault("rejoin", w, j, why="node" if why == "node" else ""))

    for i in range(start, N):
        back = sorted(w for w, j in back_at.items() if j == i)
        for w in back:  # admitted before iteration i trains, so before its kills
            del back_at[w]
            live.add(w)
        killed: list[Worker] = []
        # Killable now: live, not rejoined in this iteration (from the next one on), and
        # at least `floor` workers stay live (S, or ceil(S/2) where the schedule draws the
        # pipeline cut into fewer stages: fewer would pause, and a rejoin cannot fire then).
        fits = lambda ws: all(w in live and w not in back for w in ws) and \
            len(live) - len(ws) >= floor  # noqa: E731
        if harsh is not None and rekill:
            for w in back:  # a worker killed again when it returns (now) or the next one
                if harsh.random() < rekill:
                    rekill_at.setdefault(i + harsh.randint(0, 1), []).append(w)
            for w in rekill_at.pop(i, []):
                if w in live and len(live) - 1 >= floor and len(killed) < \
                        MAX_KILLS_PER_ITERATION and (i + 1 <= N - 1):
                    killed.append(w)
                    kill([w], i, "rejoined")
        for w in back:  # donor kills: a live peer of the rejoining worker's home stage
            donors = [p for p in grid if p[1] == w[1] and p != w and fits([p])]
            if donors and len(killed) < MAX_KILLS_PER_ITERATION and rng.random() < P_DONOR_KILL:
                killed.append(rng.choice(donors))
                kill(killed[-1:], i, "donor")
        if i == pause_at and run_floor is not None and len(live) >= run_floor and not killed:
            # fewer live than any shape runs on (at least one left), every victim due back:
            # the run pauses and starts the rejoins at once
            left = harsh.randint(1, run_floor - 1) if run_floor > 1 else 0
            if left >= 1:
                ws = sorted(harsh.sample(sorted(w for w in live if w not in back),
                                         len(live) - left)) \
                    if len([w for w in live if w not in back]) >= len(live) - left else []
                if ws:
                    j = harsh.randint(i + 1, min(i + REJOIN_DELAY[1], N - 2))
                    for w in ws:
                        live.discard(w)
                        out.append(Fault("kill", w, i, why="pause"))
                        back_at[w] = j
                        out.append(Fault("rejoin", w, j))
                    killed += ws
                    continue  # no other kill this iteration
        for _ in range(targets.count(i)):
            group = _group(rng, live, D, S, fits) if not killed and rng.random() < P_GROUP \
                else None
            if group is not None:
                why, ws = group
                j = rejoin_at(i) if why == "node" and rng.random() < P_NODE_BACK else None
                kill(ws, i, why, j if why == "node" else -1)
                killed += ws
                continue
            if sum(1 for f in out if f.kind == "kill" and f.iteration == i) >= \
                    MAX_KILLS_PER_ITERATION:
                break
            victims = [w for w in grid if fits([w])]
            if victims:
                killed.append(rng.choice(victims))
                kill(killed[-1:], i, "random")
        if stalls_left and rng.random() < stalls_left / max(1, N - i):
            stalls_left -= 1
            lo, hi = STALL_S[service]
            out.append(Fault("stall", rng.choice(sorted(live)), i, round(rng.uniform(lo, hi), 1)))
    order = {"kill": 0, "rejoin": 1, "stall": 2}
    return sorted(out, key=lambda f: (f.iteration, order[f.kind], f.worker))


def _group(rng: random.Random, live: set, D: int, S: int, fits
           ) -> Optional[tuple[str, list[Worker]]]:
    """A whole home stage (its live workers) or a whole node (a replica row's live
    workers, two or more) that may be killed now; None if none may."""
    options = [("stage", sorted(w for w in live if w[1] == s)) for s in range(S)] + \
        [("node", sorted(w for w in live if w[0] == r)) for r in range(D)]
    options = [(why, ws) for why, ws in options
               if len(ws) >= (1 if why == "stage" else 2) and fits(ws)]
    return rng.choice(options) if options else None
