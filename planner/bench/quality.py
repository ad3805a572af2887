"""Planner benchmark: quality (period / lower bound), solve time and the ablation.

Ablation, as throughput kept under failures, period(no failure) / period(k failures),
each variant against its own failure-free period:
  1f1b     re-routing only (fused backward, synchronous optimizer, 1F1B in-flight limit)
  +split   I/W split with W deferred into bubbles, still synchronous
  +stagger the full method (split + staggered optimizer), greedy and CP-SAT
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Optional

from planner.solvers.backends import SolveOptions, solve
from planner.failures import Worker
from planner.job import JobSpec
from planner.plan import Mode

FULL, SPLIT_SYNC = Mode(True, True), Mode(True, False)


def failure_set(D: int, S: int, k: int) -> list[Worker]:
    """A representative set: one mid-pipeline failure; the second in the same stage when a
    peer is left, else in another stage of the other replica."""
    if k == 0:
        return []
    first = (1 % D, S // 2)
    if k == 1:
        return [first]
    second = (2, S // 2) if D >= 3 else (0, max(0, S // 2 - 1))
    return [first, second]


@dataclass
class Row:
    D: int
    S: int
    M: int
    k: int
    actions: int
    lower_bound: int
    p_1f1b: int
    p_greedy: int
    p_cpsat: Optional[int]
    cpsat_status: str
    t_greedy_ms: float
    t_cpsat_s: Optional[float]
    kept_1f1b: float
    kept_split: float
    kept_greedy: float
    kept_cpsat: Optional[float]


def bench_instance(D, S, M, k, opts: SolveOptions, run_cpsat: bool, base: dict) -> Row:
    job = JobSpec.uniform(D, S, M)
    failed = failure_set(D, S, k)
    actions = 3 * D * M * S
    t = time.perf_counter()
    greedy = solve(job, failed, "greedy", FULL)
    t_greedy = (time.perf_counter() - t) * 1e3
    p1 = solve(job, failed, "1f1b").metrics.period
    ps = solve(job, failed, "greedy", SPLIT_SYNC).metrics.period
    cp = solve(job, failed, "cpsat", FULL, opts) if run_cpsat else None
    key = (D, S, M)
    if k == 0:
        base[key] = (p1, ps, greedy.metrics.period, cp.metrics.period if cp else None)
    b1, bs, bg, bc = base[key]
    return Row(D, S, M, k, actions, greedy.metrics.lower_bound, p1, greedy.metrics.period,
               cp.metrics.period if cp else None, cp.solver.status if cp else "-",
               round(t_greedy, 2), cp.solver.wall_s if cp else None,
               round(b1 / p1, 4), round(bs / ps, 4), round(bg / greedy.metrics.period, 4),
               round(bc / cp.metrics.period, 4) if cp and bc else None)


def single_failure_sweep(D=8, S=8, M=8, opts: Optional[SolveOptions] = None) -> list[dict]:
    """Throughput kept for one failure at each stage (replicas are interchangeable)."""
    job = JobSpec.uniform(D, S, M)
    out = []
    # No plan keeps more than best failure-free period / lower bound with the failure.
    best_base = min(solve(job, [], s, opts=opts or SolveOptions()).metrics.period
                    for s in (("greedy", "cpsat") if opts else ("greedy",)))
    limit = [round(best_base / solve(job, [(0, s)], "greedy").metrics.lower_bound, 4)
             for s in range(S)]
    for variant, solver, mode in (("1f1b", "1f1b", None), ("+split", "greedy", SPLIT_SYNC),
                                  ("+stagger greedy", "greedy", FULL),
                                  ("+stagger cpsat", "cpsat", FULL)):
        if solver == "cpsat" and opts is None:
            continue
        kw = {} if mode is None else {"mode": mode}
        base = solve(job, [], solver, opts=opts or SolveOptions(), **kw).metrics.period
        kept = [base / solve(job, [(0, s)], solver, opts=opts or SolveOptions(), **kw).metrics.period
                for s in range(S)]
        out.append({"variant": variant, "kept_min": round(min(kept), 4),
                    "kept_mean": round(sum(kept) / S, 4), "kept_per_stage": [round(x, 4) for x in kept]})
    out.append({"variant": "no plan keeps more than", "kept_min": min(limit),
                "kept_mean": round(sum(limit) / S, 4), "kept_per_stage": limit})
    return out


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_ORDERS = os.path.join(ROOT, "benchmarks", "torch_orders")
TORCH_CASES = [(4, 8, 4), (4, 8, 10), (4, 16, 4), (8, 16, 8), (8, 16, 10)]  # (S, M, slots)
TORCH_NAMES = ("1f1b", "gpipe", "zb1p")


def torch_order_rows(opts: Optional[SolveOptions], cases=TORCH_CASES) -> list[dict]:
    """torch.distributed.pipelining's own orders (benchmarks/torch_orders/*.csv, made by
    benchmarks/torch_orders.py), imported and timed with our cost model, next to greedy,
    CP-SAT and the bound on the same job (D=1, uniform costs, `slots` micro-batches of
    memory). An order that does not fit the memory is reported as such."""
    from planner.interop.csv_import import import_csv
    from planner.validate import validate

    rows = []
    for S, M, slots in cases:
        job = JobSpec.uniform(1, S, M, capacity=4 * slots)
        row = {"S": S, "M": M, "slots": slots}
        for name in TORCH_NAMES:
            path = os.path.join(TORCH_ORDERS, f"{name}_S{S}_M{M}.csv")
            if not os.path.exists(path):
                row[name] = None
                continue
            with open(path, newline="") as fh:
                plan = import_csv(fh.read(), job)
            errs = validate(plan)
            row[name] = plan.metrics.period if not errs else (
                "over memory" if errs[0].startswith("(6)") else errs[0])
        greedy = solve(job, [], "greedy", FULL)
        row["greedy"], row["bound"] = greedy.metrics.period, greedy.metrics.lower_bound
        row["cpsat"] = solve(job, [], "cpsat", FULL, opts).metrics.period if opts else None
        rows.append(row)
    return rows


def big_greedy_seconds(D=64, S=16, M=64) -> tuple[int, float]:
    job = JobSpec.uniform(D, S, M)
    t = time.perf_counter()
    plan = solve(job, [(3, 5)], "greedy")
    return sum(len(w.actions) for w in plan.workers), time.perf_counter() - t


def run_planner_bench(out: str, quick: bool = False, time_limit: float = 10.0,
                      cpsat_max_actions: int = 3500, console=None) -> list[Row]:
    try:
        import planner.solvers.cpsat  # noqa: F401
        have_cpsat = True
    except ImportError:
        have_cpsat = False
    opts = SolveOptions(time_limit=time_limit, num_workers=2, seed=0)
    Ds, Ss, Ms = ((2, 4), (4,), (8,)) if quick else ((2, 4, 8, 16), (4, 8), (8, 16, 32))
    rows, base = [], {}
    started = time.perf_counter()
    for D in Ds:
        for S in Ss:
            for M in Ms:
                for k in (0, 1, 2):
                    run_cp = have_cpsat and 3 * D * M * S <= cpsat_max_actions
                    row = bench_instance(D, S, M, k, opts, run_cp, base)
                    rows.append(row)
                    if console:
                        console.print(_md_row(row))
    sweep = single_failure_sweep(opts=opts if have_cpsat else None) if not quick else []
    torch_rows = torch_order_rows(opts if have_cpsat else None,
                                  TORCH_CASES[:1] if quick else TORCH_CASES)
    n_big, t_big = big_greedy_seconds() if not quick else (0, 0.0)
    _write(out, rows, sweep, n_big, t_big, time_limit, quick, time.perf_counter() - started,
           torch_rows)
    if console:
        console.print(f"wrote {out}")
    return rows


HEADER = ("| D | S | M | k | actions | bound | 1f1b/bound | greedy/bound | cpsat/bound (status) "
          "| greedy ms | cpsat s | kept 1f1b | kept +split | kept +stagger greedy | kept +stagger cpsat |")


def _ratio(p, lb):
    return f"{p / lb:.3f}" if p is not None else "-"


def _md_row(r: Row) -> str:
    cp = f"{_ratio(r.p_cpsat, r.lower_bound)} ({r.cpsat_status})" if r.p_cpsat else "-"
    return (f"| {r.D} | {r.S} | {r.M} | {r.k} | {r.actions} | {r.lower_bound} | "
            f"{_ratio(r.p_1f1b, r.lower_bound)} | {_ratio(r.p_greedy, r.lower_bound)} | {cp} | "
            f"{r.t_greedy_ms:.1f} | {r.t_cpsat_s if r.t_cpsat_s is not None else '-'} | "
            f"{r.kept_1f1b:.3f} | {r.kept_split:.3f} | {r.kept_greedy:.3f} | "
            f"{f'{r.kept_cpsat:.3f}' if r.kept_cpsat else '-'} |")


def _torch_lines(torch_rows) -> list[str]:
    def cell(v, bound):
        return "-" if v is None else (_ratio(v, bound) + f" ({v})" if isinstance(v, int) else v)
    lines = ["", "## torch.distributed.pipelining's orders, timed with this cost model", "",
             "One pipeline (D=1), uniform costs as above, `slots` micro-batches of memory per "
             "worker. Orders: torch's Schedule1F1B and ScheduleGPipe (fused backward B) and "
             "ScheduleInterleavedZeroBubble with one stage per rank (ZB1P, I/W split), as "
             "`benchmarks/torch_orders.py` wrote them from torch 2.13.0; each is imported with "
             "`recycle import-csv` semantics (each rank's order as soon as possible, staggered "
             "optimizer). Each cell is period / bound (period).", "",
             "| S | M | slots | bound | torch 1F1B | torch GPipe | torch ZB1P | greedy | cpsat |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in torch_rows:
        b = r["bound"]
        lines.append(f"| {r['S']} | {r['M']} | {r['slots']} | {b} | "
                     + " | ".join(cell(r[k], b) for k in (*TORCH_NAMES, "greedy", "cpsat")) + " |")
    return lines


def _write(out, rows, sweep, n_big, t_big, time_limit, quick, wall, torch_rows=()):
    cmd = "recycle bench planner" + (" --quick" if quick else "") + f" --time-limit {time_limit:g}"
    lines = ["# Planner benchmark", "",
             f"Made by `{cmd}` on {platform.node() or 'this machine'} "
             f"({platform.processor() or platform.machine()}), {wall:.0f} s in all.",
             "Jobs: `JobSpec.uniform(D, S, M)` (F=10, I=10, W=8, OPT=5, p2p intra 1 / cross 2, "
             "activation 4 of capacity 40). Failed sets: `planner.bench.quality.failure_set`. "
             "`bound` is the lower bound of the staggered period; each ratio is period / bound "
             "(1f1b's period is its makespan, synchronous optimizer). "
             "`kept` = period(no failure) / period(k failures) of the same variant.", "",
             HEADER, "|" + "---|" * 15]
    lines += [_md_row(r) for r in rows]
    if sweep:
        lines += ["", "## One failure at D=8, S=8, M=8, at each stage", "",
                  "Throughput kept, period(no failure) / period(failure at stage s), each variant "
                  "against its own failure-free period. The last row is an upper bound for any "
                  "plan: the best failure-free period found over the lower bound with the failure.",
                  "", "| variant | kept (worst stage) | kept (mean) | kept, failure at stage 0 .. S-1 |",
                  "|---|---|---|---|"]
        for s in sweep:
            lines.append(f"| {s['variant']} | {s['kept_min']:.3f} | {s['kept_mean']:.3f} | "
                         f"{' '.join(f'{x:.3f}' for x in s['kept_per_stage'])} |")
    if torch_rows:
        lines += _torch_lines(torch_rows)
    if n_big:
        lines += ["", f"Greedy at D=64, S=16, M=64, one failure: {n_big} actions planned in "
                  f"{t_big:.2f} s (plan object and metrics included)."]
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(out.rsplit(".", 1)[0] + ".json", "w") as fh:
        json.dump({"rows": [asdict(r) for r in rows], "single_failure_sweep": sweep,
                   "torch_orders": list(torch_rows),
                   "big_greedy": {"actions": n_big, "seconds": t_big}}, fh, indent=1)
