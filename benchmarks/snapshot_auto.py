"""What the default peer-memory snapshots cost: `recycle train`'s launcher and workers with
`--snapshot-every auto` (the default) against `off`, interleaved, on GPT and llama:debug;
ms per iteration as a ratio to off (side by side, median of rounds), the K each run chose
and the host memory a worker held.

    PYTHONPATH=. python benchmarks/snapshot_auto.py [--rounds 5] [--iterations 40]

Writes benchmarks/results/snapshot_auto.md (and prints it).
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from benchmarks.executor_bench import bench_config
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.inputs.workload_name import check_workload
from executor.launch.launcher import Coordinator
from executor.runtime.peer_snapshots.cadence import AUTO, every_text
from planner.job import JobSpec

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 4
D, S, M = 2, 2, 4
MODELS = {"gpt": dict(d_model=128, n_layers=4, seq_len=32),  # ~7 MB of state a stage
          "llama:debug": {}}


def run_once(model: str, every: int, iterations: int, run_dir: str) -> dict:
    cfg = bench_config(model, micro_batch_size=2, **MODELS[model])
    check_workload(model, cfg, S)
    spec = LaunchSpec(cfg, JobSpec.uniform(D, S, M), iterations, solver="greedy",
                      deadline_s=900, run_dir=run_dir,
                      model=model,
                      **sections(timeout=30.0, checkpoint_every=10 ** 9, snapshot_every=every))
    c = Coordinator(spec, console=Console(stderr=True, quiet=True))
    res = c.run()
    if res.summary is None:
        raise SystemExit(f"{model} {every_text(every)}: halted: {res.halted} ({run_dir})")
    ends = [c.iteration_end[i] for i in sorted(c.iteration_end)]
    ms = 1e3 * (ends[-1] - ends[WARMUP]) / (len(ends) - 1 - WARMUP)
    el = res.summary.elastic
    return {"ms": ms, "loss": res.summary.losses[-1], "k": el["snapshot_every"],
            "mib": el["snapshot_mib_per_worker"], "cfg": cfg}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/snapshot_auto.md"))
    args = ap.parse_args(argv)
    models = args.models.split(",")
    load0, t0 = os.getloadavg()[0], time.time()
    runs = {(m, e): [] for m in models for e in (0, AUTO)}
    with tempfile.TemporaryDirectory(prefix="snapshot-auto-") as tmp:
        for r in range(args.rounds):
            for m in models:
                order = (0, AUTO) if r % 2 == 0 else (AUTO, 0)  # each goes first in turn
                for e in order:
                    got = run_once(m, e, args.iterations, os.path.join(tmp, f"{m}-{r}-{e}"))
                    runs[(m, e)].append(got)
                    print(f"round {r} {m} {every_text(e)}: {got['ms']:.1f} ms/iteration, "
                          f"K {got['k']}", flush=True)
    text = report(runs, models, args, load0, t0)
    print(text)
    Path(args.out).write_text(text)


def report(runs: dict, models: list, args, load0: float, t0: float) -> str:
    tree = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT).stdout.strip()
    lines = ["# Peer-memory snapshots at their default (`auto`) against `off`", "",
             "Command: `PYTHONPATH=. python benchmarks/" + Path(__file__).name
             + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "") + "`", "",
             f"`recycle train`'s launcher and workers, {D}x{S} grid, M={M}, micro-batch 2; "
             f"{args.iterations} iterations, ms per iteration from the coordinator's "
             f"iteration ends after iteration {WARMUP}; auto and off interleaved (each first "
             f"in turn), {args.rounds} rounds; tree {tree}; {platform.machine()}, "
             f"{os.cpu_count()} cores shared with other jobs (1-min load {load0:.1f} at the "
             f"start, {os.getloadavg()[0]:.1f} at the end, {time.time() - t0:.0f} s), CPU "
             f"workers, Python {platform.python_version()}.", "",
             "| model | off ms/iteration per round | auto ms/iteration per round "
             "| auto / off (median of rounds) | K auto chose | MiB a worker held (auto) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m in models:
        off, auto = runs[(m, 0)], runs[(m, AUTO)]
        ratio = statistics.median(a["ms"] / o["ms"] for a, o in zip(auto, off))
        ks = sorted({str(a["k"]) for a in auto})
        cfg = auto[0]["cfg"]
        shape = f"d_model {cfg.d_model}, {cfg.n_layers} layers, vocab {cfg.vocab}"
        per = lambda xs: " ".join(f"{x['ms']:.1f}" for x in xs)  # noqa: E731
        lines.append(f"| {m} ({shape}) | {per(off)} | {per(auto)} | **{ratio:.3f}** | "
                     f"{', '.join(ks)} | {statistics.median(a['mib'] for a in auto):.2f} |")
    losses = {m: sorted({f"{x['loss']:.6f}" for x in runs[(m, 0)] + runs[(m, AUTO)]})
              for m in models}
    lines += ["", "Final loss of every run, by model (one value: auto trains what off "
                  "trains): " + "; ".join(f"{m} {', '.join(v)}" for m, v in losses.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
