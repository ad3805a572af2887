"""End to end: `recycle train`'s workers with the next iteration's micro-batches loaded on
the agent's loader thread (the default) vs generated inline at F, interleaved runs of
the plain launcher (no benchmark instrumentation, no data generated up front).

    PYTHONPATH=. python benchmarks/loader_ab.py [--rounds 3] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import os

from rich.console import Console

from benchmarks.ab_table import write_ab
from benchmarks.executor_bench import bench_config
from executor import worker
from executor.launch.coordinator import processes
from executor.launch.launcher import Coordinator
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.runtime import worker_loop
from planner.job import JobSpec

ITERS, WARMUP = 14, 3


def child_inline(store, replica, stage, log_path, token=None, coordinator=None):
    """executor.worker.child with the loader thread off: every micro-batch inline at F."""
    init = worker_loop.WorkerLoop.__init__

    def no_loader(self, *a, **k):
        init(self, *a, **k)
        self.h.stage.batches.ahead = False
    worker_loop.WorkerLoop.__init__ = no_loader
    worker.child(store, replica, stage, log_path, token, coordinator)


def _run(loader: bool) -> tuple[float, float]:
    saved = processes.worker_child
    if not loader:
        processes.worker_child = child_inline
    try:
        c = Coordinator(LaunchSpec(bench_config("gpt"), JobSpec.uniform(1, 2, 4), ITERS,
                                   solver="greedy", deadline_s=300,
                                   **sections(timeout=30.0, checkpoint_every=10 ** 9)),
                  console=Console(stderr=True, quiet=True))
        res = c.run()
    finally:
        processes.worker_child = saved
    ends = [c.iteration_end[i] for i in sorted(c.iteration_end)]
    return 1e3 * (ends[-1] - ends[WARMUP]) / (len(ends) - 1 - WARMUP), res.summary.losses[-1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    res: dict[str, list[float]] = {"loader thread": [], "inline at F": []}
    last = set()
    for _ in range(args.rounds):
        for name, on in (("loader thread", True), ("inline at F", False)):
            ms, loss = _run(on)
            res[name].append(ms)
            last.add(loss)
    cmd = f"PYTHONPATH=. python benchmarks/loader_ab.py --rounds {args.rounds}" + \
        (f" --out {args.out}" if args.out else "")
    write_ab("Micro-batches loaded ahead on a thread vs inline at F, end to end", cmd,
             f"`recycle train` workers (ReCycle D=1 S=2, I/W split), the executor benchmark's GPT "
             f"and its synthetic data, {ITERS} iterations, first {WARMUP} excluded; ms per "
             f"iteration from the coordinator's iteration ends, runs interleaved; "
             f"{os.cpu_count()} cores shared with other jobs (1-min load at the end "
             f"{os.getloadavg()[0]:.1f}). Final losses of all runs: "
             f"{', '.join(f'{v:.6f}' for v in sorted(last))} (the same data either way).",
             "data", res, args.out)


if __name__ == "__main__":
    main()
