"""Disk checkpoints as a tier of the stage state a restore may take (docs/executor.md,
"State in tiers"): live holders, peer-memory snapshots, then the checkpoints on disk.

A member can use a checkpoint of iteration c when every part of one shape of it is
written (store.complete_parts; the manifest, which the coordinator adds once the losses
through c are in too, is what a resume needs, not a restore: waiting for it made the
newest checkpoint miss a restore right after it) and of this run (every part marked with
the run's id: checkpoint/stage_state.py RUN_MARK; another run's parts left in the same
directory are no copy of this one's state), or when it is the checkpoint the run resumed
from (the run's origin). Parts load by name into a stage of any shape.
"""
from __future__ import annotations

import os

from executor.checkpoint.manifest import iteration_dir
from executor.checkpoint.stage_state import run_of
from executor.checkpoint.store import complete_parts
from executor.runtime.stage_state.entry_plan import PER_DISK
from executor.runtime.worker_config import WorkerConfig

Copies = dict[int, tuple[str, ...]]  # iteration -> the parts of its checkpoint


def disk_copies(conf: WorkerConfig) -> Copies:
    """The checkpoints this worker can restore a stage from, newest first (at most
    PER_DISK of this run's, and the run's origin)."""
    out: Copies = {}
    root = conf.checkpoint_dir
    if root and conf.run_id:
        try:
            names = os.listdir(root)
        except OSError:  # not made yet, or not shared with this host: no disk tier here
            names = []
        its = sorted((int(n[4:]) for n in names if n.startswith("iter") and n[4:].isdigit()),
                     reverse=True)
        for i in its:
            if len(out) == PER_DISK:
                break
            d = iteration_dir(root, i)
            parts = complete_parts(d, conf.job.stages)
            if parts and all(run_of(os.path.join(d, p)) == conf.run_id for p in parts):
                out[i] = tuple(os.path.join(d, p) for p in parts)
    if conf.origin_parts and all(os.path.isdir(p) for p in conf.origin_parts):
        out.setdefault(conf.start_iteration - 1, tuple(conf.origin_parts))
    return dict(sorted(out.items(), reverse=True)[:PER_DISK])
