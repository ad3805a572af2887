"""The manifest of a checkpoint (recycle.json) and the checks `--resume` makes on it.

Resuming must continue the same training: the grid (D, S, M), every model field and the
training settings that shape the optimizer's state or the data (weight decay, betas, the
token file) must match, else exit 2 with the field named. The training settings applied
afresh at every step are the exception (RESUMABLE): the learning rate and its schedule
(the rate is a pure function of the iteration, set before each step), the schedule's
horizon total_iters (a longer run), clipping, precision and activation checkpointing. A
resume may change them; the CLI says which differ.

The manifest keeps the model (ModelConfig and the --model name) and the TrainingSettings
apart, as two dicts. Checkpoints written before they were split (format v2) hold one flat
dict; they load as the same two (config.split_flat).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Optional

from planner.errors import UserError

FORMAT = "recycle.ckpt/v3"
FLAT_FORMAT = "recycle.ckpt/v2"  # one dict of model and training fields together
MANIFEST = "recycle.json"
# Training settings that may differ on resume (honoured); any other difference is refused.
RESUMABLE = {"lr", "total_iters", "lr_schedule", "warmup_iters", "min_lr_ratio", "clip",
             "precision", "activation_checkpointing"}  # (the last: memory and time only)
FLAGS = {"n_heads": "--heads", "n_layers": "--layers", "weight_decay": "weight decay",
         "betas": "Adam betas", "workload": "--model"}


class CheckpointError(UserError):
    """A checkpoint that cannot be resumed from here: one line, the reason."""


@dataclass
class Manifest:
    replicas: int
    stages: int
    microbatches: int
    model: dict
    iteration: int  # last iteration whose step the stage parts hold
    losses: list  # per iteration 0..iteration: the D*M micro-batch losses
    format: str = FORMAT
    job: Optional[dict] = None  # the run's JobSpec (JSON), so `--resume DIR` alone can plan
    training: dict = field(default_factory=dict)  # the run's TrainingSettings (to_dict)

    def save(self, directory: str) -> None:
        tmp = os.path.join(directory, MANIFEST + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(asdict(self), fh)
        os.replace(tmp, os.path.join(directory, MANIFEST))  # complete only once renamed

    @classmethod
    def load(cls, directory: str) -> "Manifest":
        path = os.path.join(directory, MANIFEST)
        try:
            with open(path) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {path}: {str(exc).splitlines()[0][:160]}") from None
        if not isinstance(d, dict) or d.get("format") not in (FORMAT, FLAT_FORMAT):
            raise CheckpointError(f"{directory} is not a recycle checkpoint ({FORMAT})")
        if d["format"] == FLAT_FORMAT and isinstance(d.get("model"), dict):
            from executor.compute.config import split_flat
            d["model"], d["training"] = split_flat(d["model"])
            d["format"] = FORMAT  # read as the two dicts it is now made of
        try:
            return cls(**d)
        except TypeError as exc:
            raise CheckpointError(f"{path}: malformed manifest ({exc})") from None

    def part(self, directory: str, stage: int) -> str:
        return os.path.join(directory, f"stage{stage}")


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter{iteration:06d}")


def complete_iterations(root: str) -> list[int]:
    """Iterations under `root` whose manifest is written, newest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    its = [int(n[4:]) for n in names if n.startswith("iter") and n[4:].isdigit()
           and os.path.exists(os.path.join(root, n, MANIFEST))]
    return sorted(its, reverse=True)


def newest(root: str) -> Optional[str]:
    its = complete_iterations(root)
    return iteration_dir(root, its[0]) if its else None


def resolve(path: str) -> str:
    """A checkpoint directory: `path` itself, or the newest complete one under it."""
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path}")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} is not a recycle checkpoint directory "
                              f"(a directory with {MANIFEST}, or one holding iter*/ of them)")
    if os.path.exists(os.path.join(path, MANIFEST)):
        return path
    found = newest(path)
    if found is None:
        raise CheckpointError(f"{path} holds no complete recycle checkpoint "
                              f"(no {MANIFEST} in it or in an iter*/ under it)")
    return found


def read_checkpoint(path: str, job, cfg, training, iterations: int,
                    model: str = "gpt") -> tuple[str, Manifest]:
    """(checkpoint directory, manifest) that this run can resume from, or CheckpointError.
    `job` is the run's JobSpec, `cfg` its ModelConfig, `training` its TrainingSettings,
    `model` its --model name (kept in the manifest's model dict as "workload"; checkpoints
    from before it hold the GPT)."""
    directory = resolve(path)
    man = Manifest.load(directory)
    grid = (job.replicas, job.stages, job.microbatches)
    if (man.replicas, man.stages, man.microbatches) != grid:
        raise CheckpointError(
            f"checkpoint {directory} is for a {man.replicas}x{man.stages}x{man.microbatches} "
            f"grid (-d x -s x -m), this run is {grid[0]}x{grid[1]}x{grid[2]}")
    from executor.compute.config import ModelConfig, TrainingSettings  # fields added since:
    mine = {**training.to_dict(), **cfg.to_dict(), "workload": model}  # their defaults
    theirs = {**TrainingSettings().to_dict(), **man.training,
              **ModelConfig().to_dict(), "workload": "gpt", **man.model}
    for key in sorted(set(mine) | set(theirs)):
        if key in RESUMABLE or mine.get(key) == theirs.get(key):
            continue
        flag = FLAGS.get(key, "--" + key.replace("_", "-"))
        raise CheckpointError(f"checkpoint {directory} was trained with {key}="
                              f"{theirs.get(key)!r}, this run asks {mine.get(key)!r} "
                              f"({flag}): resume with the checkpoint's model")
    if man.iteration + 1 >= iterations:
        raise CheckpointError(f"checkpoint {directory} already holds iterations 0..{man.iteration}:"
                              f" --iterations must be more than {man.iteration + 1}")
    for s in range(man.stages):
        meta = os.path.join(man.part(directory, s), ".metadata")
        if not os.path.exists(meta):
            raise CheckpointError(f"checkpoint {directory} lacks stage {s}'s part ({meta})")
    return directory, man
