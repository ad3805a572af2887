"""benchmarks/results/chaos.md from `recycle chaos --json` files (the soak's records).

    PYTHONPATH=. .venv/bin/python benchmarks/chaos_results.py LOCAL.json SERVICE.json \
        --command-local "..." --command-service "..." --commit HASH
"""
from __future__ import annotations

import argparse
import json
import os
import platform

from recycle.chaos.report import KIND_NAMES, OUTCOMES, fault_kinds, recovery_stats, summarize

MODES = (("local", "local, all"), ("local-clean", "local, no other fault in flight"),
         ("service", "service, all (outage included)"),
         ("service-up", "service, not overlapping its outage"),
         ("service-clean", "service, no outage and no other fault in flight"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="chaos_results")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--commit", default="?")
    ap.add_argument("--out", default="benchmarks/results/chaos.md")
    ap.add_argument("--title", default="Chaos soak: random kills, rejoins, stalls, donor kills, "
                    "whole stages and nodes lost, nodes added, pauses with workers due back, "
                    "kills of returning workers, the whole job killed and resumed on another "
                    "grid, module-factory models with dropout, service crashes")
    args = ap.parse_args(argv)
    runs = []
    for f in args.files:
        with open(f) as fh:
            runs += json.load(fh)["runs"]
    counts = {k: 0 for k in OUTCOMES}  # every outcome, zeros included
    for r in runs:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    stats = recovery_stats(runs)
    # the kinds these schedules drew, as `recycle chaos` names them (recycle/chaos/report.py)
    having = {name: sum(kind in fault_kinds(r) for r in runs) for kind, name in KIND_NAMES.items()}
    having = {name: n for name, n in having.items() if n}
    el = summarize(runs)["elastic"]
    lines = [f"# {args.title}", "",
             "Commands (at commit " + args.commit + "):", ""]
    lines += [f"    {c}" for c in args.command]
    lines += ["", f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared). Each run "
              "trains a tiny model (the built-in GPT, DropoutGPT or the MLP Workload of examples/) under a seeded schedule with a hard time limit, compares "
              "losses and per-stage parameter checksums with the one-process reference "
              "(1e-5), and checks that no process it started is left.", "",
              "| runs | " + " | ".join(counts) + " | leaked processes | max loss diff |",
              "| --- | " + " | ".join("---" for _ in counts) + " | --- | --- |",
              f"| {len(runs)} | " + " | ".join(str(n) for n in counts.values())
              + f" | {sum(len(r['leaks']) for r in runs)} | "
              f"{max((r['max_diff'] or 0) for r in runs):.1e} |", "",
              f"Runs that kept peer-memory snapshots: {el['runs']}"
              + (" (K as the runs chose it: " + ", ".join(
                  f"K={k} in {n}" for k, n in el["snapshot_every"].items()) + ")"
                 if el.get("snapshot_every") else "")
              + f"; plans moved a worker {el['moves']} times in "
              f"{el['runs_with_moves']} runs, restored a stage lost whole from the "
              f"newest copy of it (peer memory, a checkpoint on disk, or the start) "
              f"{el['snapshot_restores']} times (of which "
              f"{el.get('replays', 0)} replayed the lost stage alone from the boundary logs, "
              f"the rest rolled the job back: {el.get('retrained_iterations', 0)} iterations "
              f"trained again in all), changed the pipeline's shape "
              f"{el.get('shape_changes', 0)} times in {el.get('runs_with_shape_changes', 0)} "
              f"runs (fewer live workers than stages: fewer, deeper stages; with --shape "
              f"speed also a faster shape, and back), and paused "
              f"{el.get('pauses', 0)} times.", "",
              "Runs with each kind of fault: " + "; ".join(f"{name} {n}" for name, n in
                                                            having.items()) + ".", "",
              "Time to recover (s): from a SIGKILL to every survivor training under the next "
              "plan (a single kill; a worker of a stage or node lost together: the plan moves "
              "a worker in and may roll back to a snapshot); from a restart to every member "
              "of the version that admits the new process training in it.", "",
              "| recoveries | kill n | p50 | p99 | max | stage/node loss n | p50 | p99 | max "
              "| rejoin n | p50 | p99 | max |",
              "| --- " * 13 + "|"]
    for mode, label in MODES:
        cell = lambda s: (f"{s['n']} | {s['p50']:.2f} | {s['p99']:.2f} | {s['max']:.2f}"
                          if s["n"] else "0 | - | - | -")
        lines.append(f"| {label} | " + " | ".join(cell(stats[mode][k])
                                                   for k in ("kill", "loss", "rejoin")) + " |")
    failed = [r for r in runs if r["outcome"] != "exact"]
    if failed:  # each with what it said last and the command that repeats it
        lines += ["", "Runs that were not exact:", ""]
        lines += [f"- {r['name']} ({r['outcome']}): {r.get('error') or ''}; "
                  f"`{r.get('command', '?')}`" for r in failed]
    lines += ["", "## Runs", "",
              "| run | grid | faults | outcome | wall s | max loss diff | moves/restores/replays K |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        diff = "-" if r["max_diff"] is None else f"{r['max_diff']:.1e}"
        svc = r.get("service_outage") or {}
        faults = r["faults"] + (f" (service down {svc['killed_at_s']}..{svc['restarted_at_s']} s)"
                                if svc.get("killed_at_s") is not None else "")
        lines.append(f"| {r['name']} | {r['grid']} m{r['microbatches']} n{r['iterations']} | "
                     f"{faults} | {r['outcome']} | {r['wall_s']:.1f} | {diff} | "
                     f"{(r.get('elastic') or {}).get('moves', '-')}/"
                     f"{(r.get('elastic') or {}).get('snapshot_restores', '-')}/"
                     f"{(r.get('elastic') or {}).get('replays', '-')}"
                     + (f" K{k}" if (k := (r.get('elastic') or {}).get('snapshot_every'))
                        is not None else "") + " |")
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines[:30]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
