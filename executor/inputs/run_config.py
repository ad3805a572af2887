"""A training run's whole configuration as one typed tree, and `recycle train --config FILE`.

The sections group `recycle train`'s settings (model, optimizer, LR schedule, clipping,
data, checkpoint, faults, comm, service, plan, output); a field is named as its flag
(`--d-model` is `[model] d_model`), and `recycle train`'s options are generated from the
fields (`setting`: default, help, flag names), so a setting is declared here only. A TOML or JSON file with these sections sets a run up,
as torchtitan's job configs do; flags given on the command line override it. A run writes
its own tree to RUN_DIR/run.toml, so `recycle train --config RUN_DIR/run.toml` repeats it.
"""
from __future__ import annotations

import json
import math
import os
import typing
from dataclasses import dataclass, field, fields
from typing import Optional

try:
    import tomllib
except ImportError:  # Python 3.10: JSON configs only
    tomllib = None


def setting(default, *flags: str, doc: str, factory=None, at_least: Optional[float] = None):
    """One setting of a run, declared once: its default (the only place it is given), its
    help, its flag names where they are not `--name` (a short alias, a bool's --x/--no-x
    pair) and, for a number, the least value it takes (`at_least`: RunConfig refuses
    less, or a non-finite number, in one line). `recycle train`'s options are generated
    from these (recycle/commands/train.py), the config file's keys are their names, and
    the settings' section is its help panel."""
    meta = {"doc": doc, "flags": flags, "at_least": at_least}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class GridSection:
    replicas: Optional[int] = setting(None, "--replicas", "-d", doc=(
        "data-parallel replicas D [default: 2, or the --job's]"))
    stages: Optional[int] = setting(None, "--stages", "-s", doc=(
        "pipeline stages S [default: 2, or the --job's]"))
    microbatches: Optional[int] = setting(None, "--microbatches", "-m", doc=(
        "micro-batches per replica M [default: 4, or the --job's]"))
    iterations: int = setting(5, doc="training iterations (one global batch each)")
    job: Optional[str] = setting(None, doc="job spec JSON (e.g. from `recycle profile`)")


@dataclass(frozen=True)
class ModelSection:
    model: str = setting("gpt", doc=(
        "NAME[:FLAVOUR]: gpt, llama (= llama:debug), llama:125m, llama:1b, llama:8b, or an "
        "import path package.module:factory returning an executor.compute.model.Workload "
        "(docs/executor.md)"))
    d_model: Optional[int] = setting(None, doc="default: the --model flavour's, else 32")
    layers: Optional[int] = setting(None, doc="default: the --model flavour's, else 4")
    heads: Optional[int] = setting(None, doc="default: the --model flavour's, else 2")
    seq_len: Optional[int] = setting(None, doc=(
        "default: the --model flavour's (which it may shorten), else 16"))
    vocab: Optional[int] = setting(None, doc="default: the --model flavour's, else 64")
    micro_batch_size: int = setting(4, doc="sequences per micro-batch")
    seed: int = setting(0, doc="the seed of the model's initial weights and of its synthetic data")
    split: Optional[str] = setting(None, doc=(
        "stage boundaries: layers (equal layer counts) or balanced (on the per-layer costs of a"
        " --job from `recycle profile --split balanced`); default: balanced if the --job has "
        "per-layer costs, else layers"))
    precision: str = setting("fp32", doc=(
        "fp32, or bf16 (autocast; fp32 master weights and gradients)"))
    activation_checkpointing: Optional[str] = setting(None, doc=(
        "none, full (every block's forward is recomputed in backward, keeping only its input), "
        "or selective[:N] (every N-th block; N=2 by default): less activation memory for more "
        "compute, the same numbers (recomputed once, in I) [default: the --job's, else none]"))


