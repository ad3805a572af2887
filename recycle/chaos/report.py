"""What `recycle chaos` prints and saves: a table of runs, outcome counts, recovery times
(after a single kill, after a whole stage or node lost together, after a rejoin) and the
moves and snapshot restores the runs' plans made."""
from __future__ import annotations

import math
from typing import Optional

from rich.table import Table

OUTCOMES = ("exact", "inexact", "hang", "crash", "halt", "leak")
STYLE = {"exact": "green", "inexact": "red", "hang": "magenta", "crash": "red",
         "halt": "yellow", "leak": "red bold"}


def percentile(values: list[float], q: float) -> Optional[float]:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def during_outage(record: dict, entry: dict) -> bool:
    """Did this recovery overlap the service's outage? Nothing can be re-planned while the
    service is down, so those recoveries measure the outage, not the runtime."""
    svc = record.get("service_outage") or {}
    down = svc.get("killed_epoch")
    if down is None or "at" not in entry:
        return False
    up = svc.get("restarted_epoch") or float("inf")
    start, end = entry["at"], entry["at"] + float(entry["seconds"])
    return start <= up and end >= down


RECOVERY_KINDS = ("kill", "loss", "rejoin")  # loss: a worker of a stage or node lost together
KIND_WORDS = {"kill": "kill", "loss": "stage/node loss", "rejoin": "rejoin"}


def recovery_kind(record: dict, entry: dict) -> str:
    """The entry's kind, with the kills the schedule drew as part of a whole stage or node
    lost together told apart ("loss": the plans move workers and may restore snapshots)."""
    kind = entry.get("kind", "?")
    if kind == "kill":
        group = {(tuple(f["worker"]), f["iteration"])
                 for f in (record.get("schedule") or {}).get("faults", [])
                 if f["kind"] == "kill" and f.get("why") in ("stage", "node")}
        if (tuple(entry.get("worker", ())), entry.get("iteration")) in group:
            return "loss"
    return kind


def recovery_stats(records: list[dict]) -> dict:
    """p50/p99/max of recovery seconds per kind (RECOVERY_KINDS), over all runs and per
    mode; with a service also "service-up": recoveries that did not overlap its outage."""
    out = {}
    for mode, keep in (("all", lambda r, x: True), ("local", lambda r, x: not r["service"]),
                       ("service", lambda r, x: r["service"]),
                       ("service-up", lambda r, x: r["service"] and not during_outage(r, x)),
                       # no other fault in flight (a stalled survivor, a second kill) and no
                       # outage: what the runtime itself takes to recover
                       ("local-clean", lambda r, x: not r["service"] and not x.get("concurrent")),
                       ("service-clean", lambda r, x: r["service"] and not during_outage(r, x)
                        and not x.get("concurrent"))):
        for kind in RECOVERY_KINDS:
            secs = [float(x["seconds"]) for r in records for x in r.get("recovery") or []
                    if recovery_kind(r, x) == kind and keep(r, x)]
            out.setdefault(mode, {})[kind] = {
                "n": len(secs), "p50": _r(percentile(secs, 0.5)),
                "p99": _r(percentile(secs, 0.99)), "max": _r(max(secs) if secs else None)}
    return out


# Every kind of fault a schedule may draw, in the words of the "Runs with each kind of
# fault" line (schedule.py's module docstring says what each is).
KIND_NAMES = {
    "random": "a random kill", "stage": "a whole home stage lost", "node": "a whole node lost",
    "node add": "a node added back",
    "donor": "a donor killed (a peer of a rejoining worker's home stage)",
    "stall": "a worker stalled", "shape": "fewer live workers than stages (a shape change)",
    "pause": "fewer live workers than any shape runs on, rejoins due (a pause)",
    "rejoined kill": "a worker killed again in the iteration it came back or the next",
    "resume": "the whole job SIGKILLed and resumed from its checkpoints",
    "resume grid": "...resumed on another grid of the same global batch",
    "dropout": "a module-factory model with dropout (DropoutGPT)",
    "mlp": "a module-factory Workload (examples/mlp_workload.py)",
    "service": "the service killed and restarted"}


def fault_kinds(record: dict) -> set[str]:
    """The kinds of fault (KIND_NAMES) a record's schedule drew."""
    sched = record.get("schedule") or {}
    faults = list(sched.get("faults", [])) + list((sched.get("resume") or {}).get("faults", []))
    out = {f.get("why") for f in faults if f["kind"] == "kill"} & set(KIND_NAMES)
    out |= {"stall"} if any(f["kind"] == "stall" for f in faults) else set()
    out |= {"service"} if sched.get("outage") else set()
    return out | (set(record.get("kinds") or []) & set(KIND_NAMES))


def keeps_snapshots(record: dict) -> bool:
    """The run kept peer-memory snapshots: its schedule left the default flags
    (snapshot_every None) or gave a K; 0, in older records, had them off."""
    k = record["schedule"].get("snapshot_every") if "schedule" in record else 0
    return k is None or k > 0


