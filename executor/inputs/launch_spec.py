"""What a local training run is asked, as one typed value: `recycle train` builds it from
its flags (recycle/commands/train.py), the coordinator (executor/launch/launcher.py) runs
it, and nothing in between passes loose keyword lists. Validated once, here, when it is made: a field no
run could carry out is a one-line ValueError (UserError) naming its flag.

The live objects of a run (the console it prints to, the plan service it follows) are not
settings: Coordinator(spec, console=..., service=...) takes them beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

from executor.compute.config import ModelConfig, TrainingSettings
from executor.inputs.run_config import CheckpointSection, CommSection, RunConfig
from executor.launch.faults.injector import check_faults, parse_event, parse_slow, parse_stall
from executor.launch.faults.trace_replay import TraceReplay
from executor.runtime.peer_snapshots.cadence import log_budget, parse_budget
from planner.errors import UserError

# `--shape` (run_config.PlanSection.shape): when the pipeline may change its stage count
SHAPES = ("auto", "speed", "fixed")
from planner.job import JobSpec
from planner.plan import Mode

Event = tuple[int, int, int]  # (replica, stage, iteration)
Timed = tuple[int, int, int, float]  # (replica, stage, iteration, seconds or factor)


def _tuples(items) -> tuple:
    return tuple(tuple(k) for k in items)


@dataclass(frozen=True)
class Faults:
    """The faults injected into a run (executor/launch/faults/injector.py carries them out)."""
    kills: tuple[Event, ...] = ()  # --kill: SIGKILL mid-iteration
    rejoins: tuple[Event, ...] = ()  # --rejoin: back once the run reaches the iteration
    restarts: tuple[Event, ...] = ()  # --restart: back as soon as its death is planned
    stalls: tuple[Timed, ...] = ()  # --stall: SIGSTOP, SIGCONT the seconds later
    slows: tuple[Timed, ...] = ()  # --slow: compute at the factor of its speed
    # A failure trace's window replayed on the processes (trace_replay.py): node removals
    # SIGKILL workers, additions restart them. It keeps its own progress (counts) as it goes.
    trace: Optional[TraceReplay] = None

    def __post_init__(self):  # lists (JSON, tests) become the tuples the fields declare
        for name in ("kills", "rejoins", "restarts", "stalls", "slows"):
            object.__setattr__(self, name, _tuples(getattr(self, name)))

    @classmethod
    def from_flags(cls, kill=(), rejoin=(), restart=(), stall=(), slow=()) -> "Faults":
        """The faults as typed on the command line (R:S@ITER[:X]); ValueError, one line."""
        return cls(kills=[parse_event(k) for k in kill], rejoins=[parse_event(r) for r in rejoin],
                   restarts=[parse_event(r) for r in restart],
                   stalls=[parse_stall(s) for s in stall], slows=[parse_slow(s) for s in slow])

    @property
    def rejoin_entries(self) -> list[tuple[int, int, int, bool]]:
        """(r, s, iteration, asap): the --rejoin entries, then the --restart ones (asap)."""
        return [(*k, False) for k in self.rejoins] + [(*k, True) for k in self.restarts]


@dataclass(frozen=True)
class LaunchSpec:
    """One local run: the model, how it is trained, the job, and how to run, fail and
    checkpoint it. How it checkpoints and recovers ([checkpoint]) and talks ([comm]) are
    RunConfig's own sections, carried whole to every worker (worker_settings.py): a
    setting there is declared, and defaulted, once (run_config.py); `sections(timeout=..)`
    builds them from flag names."""
    cfg: ModelConfig
    job: JobSpec
    iterations: int
    faults: Faults = Faults()
    training: TrainingSettings = TrainingSettings()  # optimizer, schedule, clip, data
    detect_stragglers: bool = True  # measure speeds and re-plan (without a service)
    solver: str = "greedy"
    mode: Mode = Mode()  # split backward / staggered optimizer, as the planner's Mode
    # --checkpoint-dir (default RUN_DIR/checkpoints), --checkpoint-every, --resume, and the
    # peer-memory tiers: --snapshot-every (auto: K from the measured cost of a snapshot,
    # within --snapshot-memory; peer_snapshots/cadence.py) and --log-memory (replay/)
    checkpoint: CheckpointSection = CheckpointSection()
    comm: CommSection = CommSection()  # --timeout, --device, --external, --store-port
    run_dir: Optional[str] = None  # worker logs, run.toml (default: a temp dir)
    deadline_s: Optional[float] = None  # the run raises TimeoutError past it (tests)
    model: str = "gpt"  # --model NAME: the Workload every worker loads
    run_config: Optional[RunConfig] = None  # the flag tree, written to RUN_DIR/run.toml
    summary_path: Optional[str] = None  # {losses, param_checksums} JSON, once complete
    # auto: fewer live workers than stages train on fewer, deeper stages (planner/shapes/,
    # runtime/stage_state/reshape.py) where the model allows; fixed: they pause or halt
    shape: str = "auto"

    def __post_init__(self):
        self.check()

    @classmethod
    def build(cls, *args, **given) -> "LaunchSpec":
        """A LaunchSpec from its fields, with [checkpoint] and [comm] settings given by
        their own names (`timeout=4.0`, `snapshot_every="off"`) beside them."""
        mine = {f.name for f in fields(cls)}
        flags = {k: given.pop(k) for k in list(given) if k not in mine}
        return cls(*args, **given, **sections(**flags))

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.job.replicas, self.job.stages, self.job.microbatches

    @property
    def external(self) -> bool:  # workers are torchrun'd, not spawned here
        return self.comm.external

    def check(self) -> None:
        """Refuse (UserError, one line, the flag named) what no run could carry out."""
        from planner.inputs.limits import check_plannable
        from planner.inputs.paths import check_directory, check_writable
        from planner.solvers.backends import BACKENDS

        D, S, M = self.grid
        if self.iterations < 1:
            raise UserError(f"--iterations must be at least 1, not {self.iterations}")
        ck, comm = self.checkpoint, self.comm
        if not (comm.timeout > 0 and math.isfinite(comm.timeout)):
            raise UserError(f"--timeout must be positive, not {comm.timeout:g}")
        if self.solver not in BACKENDS:
            raise UserError(f"unknown solver {self.solver!r}; choose one of "
                            f"{', '.join(BACKENDS)}")
        if self.shape not in SHAPES:
            raise UserError(f"--shape must be {', '.join(SHAPES[:-1])} or {SHAPES[-1]}, not "
                            f"{self.shape!r}")
        if not 0 <= comm.store_port <= 65535:
            raise UserError(f"--store-port must be a port number 0..65535 (0: any free), "
                            f"not {comm.store_port}")
        if ck.checkpoint_every < 1:
            raise UserError(f"--checkpoint-every must be at least 1, not {ck.checkpoint_every}")
        try:
            ck.snapshot_cadence  # noqa: B018 (parsed: a bad --snapshot-every is refused here)
            parse_budget(ck.snapshot_memory)
            log_budget(ck.log_memory, 1)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise UserError(f"deadline_s must be positive seconds, not {self.deadline_s:g}")
        if self.run_dir:
            check_directory(self.run_dir, "--run-dir")
        if ck.checkpoint_dir:
            check_directory(ck.checkpoint_dir, "--checkpoint-dir")
        if self.summary_path:
            check_writable(self.summary_path, "--summary")
        check_plannable(D, S, M)
        if not self.external:  # the workers are this machine's processes
            from executor.inputs.train_options import check_local_workers
            from executor.runtime.transport.endpoints import check_device
            check_local_workers(D, S)
            check_device(comm.device)  # torchrun'd workers check their own hosts
        check_faults(D, S, self.iterations, self.faults.kills, self.faults.rejoin_entries,
                     self.faults.stalls, self.faults.slows, self.external)


def sections(**flags) -> dict:
    """LaunchSpec's `checkpoint` and `comm` from flag names (`timeout=10`,
    `snapshot_every="off"`), each setting's default its section's: for code and tests that
    build a run without the command line."""
    out, left = {}, dict(flags)
    if isinstance(left.get("snapshot_every"), int):  # a cadence as the runtime counts it
        from executor.runtime.peer_snapshots.cadence import every_text
        left["snapshot_every"] = every_text(left["snapshot_every"])
    for name, kind in (("checkpoint", CheckpointSection), ("comm", CommSection)):
        mine = {f.name: left.pop(f.name) for f in fields(kind) if f.name in left}
        out[name] = kind(**mine)
    if left:
        raise TypeError(f"not a [checkpoint] or [comm] setting: {', '.join(left)}")
    return out