@dataclass(frozen=True)
class OptimizerSection:
    """AdamW's settings. Each is a TrainingSettings field of the same name and reaches it,
    a checkpoint's manifest and a --resume by that name alone (resolve.py, train_options.py,
    checkpoint/manifest.py): a new one is declared here and in TrainingSettings."""
    lr: float = setting(0.003, doc="learning rate (AdamW)")
    weight_decay: float = setting(0.01, at_least=0.0, doc=(
        "AdamW's decoupled weight decay (0: none)"))


@dataclass(frozen=True)
class ScheduleSection:
    lr_schedule: str = setting("constant", doc=(
        "constant, or cosine decay to --min-lr-ratio x --lr after --warmup"))
    warmup: int = setting(0, doc="iterations of linear learning-rate warm-up")
    min_lr_ratio: Optional[float] = setting(None, doc=(
        "cosine floor as a fraction of --lr [default: 0.1]"))


@dataclass(frozen=True)
class ClippingSection:
    clip: float = setting(0.0, doc=(
        "clip gradients to this global norm over the whole model (0: off)"))


@dataclass(frozen=True)
class DataSection:
    data: Optional[str] = setting(None, doc=(
        "token file from `recycle data prepare`; the model's vocab is the file's unless --vocab"
        " is given (default: the model's synthetic data)"))


@dataclass(frozen=True)
class CheckpointSection:
    checkpoint_dir: Optional[str] = setting(None, "--checkpoint-dir", "--checkpoint", doc=(
        "where checkpoints (torch.distributed.checkpoint) go (default: RUN_DIR/checkpoints)"))
    checkpoint_every: int = setting(1, doc=(
        "checkpoint every N iterations (and the last); a halt resumes from the newest"))
    resume: Optional[str] = setting(None, doc=(
        "continue from this checkpoint directory (or the newest one under it) with its grid, "
        "job, model and settings; of the flags given, --lr and the other training settings "
        "(schedule, --iterations, --clip, --precision) are honoured, others must match"))
    snapshot_every: str = setting("auto", doc=(
        "every K iterations also keep each stage's parameters and optimizer state in the host "
        "memory of a worker elsewhere (peer-memory snapshots, sent in the background), so a "
        "stage lost whole is restored without a disk: auto (K from the measured cost of a "
        "snapshot: the smallest K whose snapshot costs about 1-2% of an iteration), off, or K"))
    snapshot_memory: str = setting("25%", doc=(
        "host memory the snapshots may take, shared by the workers of a host: a share (25%) or "
        "a size (8G); auto turns them off above it"))
    log_memory: str = setting("10%", doc=(
        "host memory each host's workers may keep boundary logs in (the activations and "
        "gradients they sent since the second-newest snapshot), so a stage lost whole is "
        "replayed alone from its snapshot while the others keep their work: a share (10%), a "
        "size (2G), or off (the job then rolls back to the snapshot)"))

    @property
    def snapshot_cadence(self) -> int:
        """--snapshot-every as the runtime reads it: -1 (auto), 0 (off) or K; ValueError,
        one line, for anything else."""
        from executor.runtime.peer_snapshots.cadence import parse_every
        return parse_every(self.snapshot_every)


