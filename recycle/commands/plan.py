"""`recycle plan`, `recycle precompute`, `recycle validate`, `recycle bench planner`."""
from __future__ import annotations

import json
from typing import List, Optional

import typer
from rich.table import Table

from planner.control.roles import NoRolesError
from planner.errors import EXIT_NO_PLAN
from planner.failures import NoPlanError, parse_worker
from planner.inputs.limits import load_plan, load_spec
from planner.inputs.paths import check_writable
from planner.plan import Mode, Plan
from recycle.commands.errors import user_errors
from recycle.commands.output import console



def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
    app.command("precompute")(precompute_cmd)
    app.command("validate")(validate_cmd)
    from recycle.commands.interop import import_csv_cmd
    app.command("import-csv")(import_csv_cmd)
    from recycle.commands.simulate import register as register_simulation
    register_simulation(app)
    bench.command("planner")(bench_planner_cmd)


def _mode(no_split: bool, sync: bool) -> Mode:
    return Mode(split_backward=not no_split, staggered=not sync)


def check_solver_options(time_limit: float, workers: int = 1) -> None:
    if not (time_limit > 0 and time_limit != float("inf")):
        raise ValueError(f"--time-limit must be positive and finite (seconds), not {time_limit:g}")
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, not {workers}")


def plan_cmd(
    spec: str = typer.Argument(..., help="job spec JSON (docs/design.md section 5)"),
    fail: List[str] = typer.Option([], "--fail", "-f", help="failed worker REPLICA:STAGE"),
    solver: str = typer.Option("greedy", help="1f1b | greedy | cpsat | milp"),
    time_limit: float = typer.Option(10.0, help="solver time limit (s)"),
    workers: int = typer.Option(2, help="CP-SAT search workers"),
    seed: int = typer.Option(0, help="CP-SAT random seed"),
    no_split: bool = typer.Option(False, "--no-split", help="fused backward (B), no I/W split"),
    sync: bool = typer.Option(False, "--sync", help="synchronous optimizer (barrier)"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    out: Optional[str] = typer.Option(None, help="write the plan JSON here"),
    gantt: Optional[str] = typer.Option(None, help="write a Gantt chart (.html or .svg)"),
    csv: Optional[str] = typer.Option(None, help="write one replica's pipeline as "
                                      "torch.distributed.pipelining CSV"),
    csv_replica: Optional[int] = typer.Option(None, "--csv-replica", help="the replica --csv "
                                              "writes (default: the first one that can be)"),
    roles: bool = typer.Option(False, "--roles", help="let the planner move live workers "
                               "between stages (docs/planner.md, Roles); prints the moves"),
    horizon: Optional[float] = typer.Option(None, help="with --roles: expected time to the "
                                            "next event, in the spec's time unit (default: "
                                            "100 failure-free periods)"),
    join: List[str] = typer.Option([], "--join", help="with --roles: a fresh worker's id "
                                   "(a new node's worker, no state)"),
    shape: str = typer.Option("fixed", help="fixed: the job's own partition; auto: the shape "
                              "the live workers train fastest on, state moves counted "
                              "(docs/planner.md, Shapes); the plan then carries its partition"),
):
    """Plan one iteration for SPEC with the given workers failed."""
    from planner.interop.pipelining_csv import check_target, export_csv
    from planner.solvers.backends import SolveOptions, solve

    with user_errors("job spec"):
        if csv_replica is not None and not csv:
            raise ValueError("--csv-replica needs --csv")
        if csv:
            check_target(csv)
        check_solver_options(time_limit, workers)
        for path, flag in ((out, "--out"), (gantt, "--gantt")):
            if path:
                check_writable(path, flag)
        if gantt and not gantt.endswith((".html", ".htm", ".svg")):  # as write_gantt reads it
            raise ValueError(f"--gantt {gantt}: write .html or .svg (no other format is made)")
        if shape not in ("fixed", "auto"):
            raise ValueError(f"--shape must be fixed or auto, not {shape!r}")
        if (horizon is not None or join) and not (roles or shape == "auto"):
            raise ValueError("--horizon and --join need --roles or --shape auto")
        if horizon is not None and not (0 < horizon < float("inf")):
            raise ValueError(f"--horizon must be positive and finite, not {horizon:g}")
        job = load_spec(spec)
        failed = [parse_worker(f) for f in fail]
        opts = SolveOptions(time_limit=time_limit, num_workers=workers, seed=seed)
        from planner.simulation.costs import plan_period

        h = horizon if horizon is not None else 100 * plan_period(job, [])
        line = None if as_json or not (failed or join) else \
            _shape_line(job, failed, h, tuple(join))
        if line:
            console.print(line, soft_wrap=True, markup=False)  # one line, however wide
        try:
            if shape == "auto":
                from planner.shapes.planning import plan_shape
                plan, _ = plan_shape(job, failed, h, solver, _mode(no_split, sync), opts,
                                     tuple(join))
            elif roles:
                from planner.failures import normalize
                from planner.control.roles import live_from_failed, plan_roles
                live = live_from_failed(job, normalize(job, failed), tuple(join))
                plan, _ = plan_roles(job, live, h, solver, mode=_mode(no_split, sync), opts=opts)
            else:
                plan = solve(job, failed, solver, _mode(no_split, sync), opts)
        except (NoPlanError, NoRolesError) as exc:
            if as_json:
                typer.echo(json.dumps({"outcome": "restore_from_checkpoint", "reason": str(exc)}))
            else:
                console.print(f"[bold red]{exc}[/]")
            raise typer.Exit(EXIT_NO_PLAN)
        csv_text = export_csv(plan, csv_replica) if csv else None  # refused: nothing written
    if out:
        plan.save(out)
    if gantt:
        from planner.gantt import write_gantt
        write_gantt(plan, gantt)
    if csv:
        with user_errors("--csv"), open(csv, "w", newline="") as fh:
            fh.write(csv_text)
    if as_json:
        typer.echo(plan.to_json(indent=1))
    else:
        print_plan(plan)


def _shape_line(job, failed, horizon, join) -> Optional[str]:
    """The added line of `recycle plan` when the live workers would train faster on
    another shape than the job's own (None when not, or when none fits them)."""
    from planner.errors import Unplannable
    from planner.shapes.planning import choose_for_failed, shape_line

    try:
        ch, c = choose_for_failed(job, failed, horizon, join)
    except (Unplannable, ValueError):
        return None
    return shape_line(c, ch.units.kind, job.stages)


def print_plan(plan: Plan) -> None:
    m, sv = plan.metrics, plan.solver
    failed = ", ".join(f"{r}:{s}" for r, s in plan.failed) or "none"
    console.print(f"[bold]{sv.name}[/] {sv.status} in {sv.wall_s:.3f}s  optimizer={sv.optimizer} "
                  f"split_backward={sv.split_backward}  failed: {failed}")
    console.print(f"period [bold]{m.period}[/]  makespan {m.makespan}  lower bound {m.lower_bound}"
                  f"  gap {m.gap:.1%}" + (f"  solver bound {sv.bound}" if sv.bound else ""))
    if plan.roles is not None:
        from planner.control.roles import elastic_bound
        eb = elastic_bound(plan.job, len(plan.roles))
        console.print(f"roles: {len(plan.roles)} live workers; no role choice beats period {eb} "
                      f"(gap {m.period / eb - 1:.1%})")
        for mv in plan.moves or []:
            frm = "fresh" if mv.from_stage is None else f"stage {mv.from_stage}"
            console.print(f"  move {mv.worker}: {frm} -> stage {mv.to_stage}, "
                          f"{mv.bytes} bytes from {mv.source}")
        if not plan.moves:
            console.print("  no moves")
    table = Table("worker", "micro-batches", "re-routed in", "busy", "idle", "span", "busy %")
    for w in plan.workers:
        busy = sum(a.end - a.start for a in w.actions)
        span = w.actions[-1].end - w.actions[0].start
        mbs = {a.microbatch for a in w.actions if a.microbatch is not None}
        foreign = sum(1 for g in mbs if plan.job.owner(g) != w.replica)
        table.add_row(f"{w.replica}:{w.stage}", str(len(mbs)), str(foreign), str(busy),
                      str(span - busy), str(span), f"{busy / span:.0%}" if span else "-")
    console.print(table)


def open_cache(db: str):
    """The plan cache at `db`, or ValueError (one line) for a path that cannot be one."""
    import sqlite3

    from planner.cache import PlanCache
    check_writable(db, "--db")
    try:
        return PlanCache(db)
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"--db {db}: not a usable SQLite plan cache ({exc})") from None