def summarize(records: list[dict]) -> dict:
    counts = {k: 0 for k in OUTCOMES}
    for r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    elastic = [r for r in records if keeps_snapshots(r)]
    chosen: dict[str, int] = {}  # the K each finished run trained with (auto's choice)
    for r in records:
        k = (r.get("elastic") or {}).get("snapshot_every")
        if k is not None:
            chosen[str(k)] = chosen.get(str(k), 0) + 1
    kinds = {k: sum(1 for r in records if k in fault_kinds(r)) for k in KIND_NAMES}
    return {"runs": len(records), "counts": counts, "kinds": kinds,
            "leaks": sum(len(r["leaks"]) for r in records),
            "recovery": recovery_stats(records),
            "elastic": {"runs": len(elastic),
                        "moves": sum((r.get("elastic") or {}).get("moves", 0) for r in records),
                        "snapshot_restores": sum((r.get("elastic") or {}).get(
                            "snapshot_restores", 0) for r in records),
                        # stages lost whole replayed alone (the other restores rolled
                        # the job back), and the iterations trained twice for rollbacks
                        "replays": sum((r.get("elastic") or {}).get("replays", 0)
                                       for r in records),
                        "retrained_iterations": sum((r.get("elastic") or {}).get(
                            "retrained_iterations", 0) for r in records),
                        "runs_with_moves": sum(1 for r in records
                                               if (r.get("elastic") or {}).get("moves")),
                        "snapshot_every": dict(sorted(chosen.items(), key=_k_order)),
                        "pauses": sum((r.get("elastic") or {}).get("pauses", 0)
                                      for r in records),
                        # plan versions that changed the pipeline's shape, and in how many runs
                        "shape_changes": sum((r.get("elastic") or {}).get("shape_changes", 0)
                                             for r in records),
                        "runs_with_shape_changes": sum(
                            1 for r in records if (r.get("elastic") or {}).get("shape_changes"))},
            # only exact is a success: a halt too is a failure (see runner.py)
            "ok": all(r["outcome"] == "exact" for r in records)}


def summary_line(summary: dict) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in summary["counts"].items() if n or k == "exact")
    el = summary.get("elastic") or {}
    every = ", ".join(f"K={k} in {n}" for k, n in (el.get("snapshot_every") or {}).items())
    moves = (f"; {el['moves']} moves in {el['runs_with_moves']} runs, "
             f"{el['snapshot_restores']} snapshot restores ({el.get('replays', 0)} replayed "
             f"alone, {el.get('retrained_iterations', 0)} iterations retrained), "
             f"{el.get('shape_changes', 0)} shape changes in "
             f"{el.get('runs_with_shape_changes', 0)} runs, {el.get('pauses', 0)} pauses "
             f"({el['runs']} runs kept snapshots{': ' + every if every else ''})"
             if el else "")
    return f"{summary['runs']} runs: {counts}; {summary['leaks']} leaked processes{moves}"


def kinds_line(summary: dict) -> str:
    kinds = summary.get("kinds") or {}
    return "Runs with each kind of fault: " + "; ".join(
        f"{KIND_NAMES[k]} {n}" for k, n in kinds.items() if k in KIND_NAMES) + "."


def recovery_lines(summary: dict) -> list[str]:
    lines = []
    for mode in ("local", "local-clean", "service", "service-up", "service-clean"):
        for kind in RECOVERY_KINDS:
            s = summary["recovery"][mode][kind]
            if s["n"]:
                lines.append(f"recovery after {KIND_WORDS[kind]} ({mode}, n={s['n']}): "
                             f"p50 {s['p50']:.2f} s, "
                             f"p99 {s['p99']:.2f} s, max {s['max']:.2f} s")
    return lines or ["recovery: no times (no run finished with a 'recovery' list in its summary)"]


def table(records: list[dict]) -> Table:
    t = Table(title="recycle chaos", show_lines=False)
    for col in ("seed", "run", "grid", "faults", "outcome", "wall s", "max loss diff",
                "moves/restores/replays K", "recoveries"):
        t.add_column(col, overflow="fold", justify="right" if col in ("seed", "run", "wall s") else "left")
    for r in records:
        diff = "-" if r["max_diff"] is None else f"{r['max_diff']:.1e}"
        faults = r["faults"]
        svc = r.get("service_outage")
        if svc:  # what really happened to the service, not only what was drawn
            faults += (f" [svc down {svc['killed_at_s']}s..{svc['restarted_at_s']}s]"
                       if svc.get("killed_at_s") is not None else " [svc kill after the run]")
        t.add_row(str(r["seed"]), str(r["run"]) + (" svc" if r["service"] else ""),
                  f"{r['grid']} m{r['microbatches']} n{r['iterations']}", faults,
                  f"[{STYLE.get(r['outcome'], '')}]{r['outcome']}[/]", f"{r['wall_s']:.1f}",
                  diff, _elastic(r), _recoveries(r.get("recovery") or []))
    return t


def _elastic(r: dict) -> str:
    el = r.get("elastic") or {}
    k = el.get("snapshot_every")  # the K the run trained with (auto's choice)
    return (f"{el.get('moves', 0)}/{el.get('snapshot_restores', 0)}/{el.get('replays', 0)}"
            + ("" if k is None else f" K{k}")) if el else "-"


def _recoveries(rec: list[dict]) -> str:
    if not rec:
        return "-"
    return " ".join(f"{x.get('kind', '?')[0]}{x['worker'][0]}:{x['worker'][1]}"
                    f"@{x.get('iteration', '?')}={float(x['seconds']):.1f}s" for x in rec)


def _k_order(item: tuple[str, int]) -> tuple:
    """K=2 before K=10; a word (an off run's "off") after the numbers."""
    k = item[0]
    return (not k.isdigit(), int(k) if k.isdigit() else 0, k)


def _r(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 3)
