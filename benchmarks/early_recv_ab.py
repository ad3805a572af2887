"""End to end: ReCycle D=1 S=2 with receives posted ahead (the runtime's default) vs
posted at their action, interleaved runs of the executor benchmark's model and workers
(benchmarks/timed_worker.py). benchmarks/gloo_early_recv.py measures the per-hop effect.

    PYTHONPATH=. python benchmarks/early_recv_ab.py [--rounds 6] [--fused] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import os

from rich.console import Console

from benchmarks import timed_worker
from benchmarks.ab_table import write_ab
from benchmarks.executor_bench import TimedCoordinator, bench_config, steady_ms
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.runtime.transport import comm
from planner.job import JobSpec
from planner.plan import Mode

ITERS, WARMUP = 14, 3


def child_at_action(store, replica, stage, log_path, token=None, coordinator=None):
    """The benchmark worker with every receive posted at its action."""
    comm.World.post_early = lambda self, *a, **k: False
    timed_worker.child(store, replica, stage, log_path, token, coordinator)


def _run(early: bool, split: bool) -> float:
    c = TimedCoordinator(LaunchSpec(bench_config("gpt"), JobSpec.uniform(1, 2, 4), ITERS,
                                    solver="greedy", deadline_s=300,
                                    mode=Mode(split_backward=split),
                                    **sections(timeout=30.0, checkpoint_every=10 ** 9)),
                         console=Console(stderr=True, quiet=True))
    c.processes.target = timed_worker.child if early else child_at_action
    c.run()
    return max(steady_ms(v, ITERS, WARMUP) for v in c.walls.values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--fused", action="store_true", help="fused-B plans instead of the I/W split")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    res: dict[str, list[float]] = {"ahead": [], "at action": []}
    for _ in range(args.rounds):
        res["ahead"].append(_run(True, not args.fused))
        res["at action"].append(_run(False, not args.fused))
    cmd = "PYTHONPATH=. python benchmarks/early_recv_ab.py --rounds " + str(args.rounds) + \
        (" --fused" if args.fused else "") + (f" --out {args.out}" if args.out else "")
    write_ab("Receives posted ahead vs at their action, end to end", cmd,
             f"ReCycle D=1 S=2 ({'fused B' if args.fused else 'I/W split'}), the executor benchmark's "
             f"GPT, {ITERS} iterations, first {WARMUP} excluded; realised ms/iter per run, runs "
             f"interleaved; {os.cpu_count()} cores shared with other jobs (1-min load at the end "
             f"{os.getloadavg()[0]:.1f}).",
             "receives", res, args.out)


if __name__ == "__main__":
    main()
