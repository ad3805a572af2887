"""The manifest of a checkpoint (recycle.json) and the checks `--resume` makes on it.

A checkpoint is the model's and optimizer's state by parameter name, in parts written
by whatever shape was in force (the job's own stages: `stage{s}`; a cut of it:
`shape{S'}-{id}/stage{s}`, listed in `parts`), plus the iteration, the losses and the
settings. None of it is tied to a grid: a run resumes on any D x S that keeps the global
batch (D x M micro-batches of the same size; the data is indexed by iteration and global
micro-batch), its stages filled by name from the parts (stage_state.load_by_name).

Resuming must continue the same training: the global batch, every model field but the
stage split, and the training settings that shape the optimizer's state or the data (weight decay, betas, the
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

from executor.inputs.run_config import OPTIMIZER_SETTINGS
from planner.errors import UserError

FORMAT = "recycle.ckpt/v3"
FLAT_FORMAT = "recycle.ckpt/v2"  # one dict of model and training fields together
MANIFEST = "recycle.json"
# Training settings that may differ on resume (honoured); any other difference is refused.
# [optimizer]'s settings are: the optimizer is built from the run's settings every start.
RESUMABLE = {"total_iters", "lr_schedule", "warmup_iters", "min_lr_ratio", "clip",
             "precision", "activation_checkpointing",  # (the last: memory and time only)
             *OPTIMIZER_SETTINGS}
FLAGS = {"n_heads": "--heads", "n_layers": "--layers", "betas": "Adam betas",
         "workload": "--model"}


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
    # the parts' directories (relative), one per stage of the shape that wrote them;
    # None (checkpoints before shapes): stage0..stage{stages-1}
    parts: Optional[list] = None

    @property
    def global_batch(self) -> int:
        return self.replicas * self.microbatches

    def part_dirs(self, directory: str) -> list[str]:
        """Every part of this checkpoint, absolute, in stage order of the shape that wrote it."""
        names = self.parts if self.parts is not None else [f"stage{s}" for s in range(self.stages)]
        return [os.path.join(directory, n) for n in names]

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
    if job.replicas * job.microbatches != man.global_batch:
        raise CheckpointError(
            f"checkpoint {directory} trained a global batch of {man.global_batch} micro-batches "
            f"({man.replicas}x{man.stages}x{man.microbatches}, -d x -s x -m), this run "
            f"{job.replicas}x{job.stages}x{job.microbatches} takes "
            f"{job.replicas * job.microbatches}: {_batch_hint(man.global_batch, job.replicas)}")
    from executor.compute.config import ModelConfig, TrainingSettings  # fields added since:
    mine = {**training.to_dict(), **cfg.to_dict(), "workload": model}  # their defaults
    theirs = {**TrainingSettings().to_dict(), **man.training,
              **ModelConfig().to_dict(), "workload": "gpt", **man.model}
    for key in sorted(set(mine) | set(theirs)):
        # the stage split is the grid's, not the model's: parts load by name into any
        if key in RESUMABLE or key == "boundaries" or mine.get(key) == theirs.get(key):
            continue
        flag = FLAGS.get(key, "--" + key.replace("_", "-"))
        raise CheckpointError(f"checkpoint {directory} was trained with {key}="
                              f"{theirs.get(key)!r}, this run asks {mine.get(key)!r} "
                              f"({flag}): resume with the checkpoint's model")
    if man.iteration + 1 >= iterations:
        raise CheckpointError(f"checkpoint {directory} already holds iterations 0..{man.iteration}:"
                              f" --iterations must be more than {man.iteration + 1}")
    for s, part in enumerate(man.part_dirs(directory)):
        meta = os.path.join(part, ".metadata")
        if not os.path.exists(meta):
            raise CheckpointError(f"checkpoint {directory} lacks stage {s}'s part ({meta})")
    return directory, man


def resumed_microbatches(man: Manifest, replicas: int) -> Optional[int]:
    """M for `replicas` replicas that keeps the checkpoint's global batch (None: none does)."""
    return man.global_batch // replicas if man.global_batch % replicas == 0 else None


def _batch_hint(batch: int, replicas: int) -> str:
    if batch % replicas == 0:
        return f"give -m {batch // replicas} (or leave -m out)"
    fits = [d for d in range(1, batch + 1) if batch % d == 0]
    return f"-d must divide {batch} ({', '.join(map(str, fits))})"
