"""What the coordinator and its workers say to each other through the run's TCPStore: every
key's name, and every message a worker sends, typed. Both sides import this module and
nothing else spells a key (docs/executor.md, "The store protocol").

Keys (the coordinator hosts the store):
  config                 the run's WorkerSettings JSON
  plan/version           counter = newest published version + 1 (0: none yet)
  plan/{v}               the plan JSON of version v
  halted                 reason text, once no plan can exist
  finished               set once training completed (service mode)
  committed              newest iteration every live worker has stepped, + 1
  hold                   counter = iteration + 1 before which workers wait for a newer plan
  inc/{r}:{s}            incarnation counter: each process of a worker takes the next number
  hb/{r}:{s}             heartbeat "time iteration incarnation"
  go/{r}:{s}/{inc}/{it}  the coordinator has acted on a fault due at that mid-iteration
  mq                     the queue of every worker's messages (Message JSON), in order
  recycle/v{v}/...       a plan version's world: check-ins, process groups, activation specs
  recycle/clip/...       the stages' squared gradient norms (optim/clip.py)
  recycle/tied/...       tied weights' gradients and values (runtime/steps/tied.py)
  snap/...               peer-memory snapshots: hosts' addresses, holders' marks, auto K
  replay/v{v}/s{s}/...   a lost stage's replay on entering version v: each iteration
                         done (i{it}), micro-batches computed (mbs, a counter)
  torchrun/placement     the placement torchrun'd workers agreed on
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar, Optional

Worker = tuple[int, int]

CONFIG = "config"
PLAN_VERSION = "plan/version"
HALTED = "halted"
FINISHED = "finished"
COMMITTED = "committed"
HOLD = "hold"
MAILBOX = "mq"
GATE_KEYS = (PLAN_VERSION, HOLD, COMMITTED)  # counters read before every iteration
PLACEMENT = "torchrun/placement"
SNAP_ADDR = "snap/addr/{}"  # a worker's snapshot host
SNAP_DONE = "snap/done/{}"  # the newest iteration of stage s complete at its holder
SNAP_EVERY = "snap/every"  # auto's choice of K, written once
SNAP_COST = "snap/cost/{}"  # stage s's calibration snapshot's cost


def wkey(w: Worker) -> str:
    return f"{w[0]}:{w[1]}"


def plan_key(version: int) -> str:
    return f"plan/{version}"


def incarnation_key(w: Worker) -> str:
    return f"inc/{wkey(w)}"


def heartbeat_key(w: Worker) -> str:
    return f"hb/{wkey(w)}"


def go_key(w: Worker, incarnation: int, iteration: int) -> str:
    return f"go/{wkey(w)}/{incarnation}/{iteration}"


def world_prefix(version: int) -> str:
    return f"recycle/v{version}/"


def checkin_key(version: int, w: Worker) -> str:
    return f"{world_prefix(version)}here/{wkey(w)}"


def activation_spec_key(version: int, stage: int) -> str:
    return f"{world_prefix(version)}spec/{stage}"


def clip_norm_key(version: int, it: int, stage: int) -> str:
    return f"recycle/clip/v{version}/i{it}/s{stage}"


def tied_key(version: int, it: int, kind: str, stage: int) -> str:
    return f"recycle/tied/v{version}/i{it}/{kind}/s{stage}"


def replay_key(version: int, stage: int, it: int) -> str:
    """Set when entering `version` replayed iteration `it` of lost stage `stage`."""
    return f"replay/v{version}/s{stage}/i{it}"


def replay_progress_key(version: int, stage: int) -> str:
    """Counter: micro-batches the replay of `stage` on entering `version` has computed."""
    return f"replay/v{version}/s{stage}/mbs"


# ---- worker -> coordinator ------------------------------------------------------------------
@dataclass
class Message:
    """One message of a worker process: who sent it (its slot, incarnation and the plan
    version it acts on) and, in subclasses, what it says."""
    kind: ClassVar[str] = ""
    r: int = -1
    s: int = -1
    inc: int = 1
    v: int = -1

    @property
    def worker(self) -> Worker:
        return (self.r, self.s)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "t": self.kind})

    @staticmethod
    def parse(text) -> "Message":
        d = json.loads(text)
        cls = KINDS[d.pop("t")]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Done(Message):
    """An iteration stepped (or, `sync`, a version entered at `it` + 1)."""
    kind: ClassVar[str] = "done"
    it: int = -1
    losses: Optional[dict] = None  # the last stage's, per micro-batch
    compute: Optional[float] = None  # seconds per micro-batch (the straggler detector)
    slot: Optional[list] = None  # the slot it fills (a plan's roles may move it)
    checksum: Optional[float] = None  # of its parameters, after the last iteration
    # after a change of shape: its parameters' checksum per stage of the job's own split
    # (the summary's checksums compare with a reference of that split)
    base_checksums: Optional[list[float]] = None
    sync: bool = False
    at: Optional[float] = None  # wall time it entered the version (sync)
    snap_every: Optional[int] = None  # K in force (the last iteration)
    snap_bytes: Optional[int] = None  # host memory its snapshots hold (the last iteration)
    log_bytes: Optional[int] = None  # the most its boundary log held (the last iteration)
    extra: Optional[dict] = None  # what an instrumented worker adds (benchmarks/)


@dataclass
class Replayed(Message):
    """A stage lost whole was replayed from the boundary logs (executor/runtime/replay/)."""
    kind: ClassVar[str] = "replayed"
    stage: int = -1
    first: int = -1  # the iterations replayed, first..last
    last: int = -1
    seconds: float = 0.0
    workers: int = 0  # that replayed it
    losses: Optional[dict] = None  # the last stage's: iteration -> {g: loss}


@dataclass
class RolledBack(Message):
    """The job rolled back whole to a copy of every stage (no replay could serve)."""
    kind: ClassVar[str] = "rolledback"
    to: int = -1  # every stage's state is that after this iteration
    why: str = ""  # why the lost stage(s) could not be replayed
    tier: str = "peer-memory snapshots"  # where the lost stages' state came from
    again: int = 0  # iterations a member had stepped past `to`: trained again


@dataclass
class Mid(Message):
    """Halfway through an iteration a fault may target: where a --kill/--stall lands."""
    kind: ClassVar[str] = "mid"
    it: int = -1
    wait: bool = False
    pid: Optional[int] = None
    host: Optional[str] = None


@dataclass
class Suspect(Message):
    """A comm operation with `peer` failed under version v."""
    kind: ClassVar[str] = "suspect"
    peer: list = field(default_factory=list)
    reason: str = ""


@dataclass
class Ready(Message):
    """A newer process of this worker asks to be admitted."""
    kind: ClassVar[str] = "ready"


@dataclass
class Fatal(Message):
    """The model itself is wrong: the run halts with `reason` (exit 2)."""
    kind: ClassVar[str] = "fatal"
    reason: str = ""
    error: Optional[str] = None  # "exception": the model's own code raised
    log: Optional[str] = None  # where its traceback is


@dataclass
class NoCopyLeft(Message):
    """No live copy of some stage's state: the run halts (exit 3)."""
    kind: ClassVar[str] = "halt"
    reason: str = ""


@dataclass
class Bye(Message):
    """The worker's last word: it has seen the end and exits."""
    kind: ClassVar[str] = "bye"


KINDS = {c.kind: c for c in (Done, Mid, Suspect, Ready, Fatal, NoCopyLeft, Bye, Replayed,
                              RolledBack)}
