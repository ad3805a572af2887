"""What keyed randomness costs a forward (executor/compute/draws.py, units.py): a stage's
forward inside its StageUnits pass, keyed (every layer re-seeds the CPU generator; the
stage's generators saved before and restored after) and not keyed, against the plain
module call, in one process, alternating, medians over rounds. Also torch.random.fork_rng
plus torch.manual_seed per layer, the simple form the runtime does not use.

    python -m benchmarks.keyed_draws [--rounds 40] [--out benchmarks/results/keyed_draws.md]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from examples import dropout_lm
from executor.compute.config import ModelConfig
from executor.compute.units import StageUnits
from executor.inputs.workload_name import load_workload

SHAPES = {"small": ModelConfig(vocab=64, seq_len=16, d_model=32, n_heads=2, n_layers=4,
                               micro_batch_size=4),
          "d128": ModelConfig(vocab=256, seq_len=64, d_model=128, n_heads=4, n_layers=4,
                              micro_batch_size=4)}


def _forked(module, x, layers: int):
    """The simple form: fork_rng around the stage, torch.manual_seed per layer."""
    with torch.random.fork_rng(devices=[]):
        for k in range(layers):
            torch.manual_seed(k)
        return module(x)


def measure(cfg: ModelConfig, rounds: int, per_round: int = 20) -> dict:
    torch.set_num_threads(1)
    wl = load_workload(dropout_lm.name(cfg.n_layers))
    mod = wl.build_stage(cfg, 1, 2)  # blocks 2, 3, the norm and the head: 3 layers
    x = torch.randn(cfg.micro_batch_size, cfg.seq_len, cfg.d_model)
    keyed = StageUnits(mod, 1, 0, torch.device("cpu"))
    plain = StageUnits(mod, 1, 0, torch.device("cpu"))
    plain.draws.keyed = plain.draws.probing = False  # inexact: only to time the difference
    layers = 3

    def run(kind: str) -> float:
        t0 = time.perf_counter()
        for g in range(per_round):
            if kind == "module call":
                mod(x)
            elif kind == "fork_rng + manual_seed":
                _forked(mod, x, layers)
            else:
                with (keyed if kind == "keyed" else plain).forward(0, g):
                    mod(x)
        return (time.perf_counter() - t0) / per_round * 1e6

    kinds = ["module call", "pass, not keyed", "keyed", "fork_rng + manual_seed"]
    times = {k: [] for k in kinds}
    for k in kinds:
        run(k)  # warm-up
    for _ in range(rounds):
        for k in kinds:
            times[k].append(run(k))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = ["| shape | forward (module call), us | pass not keyed | keyed | "
            "keyed - module call | fork_rng + torch.manual_seed per layer |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, cfg in SHAPES.items():
        m = measure(cfg, a.rounds)
        base = m["module call"]
        rows.append(f"| {name} (d {cfg.d_model}, T {cfg.seq_len}, b {cfg.micro_batch_size}) | "
                    f"{base:.0f} | {m['pass, not keyed']:.0f} | {m['keyed']:.0f} | "
                    f"{m['keyed'] - base:+.1f} us ({(m['keyed'] / base - 1) * 100:+.1f}%) | "
                    f"{m['fork_rng + manual_seed']:.0f} |")
    text = "\n".join(rows)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write("# Keyed randomness: cost per forward\n\n`python -m benchmarks.keyed_draws"
                     f" --rounds {a.rounds}`: a middle stage of examples/dropout_lm.py's "
                     "DropoutGPT (2 blocks with dropout, the norm and the head: 3 layers "
                     "seeded per forward), one CPU thread, medians of interleaved rounds of "
                     "20 forwards (with autograd recording).\n\n" + text + "\n")


if __name__ == "__main__":
    main()
