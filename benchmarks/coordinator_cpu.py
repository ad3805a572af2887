"""CPU the in-process coordinator takes per training iteration (its main loop, the store
server and the mailbox reader: every thread of the `recycle train` process), measured from
the end of iteration `warmup` to the end of the last. On a host whose cores the workers
fill, this time is taken from them.

    python -m benchmarks.coordinator_cpu [--model llama:debug] [--iterations 300]
"""
from __future__ import annotations

import argparse
import resource
import time

from rich.console import Console

from benchmarks.executor_bench import bench_config
from executor.launch.launcher import Coordinator
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.inputs.workload_name import check_workload
from planner.job import JobSpec
from planner.plan import Mode


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Metered(Coordinator):
    """Reads the process's CPU clock when iteration `warmup` and the last one complete."""

    def __init__(self, *args, warmup: int, **kw):
        super().__init__(*args, **kw)
        self.warmup, self.marks = warmup, {}

    def progress(self, *args, **kw) -> None:
        super().progress(*args, **kw)
        for it in (self.warmup, self.iterations - 1):
            if it <= self.printed and it not in self.marks:
                self.marks[it] = (time.monotonic(), _cpu_s())


def measure(model: str, replicas: int, stages: int, microbatches: int, iterations: int,
            warmup: int) -> dict:
    cfg = bench_config(model)
    check_workload(model, cfg, stages)
    job = JobSpec.uniform(replicas, stages, microbatches)
    spec = LaunchSpec(cfg, job, iterations, model=model, mode=Mode(split_backward=False),
                      **sections(checkpoint_every=10 ** 9))
    coord = _Metered(spec, warmup=warmup, console=Console(stderr=True, quiet=True))
    if coord.run().summary is None:
        raise SystemExit("training did not complete")
    (t0, c0), (t1, c1) = coord.marks[warmup], coord.marks[iterations - 1]
    n = iterations - 1 - warmup
    return {"ms_per_iteration": 1e3 * (t1 - t0) / n, "coordinator_cpu_ms_per_iteration":
            1e3 * (c1 - c0) / n, "coordinator_cpu_share": (c1 - c0) / (t1 - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama:debug")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    r = measure(a.model, a.replicas, a.stages, a.microbatches, a.iterations, a.warmup)
    print(f"{a.model} D={a.replicas} S={a.stages} M={a.microbatches}: "
          f"{r['ms_per_iteration']:.1f} ms per iteration; coordinator CPU "
          f"{r['coordinator_cpu_ms_per_iteration']:.2f} ms per iteration "
          f"({100 * r['coordinator_cpu_share']:.1f}% of one core)")


if __name__ == "__main__":
    main()