def precompute_cmd(
    spec: str = typer.Argument(..., help="job spec JSON"),
    max_failures: int = typer.Option(1, "--max-failures", "-k", min=0, help="failures per set, at most"),
    db: str = typer.Option("plans.sqlite", help="SQLite plan cache file"),
    solver: List[str] = typer.Option(["greedy", "cpsat"], help="back-ends, in order"),
    time_limit: float = typer.Option(5.0, help="per-set solver time limit (s)"),
    no_split: bool = typer.Option(False, "--no-split"),
    sync: bool = typer.Option(False, "--sync"),
):
    """Fill the plan cache for every canonical failed set with up to k failures."""
    from rich.progress import Progress

    from planner.solvers.backends import BACKENDS, SolveOptions
    from planner.cache import precompute

    with user_errors("job spec"):
        check_solver_options(time_limit)
        bad = [s for s in solver if s not in BACKENDS]
        if bad:
            raise ValueError(f"unknown solver {bad[0]!r}; choose from {', '.join(BACKENDS)}")
        job = load_spec(spec)
        cache = open_cache(db)
    with Progress(console=console) as progress:
        task = progress.add_task("planning", total=None)

        def tick(done, total, canon, plan):
            progress.update(task, total=total, completed=done,
                            description=f"{plan.solver.name:6s} {canon.key:>12s} period {plan.metrics.period}")
        n = precompute(cache, job, max_failures, solver, _mode(no_split, sync),
                       SolveOptions(time_limit=time_limit), tick)
    console.print(f"{n} canonical failed sets cached in {db} ({cache.count(job)} plans for this job)")


