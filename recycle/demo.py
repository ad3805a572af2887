"""`recycle demo`: the README's main command.

Part 1 plans the example job of docs/design.md section 5 under 0, 1 and 2 failures with
every back-end and writes a Gantt chart; part 2 (when the executor and service are
installed) runs a live CPU cluster through a real failure.
"""
from __future__ import annotations

import os

import typer
from rich.console import Console
from rich.table import Table

console = Console()

EXAMPLE = {
    "replicas": 4, "stages": 4, "microbatches": 8,
    "cost": {"F": [10, 10, 10, 12], "I": [10, 10, 10, 12], "W": [8, 8, 8, 9], "OPT": [5, 5, 5, 5]},
    "p2p": {"intra": 1, "cross": 2},
    "memory": {"activation": [4, 4, 4, 4], "capacity": [40, 40, 40, 40]},
}


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)


def planner_demo(out_dir: str, time_limit: float) -> None:
    from planner.solvers.backends import SolveOptions, solve
    from planner.gantt import write_gantt
    from planner.job import JobSpec
    from planner.plan import Mode

    job = JobSpec.model_validate(EXAMPLE)
    console.rule("[bold]1. Planning: the example job of docs/design.md section 5 "
                 "(4 replicas x 4 stages, 8 micro-batches each)")
    table = Table("failed", "1f1b (re-route only)", "greedy +split", "greedy full", "cpsat full",
                  "lower bound", "kept (full)")
    base = None
    for failed in ([], [(1, 2)], [(1, 2), (3, 0)]):
        p1 = solve(job, failed, "1f1b")
        ps = solve(job, failed, "greedy", Mode(True, False))
        pg = solve(job, failed, "greedy")
        pc = solve(job, failed, "cpsat", opts=SolveOptions(time_limit=time_limit))
        base = base or pc.metrics.period
        table.add_row(", ".join(f"{r}:{s}" for r, s in failed) or "none", str(p1.metrics.period),
                      str(ps.metrics.period), str(pg.metrics.period),
                      f"{pc.metrics.period} ({pc.solver.status.lower()})",
                      str(pc.metrics.lower_bound), f"{base / pc.metrics.period:.1%}")
        last = pc
    console.print(table)
    path = os.path.join(out_dir, "demo-plan.html")
    write_gantt(last, path)
    console.print(f"Gantt chart of the last plan: [bold]{path}[/] (open it in a browser)")


def demo_cmd(
    out_dir: str = typer.Option("out", help="where the demo writes its files"),
    time_limit: float = typer.Option(5.0, help="CP-SAT limit per plan (s)"),
    planner_only: bool = typer.Option(False, help="skip the live cluster"),
):
    """Plan under failures, then train a live CPU cluster through a real SIGKILL."""
    os.makedirs(out_dir, exist_ok=True)
    planner_demo(out_dir, time_limit)
    if planner_only:
        return
    try:
        from recycle.live_demo import live_demo
    except ImportError:
        console.print("(live cluster demo not available in this build)")
        return
    if not live_demo(out_dir, console):
        raise typer.Exit(1)  # a mismatch with the failure-free run is a failed demo
