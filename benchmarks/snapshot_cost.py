"""What peer-memory snapshots cost: `recycle train`'s workers with --snapshot-every K (off,
1, 4), interleaved runs of the plain launcher on the same 2x2 GPT (a few MB of state per
stage), time per iteration as a ratio to K = off, the copy on the critical path per
snapshot, the send in the background, and the host memory the snapshots take.

    PYTHONPATH=. python benchmarks/snapshot_cost.py [--rounds 5] [--iterations 30] [--ks 0,1,4]

Writes benchmarks/results/snapshot_cost.md (and prints it).
"""
from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig
from executor.launch.launcher import Coordinator
from executor.runtime.peer_snapshots.local import LocalCopies
from executor.inputs.launch_spec import LaunchSpec, sections
from planner.job import JobSpec

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 4
D, S, M = 2, 2, 4
# GPT, 4 layers of d_model 128 over 2 stages: ~0.6 M parameters a stage; with AdamW's two
# moments about 7 MB of state per stage, big enough for the copies to show.
CFG = ModelConfig(vocab=1024, seq_len=32, d_model=128, n_heads=4, n_layers=4,
                  micro_batch_size=2)
STAT = re.compile(r"\[worker (\d+):(\d+)\] snapshots: (.*)")


def run_once(k: int, iterations: int, run_dir: str) -> dict:
    spec = LaunchSpec(CFG, JobSpec.uniform(D, S, M), iterations, solver="greedy",
                      deadline_s=600, run_dir=run_dir,
                      **sections(timeout=30.0, checkpoint_every=10 ** 9, snapshot_every=k))
    c = Coordinator(spec, console=Console(stderr=True, quiet=True))
    res = c.run()
    if res.summary is None:
        raise SystemExit(f"K={k}: the run halted: {res.halted} (logs in {run_dir})")
    ends = [c.iteration_end[i] for i in sorted(c.iteration_end)]
    ms = 1e3 * (ends[-1] - ends[WARMUP]) / (len(ends) - 1 - WARMUP)
    stats = {}
    for path in glob.glob(os.path.join(run_dir, "worker-*.log")):
        for line in open(path):
            m = STAT.search(line)
            if m:
                stats[(int(m[1]), int(m[2]))] = _fields(m[3])
    return {"ms": ms, "loss": res.summary.losses[-1], "stats": stats}


def _fields(text: str) -> dict:
    out = {}
    for part in text.split(" "):
        key, _, value = part.partition("=")
        try:
            out[key] = float(value) if "." in value else int(value)
        except ValueError:
            out[key] = value
    return out


def copy_in_process(repeat: int = 50) -> dict:
    """One stage's offer on this thread alone: state_dict calls and the host copy."""
    torch.set_num_threads(1)
    m = DEFAULT_WORKLOAD.build_stage(CFG, 0, S)
    opt = DEFAULT_WORKLOAD.make_optimizer(CFG, m.parameters())
    sum(p.sum() for p in m.parameters()).backward()
    opt.step()
    local = LocalCopies(2)
    dicts, takes = [], []
    for i in range(repeat):
        t0 = time.perf_counter()
        state = {"model": m.state_dict(), "optim": opt.state_dict()}
        t1 = time.perf_counter()
        local.take(i, state)
        takes.append(time.perf_counter() - t1)
        dicts.append(t1 - t0)
    return {"dicts_ms": 1e3 * statistics.median(dicts), "take_ms": 1e3 * statistics.median(takes),
            "bytes": local.get(repeat - 1).nbytes}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--ks", default="0,1,4", help="K values, 0 = off (always run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/snapshot_cost.md"))
    args = ap.parse_args(argv)
    ks = sorted({0, *(int(k) for k in args.ks.split(","))})
    runs: dict[int, list[dict]] = {k: [] for k in ks}
    args.load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="snapshot-cost-") as tmp:
        for r in range(args.rounds):
            order = ks[r % len(ks):] + ks[:r % len(ks)]  # each K goes first in some round
            for k in order:
                got = run_once(k, args.iterations, os.path.join(tmp, f"r{r}-k{k}"))
                runs[k].append(got)
                print(f"round {r} K={k or 'off'}: {got['ms']:.1f} ms/iteration", flush=True)
    local = copy_in_process()
    text = report(runs, local, args)
    print(text)
    Path(args.out).write_text(text)


