"""A training run's whole configuration as one typed tree, and `recycle train --config FILE`.

The sections group `recycle train`'s settings (model, optimizer, LR schedule, clipping,
data, checkpoint, faults, comm, service, plan, output); a field is named as its flag
(`--d-model` is `[model] d_model`). A TOML or JSON file with these sections sets a run up,
as torchtitan's job configs do; flags given on the command line override it. A run writes
its own tree to RUN_DIR/run.toml, so `recycle train --config RUN_DIR/run.toml` repeats it.
"""
from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass, field, fields
from typing import Optional

try:
    import tomllib
except ImportError:  # Python 3.10: JSON configs only
    tomllib = None


@dataclass(frozen=True)
class GridSection:
    replicas: Optional[int] = None
    stages: Optional[int] = None
    microbatches: Optional[int] = None
    iterations: int = 5
    job: Optional[str] = None  # a job spec JSON (`recycle profile`): grid and costs


@dataclass(frozen=True)
class ModelSection:
    model: str = "gpt"
    d_model: Optional[int] = None
    layers: Optional[int] = None
    heads: Optional[int] = None
    seq_len: Optional[int] = None
    vocab: Optional[int] = None
    micro_batch_size: int = 4
    seed: int = 0
    split: Optional[str] = None
    precision: str = "fp32"
    activation_checkpointing: Optional[str] = None  # none, full, selective[:N] (default: the --job's)


@dataclass(frozen=True)
class OptimizerSection:
    lr: float = 3e-3


@dataclass(frozen=True)
class ScheduleSection:
    lr_schedule: str = "constant"
    warmup: int = 0
    min_lr_ratio: Optional[float] = None


@dataclass(frozen=True)
class ClippingSection:
    clip: float = 0.0


@dataclass(frozen=True)
class DataSection:
    data: Optional[str] = None


@dataclass(frozen=True)
class CheckpointSection:
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 1
    resume: Optional[str] = None
    snapshot_every: str = "auto"  # auto, off, or K (executor/runtime/peer_snapshots/cadence.py)
    snapshot_memory: str = "25%"
    log_memory: str = "10%"  # the boundary logs' budget (executor/runtime/replay/)


@dataclass(frozen=True)
class FaultsSection:
    kill: list[str] = field(default_factory=list)
    rejoin: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)
    stall: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    detect_stragglers: bool = True
    trace: Optional[str] = None
    trace_start: str = "0"
    trace_hours: float = 1.0
    gpus_per_node: int = 1
    placement: str = "stages"
    time_scale: float = 60.0


@dataclass(frozen=True)
class CommSection:
    timeout: float = 5.0
    device: str = "auto"
    external: bool = False
    store_port: int = 0


@dataclass(frozen=True)
class ServiceSection:  # the worker token never goes in a file: --token or RECYCLE_TOKEN
    service: Optional[str] = None
    job_id: Optional[str] = None


@dataclass(frozen=True)
class PlanSection:
    solver: str = "greedy"
    no_split: bool = False
    sync: bool = False
    shape: str = "auto"


@dataclass(frozen=True)
class OutputSection:
    run_dir: Optional[str] = None
    summary: Optional[str] = None
    reference: bool = False


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


_SECTIONS = [_Section(name, t, tuple(x.name for x in fields(t)), typing.get_type_hints(t))
             for name, t in typing.get_type_hints(RunConfig).items()]


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