@dataclass(frozen=True)
class FaultsSection:
    kill: list[str] = setting(None, factory=list, doc=(
        "SIGKILL worker R:S mid-iteration ITER: R:S@ITER (repeatable)"))
    rejoin: list[str] = setting(None, factory=list, doc=(
        "bring worker R:S back after it dies: its death is a failure first, the run trains re-"
        "routed without it until it reaches iteration ITER, then a new process is started, "
        "loads its stage from a live peer and is in the plan from ITER on (with --external the "
        "node's torchrun restarts it; training waits before ITER until it is back): R:S@ITER "
        "(repeatable: each entry serves one death)"))
    restart: list[str] = setting(None, factory=list, doc=(
        "like --rejoin, but the new process starts as soon as the death is in a plan, and is "
        "back as soon as it is up (training waits before iteration ITER until it is): R:S@ITER "
        "(repeatable)"))
    stall: list[str] = setting(None, factory=list, doc=(
        "SIGSTOP worker R:S mid-iteration ITER, SIGCONT it SECONDS later: R:S@ITER:SECONDS"))
    slow: list[str] = setting(None, factory=list, doc=(
        "make worker R:S really slower from iteration ITER, to FACTOR of its speed (1 ends it):"
        " R:S@ITER:FACTOR (repeatable)"))
    detect_stragglers: bool = setting(True, "--detect-stragglers/--no-detect-stragglers", doc=(
        "measure each worker's speed and re-plan around slow ones (without a service)"))
    trace: Optional[str] = setting(None, doc=(
        "replay a spot trace (t_ms,add|remove,nodeN, e.g. Bamboo's EC2 traces) on the workers: "
        "a node removed SIGKILLs its workers, a node added starts new ones, which join with no "
        "state; nodes hold --gpus-per-node workers"))
    trace_start: str = setting("0", doc=(
        "where in the trace the window starts (6h, 30m, 90s): the nodes up then are the run's "
        "starting workers"))
    trace_hours: float = setting(1.0, doc="hours of the trace replayed")
    gpus_per_node: int = setting(1, doc="workers a node of the --trace holds")
    placement: str = setting("stages", doc=(
        "stages: a --trace node holds G stages of one replica; replicas: one stage of G "
        "replicas"))
    time_scale: float = setting(60.0, doc=(
        "trace seconds per wall-clock second of the replay (60: an hour of the trace in a "
        "minute)"))


@dataclass(frozen=True)
class CommSection:
    timeout: float = setting(5.0, doc="seconds before a silent peer counts as failed")
    device: str = setting("auto", doc=(
        "auto (CUDA if present), cpu or cuda: where workers compute (--reference: cuda on the "
        "GPU, else the CPU)"))
    external: bool = setting(False, doc=(
        "do not spawn workers: wait for torchrun'd `python -m executor.worker`"))
    store_port: int = setting(0, doc="port of the coordinator's store (0: any free port)")


@dataclass(frozen=True)
class ServiceSection:  # the worker token never goes in a file: --token or RECYCLE_TOKEN
    service: Optional[str] = setting(None, doc=(
        "workers take plans from, and report failures to, `recycle serve` at this URL"))
    job_id: Optional[str] = setting(None, doc="the job's id at --service")


@dataclass(frozen=True)
class PlanSection:
    solver: str = setting("greedy", doc="planner back-end: greedy, 1f1b, cpsat, milp")
    no_split: bool = setting(False, "--no-split", doc="fused backward (B): no I/W split")
    sync: bool = setting(False, "--sync", doc=(
        "synchronous optimizer: plans for it, and a barrier after every iteration"))
    shape: str = setting("auto", doc=(
        "auto: when fewer live workers are left than stages, the pipeline is cut into fewer, "
        "deeper stages (state moved by parameter name) instead of pausing; speed: at every "
        "failure and return, the shape that trains most over the horizon (the simulator's "
        "recycle: it also cuts for speed with as many workers as stages, and goes back); "
        "fixed: the stage count never changes (it pauses for restarts, or halts)"))


@dataclass(frozen=True)
class OutputSection:
    run_dir: Optional[str] = setting(None, doc=(
        "worker logs and stage states (default: a temp dir)"))
    summary: Optional[str] = setting(None, doc="write {losses, param_checksums} JSON here")
    reference: bool = setting(False, "--reference", doc=(
        "train in one process (ground truth), same summary"))