def validate_cmd(path: str = typer.Argument(..., help="plan JSON, or a pipelining CSV with --spec"),
                 spec: Optional[str] = typer.Option(None, "--spec", help="job spec of a CSV")):
    """Check a plan against every constraint and replay its metrics."""
    from recycle.commands.interop import validate_if_csv
    from planner.validate import metric_errors, replay_metrics, validate

    if validate_if_csv(path, spec):
        return
    with user_errors("plan"):
        plan = load_plan(path)
    errs = validate(plan) or metric_errors(plan)
    if errs:
        for e in errs:
            console.print(f"[red]{e}[/]")
        raise typer.Exit(1)
    stag, sync = replay_metrics(plan.job, plan.workers)
    console.print(f"valid: period (staggered) {stag}, makespan {sync}")


def bench_planner_cmd(
    out: Optional[str] = typer.Option(None, help="results table (markdown); default "
                                      "benchmarks/results/planner.md, or planner_speeds.md"),
    quick: bool = typer.Option(False, help="a small subset, for a smoke run"),
    time_limit: float = typer.Option(10.0, help="CP-SAT limit per instance (s)"),
    cpsat_max_actions: int = typer.Option(3500, help="run CP-SAT up to this many actions"),
    speeds: bool = typer.Option(False, "--speeds", help="the straggler benchmark instead"),
    cpsat: bool = typer.Option(True, "--cpsat/--no-cpsat", help="with --speeds: run CP-SAT"),
):
    """Period / lower bound per back-end, solve times, and the ablation."""
    with user_errors("benchmark"):
        check_solver_options(time_limit)
        if cpsat_max_actions < 0:
            raise ValueError(f"--cpsat-max-actions must be 0 or more, not {cpsat_max_actions}")
        if out:  # checked first: the benchmark runs for minutes before it writes
            check_writable(out, "--out")
    if speeds:
        from planner.bench.speeds import run_speeds_bench
        run_speeds_bench(out or "benchmarks/results/planner_speeds.md", time_limit, cpsat,
                         console=console)
        return
    from planner.bench.quality import run_planner_bench

    run_planner_bench(out or "benchmarks/results/planner.md", quick=quick,
                      time_limit=time_limit, cpsat_max_actions=cpsat_max_actions,
                      console=console)
