"""One stage's part of a checkpoint, written by the stage's writer on a background thread."""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional

from executor.checkpoint.manifest import iteration_dir
from executor.checkpoint.stage_state import save_state, stage_state


class PartWriter:
    """Parts of stage `stage` under `checkpoint_dir` (none if it is empty), every `every`
    iterations and at the last one. The state is copied at once and written on a
    background thread (a DCP save took 0.2-0.5 s of wall time on a loaded machine, on the
    critical path); at most one save is in flight. A writer killed before its save finished
    loses that part: the stage's next writer saves it on entering the next plan version (its
    state then is that very state). A failed save costs that checkpoint, never the training."""

    def __init__(self, checkpoint_dir: Optional[str], every: int, iterations: int, stage: int,
                 log: Callable[[str], None], shape: str = "", run: str = ""):
        """`shape`: the directory of the shape's parts inside an iteration's ("" for the
        job's own stages: store.shape_dir); `run`: the run's id, marked in every part."""
        self.checkpoint_dir, self.every, self.iterations = checkpoint_dir, every, iterations
        self.stage, self.log, self.shape, self.run = stage, log, shape, run
        self._saver: Optional[threading.Thread] = None

    def due(self, it: int) -> bool:
        return bool(self.checkpoint_dir) and it >= 0 and ((it + 1) % self.every == 0
                                                     or it == self.iterations - 1)

    def write(self, it: int, module, opt, only_if_missing: bool = False) -> None:
        self.finish()
        path = os.path.join(iteration_dir(self.checkpoint_dir, it), self.shape,
                            f"stage{self.stage}")
        if only_if_missing and os.path.isdir(path):
            return
        sd = stage_state(module, opt, copy=True)

        def save():
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_state(sd, path, self.run)
            except Exception as exc:  # noqa: BLE001 - disk full, directory pruned meanwhile
                self.log(f"checkpoint part of iteration {it} not written: {str(exc)[:200]}")
        self._saver = threading.Thread(target=save, name=f"checkpoint-{it}", daemon=True)
        self._saver.start()

    def finish(self) -> None:
        """Wait for the part being written (before the process ends)."""
        if self._saver is not None:
            self._saver.join()
            self._saver = None