@dataclass(frozen=True)
class RunConfig:
    grid: GridSection = GridSection()
    model: ModelSection = ModelSection()
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    clipping: ClippingSection = ClippingSection()
    data: DataSection = DataSection()
    checkpoint: CheckpointSection = CheckpointSection()
    faults: FaultsSection = FaultsSection()
    comm: CommSection = CommSection()
    service: ServiceSection = ServiceSection()
    plan: PlanSection = PlanSection()
    output: OutputSection = OutputSection()

    def __post_init__(self):
        for f in _SECTIONS:  # each number's least value, as its setting declares it
            for key in f.keys:
                least = f.fields[key].metadata.get("at_least")
                value = getattr(getattr(self, f.name), key)
                if least is not None and value is not None and not (
                        math.isfinite(value) and value >= least):
                    flag = next(iter(f.fields[key].metadata["flags"]), None) or \
                        "--" + key.replace("_", "-")
                    raise ValueError(f"{flag} must be a finite number >= {least:g}, "
                                     f"not {value!r}")

    @classmethod
    def from_flags(cls, values: dict) -> "RunConfig":
        """The tree of a `train` command's resolved flag values (other keys ignored)."""
        return cls(**{f.name: f.type_(**{k: values[k] for k in f.keys if k in values})
                      for f in _SECTIONS})

    def to_toml(self) -> str:
        """The tree as TOML (fields left at None are omitted: TOML has no null)."""
        out = []
        for f in _SECTIONS:
            rows = [f"{k} = {_toml_value(v)}" for k, v in
                    ((k, getattr(getattr(self, f.name), k)) for k in f.keys) if v is not None]
            if rows:
                out.append(f"[{f.name}]\n" + "\n".join(rows) + "\n")
        return "\n".join(out)


@dataclass(frozen=True)
class _Section:
    name: str
    type_: type
    keys: tuple[str, ...]
    hints: dict
    fields: dict


_SECTIONS = [_Section(name, t, tuple(x.name for x in fields(t)), typing.get_type_hints(t),
                      {x.name: x for x in fields(t)})
             for name, t in typing.get_type_hints(RunConfig).items()]
# [optimizer]'s settings, each a TrainingSettings field of the same name
OPTIMIZER_SETTINGS = tuple(f.name for f in fields(OptimizerSection))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string is a JSON string


def _check(where: str, hint, value):
    """`value` as the field's type wants it, or a one-line ValueError."""
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[X]
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is list:
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ValueError(f"{where} must be a list of strings, not {value!r}")
        return list(value)
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if hint is str and is_int:  # snapshot_every = 4 means "4" (the field may be "auto")
        return str(value)
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: is_int,
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}[hint]
    if not ok(value):
        raise ValueError(f"{where} must be {hint.__name__}, not {value!r}")
    return float(value) if hint is float else value


def read_config(path: str) -> dict:
    """Flag name -> value from a TOML (.toml) or JSON file of RunConfig's sections;
    an unknown section or key, or a value of the wrong type, is a one-line ValueError."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if tomllib is None and not path.endswith(".json"):
        raise ValueError(f"--config {path}: TOML needs Python 3.11 or later; give a .json")
    try:
        tree = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError, JSONDecodeError
        raise ValueError(f"--config {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(tree, dict):
        raise ValueError(f"--config {path}: want a table of sections")
    sections = {f.name: f for f in _SECTIONS}
    out = {}
    for name, table in tree.items():
        if name not in sections:
            raise ValueError(f"--config {path}: unknown section [{name}]; sections are "
                             + ", ".join(sections))
        sec = sections[name]
        if not isinstance(table, dict):
            raise ValueError(f"--config {path}: [{name}] must be a table of settings")
        for key, value in table.items():
            if key not in sec.keys:
                raise ValueError(f"--config {path}: [{name}] has no setting {key!r}; it has "
                                 + ", ".join(sec.keys))
            out[key] = _check(f"--config {path}: [{name}] {key}", sec.hints[key], value)
    return out


def save_config(run: RunConfig, run_dir: str) -> str:
    """RUN_DIR/run.toml: what this run was asked, to repeat it with --config."""
    path = os.path.join(run_dir, "run.toml")
    with open(path, "w") as fh:
        fh.write(run.to_toml())
    return path
