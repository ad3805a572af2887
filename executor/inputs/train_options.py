"""Checks of `recycle train`'s options that no worker process should discover later: a
worker that crashes on a bad value shows up as a failure, then as "no plan: stage N has no
live replica", which hides the real cause; a summary path that cannot be written loses a
finished run's result."""
from __future__ import annotations

import math
from typing import Optional

from executor.inputs.run_config import OPTIMIZER_SETTINGS
from planner.errors import UserError


DEFAULT_GRID = (2, 2, 4)
# Worker processes `train` starts on this machine (each is a torch process of a few hundred
# MB); more run under torchrun with --external.
MAX_LOCAL_WORKERS = 64


def check_model_options(*, d_model: int, layers: int, heads: int, seq_len: int,
                        micro_batch_size: int, vocab: int, lr: float) -> None:
    """The model's shape and --lr (the run's own settings are LaunchSpec's to check)."""
    for flag, value in (("--d-model", d_model), ("--layers", layers), ("--heads", heads),
                        ("--seq-len", seq_len), ("--micro-batch-size", micro_batch_size),
                        ("--vocab", vocab)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    if d_model % heads:
        raise UserError(f"--d-model {d_model} must be a multiple of --heads {heads}")
    if not (math.isfinite(lr) and lr >= 0):
        raise UserError(f"--lr must be a finite number >= 0, not {lr:g}")


def grid_of(spec, job_path: Optional[str], replicas: Optional[int], stages: Optional[int],
            microbatches: Optional[int]) -> tuple[int, int, int]:
    """The grid: the --job's, or -d/-s/-m (defaults 2, 2, 4); both given must agree."""
    asked = (replicas, stages, microbatches)
    if spec is None:
        return tuple(a if a is not None else d for a, d in zip(asked, DEFAULT_GRID))
    have = (spec.replicas, spec.stages, spec.microbatches)
    for flag, a, h in zip(("-d", "-s", "-m"), asked, have):
        if a is not None and a != h:
            raise UserError(f"--job {job_path} is a {have[0]}x{have[1]}x{have[2]} grid "
                             f"(DxSxM), but {flag} {a} asks otherwise; leave {flag} out")
    return have


def check_local_workers(replicas: int, stages: int) -> None:
    if replicas * stages > MAX_LOCAL_WORKERS:
        raise UserError(f"{replicas}x{stages} = {replicas * stages} worker processes on this "
                         f"machine is over {MAX_LOCAL_WORKERS}; run them under torchrun "
                         f"with --external")


PRECISIONS = ("fp32", "bf16")


def check_training(*, precision: str, lr_schedule: str, warmup: int,
                   min_lr_ratio: Optional[float], clip: float, iterations: int) -> float:
    """--precision, --lr-schedule, --warmup, --min-lr-ratio and --clip (docs/executor.md,
    "Training features"). Returns the cosine floor to use (--min-lr-ratio or 0.1)."""
    from executor.optim.schedule import SCHEDULES
    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if lr_schedule not in SCHEDULES:
        raise UserError(f"--lr-schedule must be one of {', '.join(SCHEDULES)}, "
                         f"not {lr_schedule!r}")
    if warmup < 0:
        raise UserError(f"--warmup must be 0 or more iterations, not {warmup}")
    if not (math.isfinite(clip) and clip >= 0):
        raise UserError(f"--clip must be a finite norm >= 0 (0: off), not {clip:g}")
    if min_lr_ratio is not None:
        if lr_schedule != "cosine":
            raise UserError("--min-lr-ratio sets the floor of --lr-schedule cosine; "
                             f"it does nothing with {lr_schedule!r}")
        if not 0 <= min_lr_ratio <= 1:  # NaN fails both comparisons
            raise UserError(f"--min-lr-ratio must be within [0, 1], not {min_lr_ratio:g}")
    if lr_schedule == "cosine" and warmup >= iterations:
        raise UserError(f"--warmup {warmup} leaves no iteration for the cosine decay of "
                         f"--iterations {iterations}: use fewer warm-up iterations")
    return 0.1 if min_lr_ratio is None else float(min_lr_ratio)


def checkpointing_of(flag: Optional[str], spec) -> str:
    """--activation-checkpointing as the run trains it: the flag, else the --job's (what its
    memory figures were measured under), else none. One line for a bad value, and for a
    flag other than the job's: its activation figures would not be this run's."""
    from executor.compute.backward.recompute import Policy
    mine = Policy.parse(flag) if flag is not None else None
    job = getattr(spec, "activation_checkpointing", None)
    theirs = Policy.parse(job) if job else None
    if mine is None:
        return str(theirs or Policy())
    if theirs is not None and theirs != mine:
        raise UserError(f"--activation-checkpointing {mine}: the --job was profiled with "
                        f"{theirs}, so its activation memory is not this run's; profile "
                        f"again with {mine}, or leave the flag out")
    return str(mine)


# Training settings a resume may change: each is applied per step from the config, so
# the continued run honours it from its first iteration on (checkpoint/manifest.py).
TRAINING_FLAGS = {"total_iters": "--iterations (the schedule's horizon)",
                  "lr_schedule": "--lr-schedule", "warmup_iters": "--warmup",
                  "min_lr_ratio": "--min-lr-ratio", "clip": "--clip",
                  "precision": "--precision",
                  "activation_checkpointing": "--activation-checkpointing",
                  **{k: "--" + k.replace("_", "-") for k in OPTIMIZER_SETTINGS}}


def resume_changes(saved: dict, training) -> list[str]:
    """What this resumed run trains differently from its checkpoint (`saved`: the
    manifest's training dict), one note each."""
    mine = training.to_dict()
    from executor.compute.config import TrainingSettings  # checkpoints from before a field
    theirs = {**TrainingSettings().to_dict(), **saved}
    return [f"{flag} {mine[k]!r} (it trained with {theirs[k]!r})"
            for k, flag in TRAINING_FLAGS.items() if mine[k] != theirs[k]
            and not (k == "total_iters" and training.lr_schedule == "constant")]  # unused then


# `train --resume DIR`: each flag the checkpoint fixes -> its field in the manifest's model
# or training dict.
RESUMED = {"model": "workload", "d_model": "d_model", "layers": "n_layers",
           "heads": "n_heads", "seq_len": "seq_len", "vocab": "vocab",
           "micro_batch_size": "micro_batch_size", "seed": "seed",
           "precision": "precision", "lr_schedule": "lr_schedule", "warmup": "warmup_iters",
           "clip": "clip", "data": "data",
           "activation_checkpointing": "activation_checkpointing",
           **{k: k for k in OPTIMIZER_SETTINGS}}


def resumed_defaults(man) -> dict:
    """`--resume DIR` alone continues the checkpoint's run: the value of every flag left
    out, from its manifest (flags given still win; read_checkpoint refuses those that
    contradict it). --iterations: the run's own, if it had iterations left."""
    saved = {"workload": "gpt", **man.model, **man.training}  # before --model: the GPT
    out = {"replicas": man.replicas, "stages": man.stages, "microbatches": man.microbatches}
    out.update({flag: saved[key] for flag, key in RESUMED.items()
                if saved.get(key) not in (None, "")})
    if saved.get("lr_schedule") == "cosine" and "min_lr_ratio" in saved:
        out["min_lr_ratio"] = saved["min_lr_ratio"]
    if saved.get("total_iters", 0) > man.iteration + 1:
        out["iterations"] = saved["total_iters"]
    return out