def report(runs: dict[int, list[dict]], local: dict, args) -> str:
    rounds = len(runs[0])
    off = [x["ms"] for x in runs[0]]
    losses = {f"{x['loss']:.6f}" for xs in runs.values() for x in xs}
    load = os.getloadavg()[0]
    lines = ["# What peer-memory snapshots cost", "",
             "Command: `PYTHONPATH=. python benchmarks/" + Path(__file__).name
             + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "") + "`", "",
             f"`recycle train`'s launcher and workers, {D}x{S} grid, M={M}, GPT d_model "
             f"{CFG.d_model}, {CFG.n_layers} layers, vocab {CFG.vocab}, seq {CFG.seq_len}; "
             f"{args.iterations} iterations, ms per iteration from the coordinator's iteration "
             f"ends after iteration {WARMUP}; K values interleaved, {rounds} rounds; "
             f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs "
             f"(1-min load {args.load_start:.1f} at the start, {load:.1f} at the end), "
             f"CPU workers, Python "
             f"{platform.python_version()}. Final losses of all runs: {', '.join(sorted(losses))}.",
             "", "| K | ms/iteration per round | median | ratio to off (median of rounds) |",
             "| --- | --- | --- | --- |"]
    for k, xs in runs.items():
        ms = [x["ms"] for x in xs]
        ratio = statistics.median(m / o for m, o in zip(ms, off))
        lines.append(f"| {k or 'off'} | {' '.join(f'{m:.1f}' for m in ms)} | "
                     f"{statistics.median(ms):.1f} | {ratio:.3f} |")
    lines += ["", "Per snapshot (medians over workers and rounds; the copy is the training "
                  "thread's only snapshot work, the send runs on the sender thread):", "",
              "| K | copy on the critical path | send to the holder (background) | snapshots sent / dropped / failed |",
              "| --- | --- | --- | --- |"]
    for k, xs in runs.items():
        if not k:
            continue
        st = [w for x in xs for w in x["stats"].values() if w["offers"]]
        if not st:
            lines.append(f"| {k} | no snapshot was due | | |")
            continue
        copy = statistics.median(w["copy_ms_median"] for w in st)
        send = statistics.median([w["send_ms_median"] for w in st if w["sent"]] or [0.0])
        sent, dropped, failed = (sum(w[f] for w in st) for f in ("sent", "dropped", "failed"))
        lines.append(f"| {k} | {copy:.2f} ms | {send:.1f} ms | {sent} / {dropped} / {failed} |")
    lines += ["", f"The same offer on one thread alone (no other process busy): the "
                  f"state_dict calls {local['dicts_ms']:.2f} ms, the host copy of "
                  f"{local['bytes'] / 2**20:.1f} MiB {local['take_ms']:.2f} ms.", "",
              "Host memory at the end of a run (median over rounds), per worker: snapshots "
              "it holds for another stage (held) and its own stage's copies (local), in "
              "bytes and as a multiple of one stage's state:", "",
              "| K | worker | holds (stage: iterations) | held | held / state | local | local / state |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for k, xs in runs.items():
        if not k:
            continue
        state_of = {s: statistics.median(x["stats"][(0, s)]["state_bytes"] for x in xs)
                    for s in range(S)}
        if not all(state_of.values()):
            continue  # no snapshot was due
        for w in sorted(xs[0]["stats"]):
            rows = [x["stats"][w] for x in xs if w in x["stats"]]
            held_stages = [int(h) for h in re.findall(r"(\d+):\[", rows[0]["held"])]
            held_state = sum(state_of[s] for s in held_stages) or 1
            held = statistics.median(r["held_bytes"] for r in rows)
            loc = statistics.median(r["local_bytes"] for r in rows)
            lines.append(f"| {k} | {w[0]}:{w[1]} | {rows[0]['held']} | {held / 2**20:.2f} MiB | "
                         f"{held / held_state:.2f} | {loc / 2**20:.2f} MiB | "
                         f"{loc / state_of[w[1]]:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
