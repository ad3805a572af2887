"""What StageCompute adds to a stage's own compute: its F and fused B against the plain
module call and autograd backward that torch's PipelineStage runs, in one process, no
communication, the same module and micro-batches, alternating (medians over rounds).

    python -m benchmarks.stage_compute_ab [--model llama:debug] [--rounds 60] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.executor_bench import bench_config
from executor.compute.stage import StageCompute
from executor.inputs.workload_name import load_workload


def measure(model: str, stage: int, stages: int = 2, microbatches: int = 4,
            rounds: int = 60) -> dict:
    torch.set_num_threads(1)
    cfg, wl = bench_config(model), load_workload(model)
    first, last = stage == 0, stage == stages - 1
    mod = wl.build_stage(cfg, stage, stages)
    ours = StageCompute(mod, first, last, 1.0 / microbatches, wl.loss_fn)
    ours.split = False  # a fused-B plan
    mbs = [wl.microbatch(cfg, 0, g) for g in range(microbatches)]
    xs = [m[0] for m in mbs] if first else [
        torch.randn(cfg.micro_batch_size, cfg.seq_len, cfg.d_model) for _ in mbs]
    ys = [m[1] for m in mbs]
    grad = torch.randn(cfg.micro_batch_size, cfg.seq_len, cfg.d_model)
    params = list(mod.parameters())

    def run_ours() -> tuple[float, float]:
        t0 = time.perf_counter()
        for g in range(microbatches):
            ours.forward(g, xs[g], ys[g] if last else None)
        t1 = time.perf_counter()
        for g in range(microbatches):
            ours.backward_full(g, None if last else grad)
        t2 = time.perf_counter()
        for p in params:
            p.grad = None
        return t1 - t0, t2 - t1

    def run_plain() -> tuple[float, float]:
        t0, held = time.perf_counter(), []
        for g in range(microbatches):
            x = xs[g] if first else xs[g].detach().requires_grad_(True)
            out = mod(x)
            held.append(wl.loss_fn(out, ys[g]) * (1.0 / microbatches) if last else out)
        t1 = time.perf_counter()
        while held:  # each graph freed right after its backward, as StageCompute (and
            # torch's stage) do: freeing it after the timer would flatter this side
            torch.autograd.backward([held.pop(0)], None if last else [grad])
        t2 = time.perf_counter()
        for p in params:
            p.grad = None
        return t1 - t0, t2 - t1

    for _ in range(5):
        run_ours(), run_plain()
    a, b = [], []
    for r in range(rounds):  # alternate which goes first
        if r % 2:
            a.append(run_ours()), b.append(run_plain())
        else:
            b.append(run_plain()), a.append(run_ours())
    med = lambda xs, i: 1e3 * statistics.median(x[i] for x in xs)  # noqa: E731
    return {"F_ours": med(a, 0), "F_plain": med(b, 0), "B_ours": med(a, 1), "B_plain": med(b, 1)}


def python_us(rounds: int = 2000) -> float:
    """StageCompute.forward's own time around a module that does nothing (us)."""
    class Nothing(torch.nn.Module):
        def forward(self, x):
            return x.float()
    sc = StageCompute(torch.nn.Linear(1, 1), True, False, 0.25)
    sc.split, sc.module = False, Nothing()
    x, ts = torch.zeros(8, 32, dtype=torch.long), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        sc.forward(0, x)
        ts.append(time.perf_counter() - t0)
        sc.reset()
    return 1e6 * statistics.median(ts[rounds // 10:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama:debug")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines = [f"# StageCompute vs plain module calls ({a.model}, S=2, 4 micro-batches)", "",
             f"Command: `python -m benchmarks.stage_compute_ab --model {a.model} --rounds "
             f"{a.rounds}{' --out ' + a.out if a.out else ''}`; 1 thread, load "
             f"{os.getloadavg()[0]:.1f} at start. ms for 4 micro-batches, median of "
             f"{a.rounds} alternating rounds.", "",
             "| stage | F ours | F plain | ratio | B ours | B plain | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in (0, 1):
        r = measure(a.model, s, rounds=a.rounds)
        lines.append(f"| {s} | {r['F_ours']:.3f} | {r['F_plain']:.3f} | "
                     f"{r['F_ours'] / r['F_plain']:.3f} | {r['B_ours']:.3f} | "
                     f"{r['B_plain']:.3f} | {r['B_ours'] / r['B_plain']:.3f} |")
    lines += ["", f"StageCompute.forward around a module that does nothing: {python_us():.1f} us "
              "per call (its own Python)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
