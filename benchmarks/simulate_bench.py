"""ReCycle against its peers on the failure traces the field uses, for GPT-3 presets.

For each preset on a 16 x 8 grid (M=16 micro-batches of one 2,048-token sequence per
replica), 12 hours of:
  - Oobleck's synthetic intervals: one node failure every 6 h, 3 h, 1 h, 30 min, 10 min
    (one GPU a node, back after 1 h);
  - a spot trace in the Bamboo / Oobleck format (`t_ms,add|remove,nodeN`), bursty
    preemptions of 4-GPU nodes (each holds 4 stages of a replica), written to
    benchmarks/results/simulate_spot_trace.csv and read back as a user's file would be.
Writes benchmarks/results/simulate.md (the tables, the command), simulate.json,
simulate_ratios.png (ReCycle's throughput over each policy's), and per preset a
throughput-over-time plot on the spot trace (PNG and HTML). Each simulation's wall time is
in the table: a 12-hour trace on the 16 x 8 grid must take under 10 s.

    PYTHONPATH=. python benchmarks/simulate_bench.py [--presets gpt3-medium,gpt3-6.7b]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.simulation import report  # noqa: E402
from planner.simulation.compare import simulate  # noqa: E402
from planner.simulation.policies import POLICIES, Params  # noqa: E402
from planner.simulation.presets import PRESETS, UNIT_S, preset_job, preset_model  # noqa: E402
from planner.simulation.trace import (Placement, fixed_interval_trace, read_trace,  # noqa: E402
                                      spot_like_trace, write_spot)

OUT = "benchmarks/results"
HOURS = 12.0
INTERVALS = [("6h", 6 * 3600), ("3h", 3 * 3600), ("1h", 3600), ("30m", 1800), ("10m", 600)]
PAPER = {"oobleck": 1.46, "bamboo": 1.64}
BAMBOO_HIDDEN = 0.5  # share of Bamboo's redundant forward hidden in bubbles (stated)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="gpt3-medium,gpt3-2.7b,gpt3-6.7b")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes planning failed sets ahead (recycle simulate --jobs); "
                    "1 (default): the cpu column is then one core's time")
    args = ap.parse_args()
    D, S, M = args.replicas, args.stages, args.microbatches
    duration = HOURS * 3600
    os.makedirs(args.out, exist_ok=True)
    spot_path = os.path.join(args.out, "simulate_spot_trace.csv")
    spot_place = Placement(D, S, 4, "stages")
    write_spot(spot_path, spot_like_trace(spot_place, duration, seed=1).node_events)
    node_place = Placement(D, S, 1, "stages")
    traces = [(f"every {name}", fixed_interval_trace(node_place, duration, every, 3600, seed=1))
              for name, every in INTERVALS]
    traces.append(("spot (4-GPU nodes)", read_trace(spot_path, spot_place)))

    results, md = {}, []
    others = [p for p in POLICIES if p != "recycle"]
    for preset in args.presets.split(","):
        sh = PRESETS[preset]
        model = preset_model(preset, D)
        job = preset_job(model, D, S, M, sh.seq, sh.d_model, 1)
        params = Params(oobleck_reconfig_s=sh.reconfig_s, bamboo_rc_hidden=BAMBOO_HIDDEN)
        rows = []
        md.append(f"\n### {preset}: {D} x {S} grid, M={M}, failure-free "
                  f"{job.num_microbatches / 1:.0f} sequences an iteration\n")
        md.append("| trace | failures | ReCycle kept | " + " | ".join(others)
                  + " | sets planned | cpu (s) | wall (s) |")
        md.append("| --- | ---: | ---: | " + " | ".join("---:" for _ in others)
                  + " | ---: | ---: | ---: |")
        for name, tr in traces:
            t0, c0 = time.perf_counter(), _cpu()
            res = simulate(job, tr, duration, UNIT_S, params, model=model, jobs=args.jobs)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            rs = {r["policy"]: r for r in report.rows(res)}
            rows.append({"trace": name, "failures": tr.failures, "wall_s": round(wall, 2),
                         "cpu_s": round(cpu, 2), "sets_planned": res.plans_made,
                         "policies": rs})
            cells = []
            for p in others:
                ratio = rs[p]["recycle_ratio"]
                cells.append("-" if ratio is None else f"{ratio:.2f}x ({rs[p]['kept']:.0%})")
            md.append(f"| {name} | {tr.failures} | {rs['recycle']['kept']:.1%} | "
                      + " | ".join(cells) + f" | {res.plans_made} | {cpu:.1f} | {wall:.1f} |")
            if name.startswith("spot"):
                stem = os.path.join(args.out, f"simulate_{preset}_spot")
                report.write_png(res, stem + ".png")
                report.write_html(res, stem + ".html")
            print(f"{preset:12s} {name:20s} {tr.failures:3d} failures  {cpu:5.1f} s cpu "
                  f"{wall:5.1f} s wall  "
                  + "  ".join(f"{p}={rs[p]['recycle_ratio'] or 0:.2f}" for p in others),
                  flush=True)
        results[preset] = rows

    _ratio_figure(results, others, os.path.join(args.out, "simulate_ratios.png"))
    cmd = "PYTHONPATH=. python benchmarks/simulate_bench.py" + (
        "" if len(sys.argv) == 1 else " " + " ".join(sys.argv[1:]))
    head = [
        "# Failure-trace simulator: ReCycle against its peers",
        "",
        "On the real EC2 spot traces (P3, g4dn of the Bamboo / Oobleck artifacts), at 1 and 4"
        " GPUs a node: [simulate_real.md](simulate_real.md) (`benchmarks/simulate_real.py`)."
        " Below: synthetic traces.",
        "",
        f"Made by `{cmd}` ({platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}). Cost models: docs/simulator.md.",
        "",
        "Each cell is ReCycle's throughput over the policy's (samples kept over the same 12 h;"
        " > 1: ReCycle trains more), with the policy's share of the failure-free rate in",
        "brackets. '-': the policy kept nothing. Defaults of `recycle simulate`: detection 5 s,"
        " checkpoint every 30 min (free), restart 5 min, no spares, repair after 1 h, Oobleck"
        " reconfiguration 2 / 5 / 10 s by size, boundary logging 1% (swift-replay's and"
        " ReCycle's, as measured: swift.md), half of Bamboo's redundant"
        " forward hidden in bubbles, Bamboo placed on its own (a stage and its shadow on"
        " different nodes). `ReCycle` is the `recycle` policy, what `recycle train --shape"
        " speed` runs (roles and shapes: workers move between stages, the partition follows"
        " the live workers at every event, a stage lost whole is replayed); the default,"
        " `--shape auto`, runs `recycle-short` (the shape chosen only once fewer workers than"
        " stages live), in its column; `recycle-roles` keeps the job's partition; `recycle-fixed` is the"
        " paper's fixed roles. cpu / wall: the simulation of all 10 policies on that trace (cpu: CPU"
        " seconds, what it takes on an idle core; wall was measured on a shared 2-core"
        " machine); sets planned: distinct canonical failed sets, each planned once.",
        "",
        "![ratios](simulate_ratios.png)",
        "",
        "Throughput over time on the spot trace: "
        + ", ".join(f"[{p}](simulate_{p}_spot.png)" for p in results) + ".",
    ]
    with open(os.path.join(args.out, "simulate.md"), "w") as fh:
        fh.write("\n".join(head + md) + "\n")
    with open(os.path.join(args.out, "simulate.json"), "w") as fh:
        json.dump({"command": cmd, "results": results}, fh, indent=1)
    print(f"wrote {args.out}/simulate.md")


def _cpu() -> float:
    """CPU seconds of this process and its finished children: on a shared machine the
    wall time also counts other people's work."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _ratio_figure(results, others, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), dpi=100,
                             sharey=True, squeeze=False)
    for ax, (preset, rows) in zip(axes[0], results.items()):
        xs = [r["trace"].replace("every ", "").replace(" (4-GPU nodes)", "") for r in rows]
        for k, p in enumerate(others):
            ys = [r["policies"][p]["recycle_ratio"] for r in rows]
            ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o",
                    label=p, color=report.COLORS[(k + 1) % len(report.COLORS)])
        for p, v in PAPER.items():
            ax.axhline(v, ls=":", color="gray")
            ax.text(len(xs) - 1, v, f" paper vs {p}", fontsize=7, va="bottom", ha="right")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(preset, fontsize=10)
        ax.set_xlabel("trace (failure interval)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("ReCycle throughput / policy's")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
