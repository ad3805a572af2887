"""How much `recycle profile`'s figures move with machine load: before and after.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_noise.py [--rounds 3] [--repeats 7]

Two ways of measuring the same stages (GPT d=128, 4 layers, seq 32, micro-batch 8, S=2):
  before   torch's default thread count and wall-clock times (what `recycle profile` did);
  after    the workers' thread count (1) and the thread's CPU time (what it does now).
Each is run on an idle machine and with `--hogs` busy-loop processes (one per core by
default) competing for the cores, interleaved over `--rounds` rounds. Reported per
figure (F, I, W, OPT of stage 0 and 1): the median over rounds of the profile's median,
the ratio loaded / idle, and the profile's own spread ((max - min) / median of its
rounds). Writes benchmarks/results/profile_noise.md.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from executor.compute.model import ModelConfig  # noqa: E402
from executor.compute.measure.profile import profile  # noqa: E402

KEYS = ("F", "I", "W", "OPT")


def hog() -> None:
    while True:
        pass


def measure(cfg, threads, repeats):
    rows = []
    profile(cfg, 2, 2, 4, repeats=repeats, threads=threads, details=rows, memory_budget=10**10)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--hogs", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks/results/profile_noise.md"))
    args = ap.parse_args()
    cfg = ModelConfig(vocab=256, seq_len=32, d_model=128, n_heads=4, n_layers=4, micro_batch_size=8)
    default_threads = torch.get_num_threads()
    modes = {"before": default_threads, "after": 1}
    res = {(m, load): [] for m in modes for load in ("idle", "loaded")}
    ctx = multiprocessing.get_context("fork")
    for _ in range(args.rounds):
        for load in ("idle", "loaded"):
            hogs = [ctx.Process(target=hog, daemon=True) for _ in range(args.hogs if load == "loaded" else 0)]
            for h in hogs:
                h.start()
            time.sleep(0.2 if hogs else 0)
            try:
                for m, threads in modes.items():
                    res[(m, load)].append(measure(cfg, threads, args.repeats))
            finally:
                for h in hogs:
                    h.kill()
                    h.join()
    lines = ["# `recycle profile` under machine load", "",
             f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/profile_noise.py "
             f"{shlex.join(sys.argv[1:])}`",
             "", f"{os.cpu_count()} cores; torch {torch.__version__}; `before` = {default_threads} "
             f"threads + wall clock, `after` = 1 thread + thread CPU time; loaded = "
             f"{args.hogs} busy-loop processes; {args.rounds} rounds x {args.repeats} repeats. "
             "Times in us (median over rounds of each profile's median); spread = the "
             "profile's (max - min) / median, median over rounds.", "",
             "| stage | figure | before idle | before loaded | ratio | spread idle / loaded "
             "| after idle | after loaded | ratio | spread idle / loaded |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for s in range(2):
        for k in KEYS:
            cells = []
            for m in modes:
                idle = statistics.median(r[s][k] for r in res[(m, "idle")])
                loaded = statistics.median(r[s][k] for r in res[(m, "loaded")])
                sp = [statistics.median(r[s]["spread"][k] for r in res[(m, load)])
                      for load in ("idle", "loaded")]
                cells += [f"{idle:.0f}", f"{loaded:.0f}", f"{loaded / idle:.2f}",
                          f"{sp[0]:.2f} / {sp[1]:.2f}"]
            lines.append(f"| {s} | {k} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
