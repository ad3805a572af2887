"""The coordinator's side: turn stage parts into complete checkpoints, keep the newest.

Writers save their stage's part after the step of every `every`-th iteration (and the
last) into `root/iter{i}/stage{s}`, or, under a cut of the job's stages, into
`root/iter{i}/shape{S'}-{id}/stage{s}` (part_writer.py); `collect` writes the manifest of
an iteration once all parts of one shape and all losses up to it are in, then drops older checkpoints beyond `keep`
(and incomplete ones older than the newest complete: nobody can finish them any more).
"""
from __future__ import annotations

import os
import shutil
from typing import Callable, Optional

from executor.checkpoint.manifest import (MANIFEST, Manifest, complete_iterations,
                                          iteration_dir)


def shape_dir(stages: int, shape_id: int) -> str:
    """Where the parts of a cut into `stages` stages go inside an iteration's directory."""
    return f"shape{stages}-{shape_id:08x}"


def complete_parts(d: str, stages: int) -> Optional[list[str]]:
    """The parts (relative) of one shape all written under iteration directory `d`: the
    job's own `stages` first, else any cut's; None while no shape is complete."""
    def whole(prefix: str, n: int) -> Optional[list[str]]:
        names = [os.path.join(prefix, f"stage{s}") if prefix else f"stage{s}" for s in range(n)]
        return names if all(os.path.exists(os.path.join(d, x, ".metadata")) for x in names) else None

    found = whole("", stages)
    if found is not None:
        return found
    try:
        cuts = sorted(n for n in os.listdir(d) if n.startswith("shape") and "-" in n)
    except OSError:
        return None
    for cut in cuts:
        count = cut[len("shape"):].split("-", 1)[0]
        if count.isdigit() and int(count) > 0:
            found = whole(cut, int(count))
            if found is not None:
                return found
    return None


class CheckpointStore:
    def __init__(self, root: str, grid: tuple[int, int, int], model: dict, keep: int = 2,
                 job: Optional[dict] = None, training: Optional[dict] = None):
        """`model`: the ModelConfig's dict and the --model name; `training`: the
        TrainingSettings' dict (the manifest keeps both)."""
        self.root, self.grid, self.model, self.keep = root, grid, model, max(1, keep)
        self.job, self.training = job, training or {}
        os.makedirs(root, exist_ok=True)

    def collect(self, losses_upto: Callable[[int], Optional[list]]) -> Optional[int]:
        """Write manifests for iterations now complete; newest complete iteration.
        `losses_upto(i)` gives the losses of iterations 0..i, or None if some are missing."""
        D, S, M = self.grid
        try:
            names = sorted(os.listdir(self.root))
        except OSError:  # removed or unreadable meanwhile: no checkpoint, training goes on
            return None
        for name in names:
            if not (name.startswith("iter") and name[4:].isdigit()):
                continue
            d = os.path.join(self.root, name)
            if os.path.exists(os.path.join(d, MANIFEST)):
                continue
            parts = complete_parts(d, S)
            if parts is None:
                continue
            i = int(name[4:])
            losses = losses_upto(i)
            if losses is not None:
                Manifest(D, S, M, self.model, i, losses, job=self.job,
                         training=self.training, parts=parts).save(d)
        done = complete_iterations(self.root)
        if done:
            self._prune(done)
        return done[0] if done else None

    def _prune(self, done: list[int]) -> None:
        keep = set(done[:self.keep])
        for name in os.listdir(self.root):
            if name.startswith("iter") and name[4:].isdigit():
                i = int(name[4:])
                if i not in keep and i < done[0]:
                    shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def part(self, iteration: int, stage: int) -> str:
        return os.path.join(iteration_dir(self.root, iteration), f"stage{stage}")

    def newest(self) -> Optional[str]:
        done = complete_iterations(self.root)
        return iteration_dir(self.root, done[0]) if done else None
