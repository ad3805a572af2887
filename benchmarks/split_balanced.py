"""`--split balanced` against the default split by layer count, side by side in one run.

For one model and grid: profile every layer alone (executor/compute/measure/profile.py
profile_layers), profile the stages of both splits, plan both (planned period from the
measured stage costs), then train both on real worker processes, interleaved over
--rounds rounds, and keep each split's best steady-state time per iteration (ms, from
the end of iteration --warmup to the end of the last). Also checks that both splits train
the same model: equal losses (the split changes which process holds a block, not the
arithmetic).

Default model: the Llama family by import path at a width where the output head costs
about five blocks (vocab 8192, d 128), as the head of a real small model does
(llama:125m: five blocks at 8 tokens), on D=1 x S=2, so each worker has a core of this
2-core machine.

    PYTHONPATH=. .venv/bin/python benchmarks/split_balanced.py --rounds 3
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import torch
from rich.console import Console

from executor.compute.model import ModelConfig, layer_range
from executor.compute.measure.profile import profile, profile_layers
from executor.inputs.workload_name import check_workload
from executor.launch.launcher import train
from executor.inputs.launch_spec import LaunchSpec, sections
from executor.models.balance import balanced_boundaries, stage_costs
from executor.models.families import architecture
from planner.solvers.backends import solve


def steady_ms(ends: dict, iters: int, warmup: int) -> float:
    return 1e3 * (ends[iters - 1] - ends[warmup]) / (iters - 1 - warmup)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="executor.models.llama:workload")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("-d", "--replicas", type=int, default=1)
    ap.add_argument("-s", "--stages", type=int, default=2)
    ap.add_argument("-m", "--microbatches", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/split_balanced.md")
    a = ap.parse_args(argv)
    D, S, M = a.replicas, a.stages, a.microbatches
    arch = architecture(a.model, d_model=a.d_model, n_layers=a.layers, n_heads=a.heads,
                        seq_len=a.seq_len, vocab=a.vocab)
    cfg = ModelConfig(micro_batch_size=a.micro_batch_size, **arch)
    wl = check_workload(a.model, cfg, S)
    t0 = time.monotonic()
    costs = profile_layers(cfg, repeats=a.repeats, workload=wl)
    L = cfg.n_layers
    even = tuple(layer_range(L, s, S)[0] for s in range(1, S))
    splits = {"layers": even, "balanced": balanced_boundaries(costs, S)}
    rows = {}
    for name, bounds in splits.items():
        c = dataclasses.replace(cfg, boundaries=bounds if name == "balanced" else ())
        spec = profile(c, S, D, M, repeats=a.repeats, workload=wl)
        plan = solve(spec, [], solver="greedy")
        edges = (0, *bounds, L)
        rows[name] = dict(cfg=c, spec=spec, bounds=bounds,
                          blocks=[hi - lo for lo, hi in zip(edges, edges[1:])],
                          summed=[round(x / 1e3, 2) for x in stage_costs(costs, bounds)],
                          measured=[round((f + i + w) / 1e3, 2) for f, i, w in
                                    zip(spec.cost.F, spec.cost.I, spec.cost.W)],
                          planned_ms=plan.metrics.period / 1e3, realised=[], losses=None)
    quiet = Console(stderr=True, quiet=True)
    for r in range(a.rounds):
        for name, row in rows.items():
            res = train(LaunchSpec(row["cfg"], row["spec"], a.iterations, model=a.model,
                                   **sections(checkpoint_every=10 ** 9, timeout=30.0)),
                  console=quiet)
            if res.summary is None:
                print(f"{name} round {r}: {res.halted or 'did not complete'}", file=sys.stderr)
                return 1
            row["realised"].append(steady_ms(res.iteration_end, a.iterations, a.warmup))
            row["losses"] = res.summary.losses
            print(f"round {r} {name}: {row['realised'][-1]:.1f} ms/iteration", file=sys.stderr)
    same = all(abs(x - y) <= 1e-5 * max(1, abs(x)) for x, y in
               zip(rows["layers"]["losses"], rows["balanced"]["losses"]))
    base = min(rows["layers"]["realised"])
    lines = [
        "# `--split balanced` vs the split by layer count",
        "",
        "Command: `PYTHONPATH=. .venv/bin/python benchmarks/split_balanced.py "
        + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
        "",
        f"{os.cpu_count()} cores; torch {torch.__version__}; model `{a.model}` vocab {cfg.vocab}, "
        f"d {cfg.d_model}, {L} layers, {cfg.n_heads} heads, seq {cfg.seq_len}, micro-batch "
        f"{cfg.micro_batch_size}; grid D={D} S={S} M={M}; {a.iterations} iterations "
        f"(steady state after {a.warmup}), best of {a.rounds} interleaved rounds; "
        f"load average {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - t0:.0f} s in all.",
        "",
        f"Per-layer F+I+W (ms, one micro-batch, median of {a.repeats}) [embedding, blocks, head]: "
        f"{[round(c / 1e3, 2) for c in costs]}",
        "",
        "| split | boundaries | blocks per stage | stage F+I+W summed from layers (ms) "
        "| stage F+I+W measured (ms) | planned period (ms) | realised ms/iteration (best; all) "
        "| realised vs layers |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for name, row in rows.items():
        best = min(row["realised"])
        lines.append(f"| {name} | {list(row['bounds'])} | {row['blocks']} | {row['summed']} | "
                     f"{row['measured']} | {row['planned_ms']:.1f} | {best:.1f} "
                     f"({', '.join(f'{x:.0f}' for x in row['realised'])}) | {best / base:.2f} |")
    planned = rows["balanced"]["planned_ms"] / rows["layers"]["planned_ms"]
    lines += ["", f"Planned balanced/layers: {planned:.2f}; realised: "
              f"{min(rows['balanced']['realised']) / base:.2f}. Both splits trained the same "
              f"losses: {'yes' if same else 'NO'} ({rows['balanced']['losses'][-1]:.5f} at the end)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
