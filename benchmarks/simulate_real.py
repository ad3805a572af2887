"""ReCycle against Oobleck and Bamboo on the real EC2 spot traces (benchmarks/traces/), and
every policy against the limit.

The traces come from the Bamboo artifact (uclasystem/bamboo, traces/, MIT; the same files
are in Oobleck's sosp23-artifact branch, tools/simulator/traces/, MIT): P3 (344 events
over 11.4 h, 32 nodes at peak) and g4dn (153 events, 24 nodes). gpt3-2.7b, M=16, grids
sized to the traces' peaks: 1 GPU a node (4x8, 3x8, 6x4) and 4 GPUs a node (16x8, 12x8),
and the later P3 window: the trace from 5 h on, the nodes up at 5 h added at its start
(executor/launch/faults/trace_replay.window, as `recycle train --trace-start 5h` replays it).

Rows per trace and grid: `recycle` (the shape follows the live workers), `recycle-short`
(the rule the runtime carries out: the shape changes only where fewer live workers than
stages are left, and at every event once changed), `recycle-roles`
(roles on the job's own partition), `recycle-fixed` (the paper's fixed roles), Oobleck,
Bamboo as stated (its own placement: a stage and its shadow on different nodes;
`--bamboo-hidden` of its redundant forward hidden in bubbles), `limit` (a bound no layout
of the live workers beats, no event costs: docs/simulator.md) and, as a what-if beside
it, `shape-limit` (the best one-depth shape the planner schedules, no event costs); the
sensitivity of Bamboo (placement as the trace packs nodes, hidden 0 and 1, re-formed
pipelines) and checkpoint-restart with and without the shrink option; each policy's
share of the limit, and where `recycle`'s remainder to the limit goes.
Writes benchmarks/results/simulate_real.md (simulate.md links it).

    PYTHONPATH=. python benchmarks/simulate_real.py [--bamboo-hidden 0.5]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from executor.launch.faults.trace_replay import window  # noqa: E402 (pure: no torch)
from planner.simulation import report  # noqa: E402
from planner.simulation.compare import simulate  # noqa: E402
from planner.simulation.policies import Params  # noqa: E402
from planner.simulation.presets import PRESETS, UNIT_S, preset_job, preset_model  # noqa: E402
from planner.simulation.trace import Placement, read_spot, read_trace, spot_trace  # noqa: E402

TRACES = "benchmarks/traces"
# (trace, file, D, GPUs a node, S, start hour of the window: 0 = the whole trace)
ROWS = [("P3", "p3-trace.csv", 4, 1, 8, 0), ("P3", "p3-trace.csv", 16, 4, 8, 0),
        ("g4dn", "g4dn-trace.csv", 3, 1, 8, 0), ("g4dn", "g4dn-trace.csv", 12, 4, 8, 0),
        ("g4dn", "g4dn-trace.csv", 6, 1, 4, 0),  # the same nodes as 4 stages
        ("P3", "p3-trace.csv", 4, 1, 8, 5), ("P3", "p3-trace.csv", 16, 4, 8, 5)]
MAIN = ["recycle", "recycle-short", "recycle-roles", "recycle-fixed", "oobleck", "bamboo",
        "limit", "shape-limit"]
PARTS = ["detection", "iteration in flight", "state moves", "replay",
         "since the snapshot (rollback)", "since the checkpoint (restore)", "restart", "paused",
         report.SHAPE_GAP, report.SCHEDULE_GAP]


def live_hours(trace, slots: int, duration: float) -> dict[int, float]:
    """Hours spent with each number of live workers."""
    failed, t0, out = set(trace.initial_failed), 0.0, {}
    for e in trace.events:
        n = slots - len(failed)
        out[n] = out.get(n, 0.0) + (e.time - t0) / 3600
        t0 = e.time
        (failed.update if e.kind == "fail" else failed.difference_update)(e.workers)
    n = slots - len(failed)
    out[n] = out.get(n, 0.0) + (duration - t0) / 3600
    return out


def load(fname: str, D: int, S: int, G: int, start_h: float):
    path = os.path.join(TRACES, fname)
    where = Placement(D, S, G, "stages")
    if not start_h:
        return read_trace(path, where)
    return spot_trace(window(read_spot(path), start_h * 3600, 1e6), where, source=path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt3-2.7b")
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--bamboo-hidden", type=float, default=0.5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rows", default="", help="comma-separated row numbers (default: all)")
    ap.add_argument("--out", default="benchmarks/results/simulate_real.md")
    args = ap.parse_args()
    M, sh = args.microbatches, PRESETS[args.preset]
    pick = [int(x) for x in args.rows.split(",") if x] or range(len(ROWS))
    md, short, parts_rows = [], [], []
    summary = ["| trace, grid | recycle (--shape speed) | recycle-short (default: --shape auto) "
               "| recycle-roles | recycle-fixed | oobleck "
               "| bamboo | limit | recycle / limit | recycle-short / limit "
               "| oobleck / limit | what-if: shape-limit | recycle / shape-limit "
               "| recycle / oobleck | recycle-short / oobleck "
               "| the same, each against its own best grid "
               "| recycle / best other (all variants) "
               "| best shape, all live: stages, / user's grid | shape changes | hours by stages "
               "| cpu (s) |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
               "| ---: | ---: | ---: | ---: "
               "| ---: | ---: | ---: | --- | ---: |"]
    for i in pick:
        name, fname, D, G, S, start_h = ROWS[i]
        model = preset_model(args.preset, D)
        job = preset_job(model, D, S, M, sh.seq, sh.d_model, 1)
        tr = load(fname, D, S, G, start_h)
        duration = tr.end
        base = Params(oobleck_reconfig_s=sh.reconfig_s, bamboo_rc_hidden=args.bamboo_hidden)
        c0 = _cpu()
        res = simulate(job, tr, duration, UNIT_S, base, MAIN, model=model, jobs=args.jobs)
        cpu = _cpu() - c0
        kept = {o.policy: o.microbatches / res.ideal for o in res.outcomes}
        rec = res.outcome("recycle")
        # sensitivity: Bamboo's placement and hidden share; checkpoint-restart with shrink
        extra = []
        for label, params, pol in (
                (f"bamboo, trace's placement, hidden {args.bamboo_hidden:g}",
                 replace(base, bamboo_own_placement=False), "bamboo"),
                ("bamboo, own placement, hidden 0", replace(base, bamboo_rc_hidden=0.0), "bamboo"),
                ("bamboo, own placement, hidden 1", replace(base, bamboo_rc_hidden=1.0), "bamboo"),
                (f"bamboo-reform (re-forms pipelines from the live nodes), hidden {args.bamboo_hidden:g}",
                 base, "bamboo-reform"),
                ("bamboo-reform, hidden 1", replace(base, bamboo_rc_hidden=1.0), "bamboo-reform"),
                ("checkpoint-restart, no spares", base, "checkpoint-restart"),
                ("checkpoint-restart --checkpoint-shrink", replace(base, checkpoint_shrink=True),
                 "checkpoint-restart")):
            if pol == "bamboo" and G == 1 and "placement" in label and "trace" in label:
                continue  # one GPU a node: both placements are the same
            r = simulate(job, tr, duration, UNIT_S, params, [pol], model=model)
            o = r.outcomes[0]
            extra.append((label, o.microbatches / r.ideal, o.microbatches))
        others = [(o.policy, o.microbatches) for o in res.outcomes
                  if o.policy not in ("recycle", "limit", "shape-limit")] + [(lb, mb) for lb, _, mb in extra]
        best_other = max(others, key=lambda x: x[1])
        lim = res.outcome("limit").microbatches
        shape_lim = res.outcome("shape-limit").microbatches
        hours = live_hours(tr, D * S, duration)
        below = sum(h for n, h in hours.items() if n < S)
        total_h = sum(hours.values())
        mean_live = sum(n * h for n, h in hours.items()) / total_h
        st = res.stats["recycle"]
        oob_own = res.outcome("oobleck").microbatches / res.stats["oobleck"]["full_factor"]
        window_note = f", from {start_h:g} h" if start_h else ""
        grid = f"{name}{window_note}, {D}x{S}, {G} GPU{'s' if G > 1 else ''} a node"
        by_stages = ", ".join(f"{k}: {h:.1f}" for k, h in sorted(st["stages_hours"].items(),
                                                                 reverse=True) if h >= 0.05)
        summary.append(
            f"| {grid} | {kept['recycle']:.1%} | {kept['recycle-short']:.1%} | "
            f"{kept['recycle-roles']:.1%} | "
            f"{kept['recycle-fixed']:.1%} | {kept['oobleck']:.1%} | {kept['bamboo']:.1%} | "
            f"{kept['limit']:.1%} | **{rec.microbatches / lim:.3f}** | "
            f"**{res.outcome('recycle-short').microbatches / lim:.3f}** | "
            f"{res.outcome('oobleck').microbatches / lim:.3f} | {kept['shape-limit']:.1%} | "
            f"{rec.microbatches / shape_lim:.3f} | "
            f"**{_x(rec.microbatches, res.outcome('oobleck').microbatches)}** | "
            f"**{_x(res.outcome('recycle-short').microbatches, res.outcome('oobleck').microbatches)}** | "
            f"{_x(rec.microbatches / st['full_factor'], oob_own)} | "
            f"{_x(rec.microbatches, best_other[1])} ({best_other[0]}) | "
            f"{st['best_full_stages']}, {st['full_factor']:.3f}x | {st['shape_changes']} | "
            f"{by_stages} | {cpu:.1f} |")
        parts = report.remainder(res)
        gap = lim - rec.microbatches
        assert abs(sum(parts.values()) - gap) <= 1e-6 * max(1.0, lim), (parts, gap)
        known = [p for p in PARTS if p in parts] + sorted(set(parts) - set(PARTS))
        parts_rows.append((grid, lim, rec.microbatches, parts, known))
        for pol, mb in others:
            if mb >= rec.microbatches:
                short.append(f"- {grid}: {pol} keeps {mb / res.ideal:.1%}, recycle "
                             f"{kept['recycle']:.1%}.")
        md.append(f"\n### {grid}: {tr.failures} failures, {mean_live:.1f} of {D * S} workers "
                  f"live on average, {below:.2f} h with fewer than {S}\n")
        md.append(report.markdown(res))
        md.append(f"\nrecycle: {st['moves']} workers loaded state, {st['shape_changes']} shape "
                  f"changes, {st['snapshot_restores']} snapshot restores, {rec.restarts} "
                  f"checkpoint restores; hours on each stage count: {by_stages}.\n")
        md.append("Sensitivity (same trace, same grid):\n")
        md.append("| variant | throughput kept | recycle / variant | share of the limit |")
        md.append("| --- | ---: | ---: | ---: |")
        for label, k, mb in extra:
            md.append(f"| {label} | {k:.1%} | {_x(rec.microbatches, mb)} | {mb / lim:.1%} |")
        print(summary[-1], flush=True)
    cmd = "PYTHONPATH=. python benchmarks/simulate_real.py" + (
        "" if len(sys.argv) == 1 else " " + " ".join(sys.argv[1:]))
    head = [
        "# Real spot traces: ReCycle against Oobleck, Bamboo and the limit",
        "",
        f"Made by `{cmd}` ({platform.python_version()}, {time.strftime('%Y-%m-%d', time.gmtime())}),"
        f" {args.preset}, M={M}, defaults of `recycle simulate` otherwise (detection 5 s,"
        f" checkpoint every 30 min, restart 5 min, Oobleck reconfiguration {sh.reconfig_s:g} s,"
        f" peer-memory snapshot every 5 iterations, state moves at 25 GB/s). Bamboo as stated:"
        f" its own placement (a node holds one stage of G pipelines, so a stage and the shadow"
        f" of its successor never share a node) and {args.bamboo_hidden:g} of its redundant"
        f" forward hidden in bubbles; the sensitivity tables show the other choices."
        " Traces: benchmarks/traces/ (README there: source and licence). Cost models:"
        " docs/simulator.md.",
        "",
        "What the product runs: `recycle` is `recycle train --shape speed` (a service job"
        " registered with `?shape=speed`): at every failure and return the shape, pipelines"
        " and roles worth most over the horizon, chosen by the same chooser"
        " (tests/test_one_chooser.py), from the user's grid at the start. `recycle-short` is"
        " what the default, `--shape auto`, runs: the same chooser only once fewer workers"
        " than stages live (and at every event after the first cut). Both columns are"
        " headline figures of the product, one per flag; docs/simulator.md says why `speed`"
        " is not the default yet.",
        "",
        "Throughput kept: samples trained over what the user's D x S grid trains with no"
        " failure (its failure-free plan), one currency for every policy. Policies that re-cut"
        " the model (recycle's shapes, Oobleck's templates, the limits) may keep more than"
        " 100%: with every worker live the best shape trains faster than the user's 8-stage"
        " grid (the column \"best shape, all live\"). The limit is a bound, not a policy:"
        " at every instant the rate no layout of the live workers beats (any cut, pipelines"
        " of any depths, any number of replicas: the work and optimizer steps its workers"
        " must run, with no pipeline bubble, no p2p latency, fractional workers;"
        " planner/simulation/throughput_bound.py), and no cost for any event. Beside it, a"
        " what-if: `shape-limit`, the best rate the planner's own schedules reach on one-depth"
        " shapes of the live workers, again with no event cost (what the limit was before it"
        " was a bound; pipelines of unequal depth can beat it)."
        " \"The same, each against its own best grid\": recycle / oobleck with each"
        " policy's samples over what its own best configuration of all D*S workers trains"
        " (the currency this table used before shapes, for Oobleck alone).",
        "",
    ]
    parts_md = ["", "Where recycle's remainder to the limit goes, as shares of the limit's"
                " samples (report.remainder: what the limit trains while recycle stalls, per"
                " cause; what recycle trains and loses; and while both train, the difference"
                " of their rates, in two parts: what the best one-depth shape the planner"
                " schedules trains beyond recycle, and what the bound trains beyond that shape,"
                " the bubbles, p2p and whole workers the bound leaves out). The parts add up"
                " to 1 - recycle / limit.", "",
                "| trace, grid | 1 - recycle / limit | " + " | ".join(PARTS) + " |",
                "| --- | ---: | " + " | ".join("---:" for _ in PARTS) + " |"]
    for grid, lim, rmb, parts, known in parts_rows:
        cells = [f"{parts.get(p, 0.0) / lim:.2%}" for p in PARTS]
        rest = [p for p in known if p not in PARTS]
        parts_md.append(f"| {grid} | {1 - rmb / lim:.2%} | " + " | ".join(cells) + " |"
                        + (f" (also: {', '.join(f'{p} {parts[p] / lim:.2%}' for p in rest)})"
                           if rest else ""))
    if short:
        short = ["", "Where another policy keeps at least as much as `recycle`:", ""] + short
    else:
        short = ["", "`recycle` keeps more than every other policy and variant on every row."]
    with open(args.out, "w") as fh:
        fh.write("\n".join(head + summary + short + parts_md + md) + "\n")
    print(f"wrote {args.out}")


def _x(a: float, b: float) -> str:
    return "- (it kept nothing)" if b <= 0 else f"{a / b:.3f}x"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


if __name__ == "__main__":
    main()
