"""`recycle import-csv` and the CSV branch of `recycle validate`."""
from __future__ import annotations

from typing import Optional

import typer

from planner.errors import EXIT_BAD_INPUT
from planner.job import JobSpec
from recycle.commands.errors import user_errors


def _read(path: str) -> str:
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file (not UTF-8)") from None


def _imported(path: str, spec: str, sync: bool):
    from planner.interop.csv_import import import_csv

    with user_errors("job spec"):
        job = JobSpec.load(spec)
    with user_errors("pipelining CSV"):
        return import_csv(_read(path), job, staggered=not sync)


def _report(plan, errs) -> None:
    from recycle.commands.output import console

    if errs:
        for e in errs:
            console.print(f"[red]{e}[/]")
        raise typer.Exit(1)
    m = plan.metrics
    console.print(f"valid: period {m.period} ({plan.solver.optimizer} optimizer), makespan "
                  f"{m.makespan}, lower bound {m.lower_bound}, gap {m.gap:.1%}")


def import_csv_cmd(
    path: str = typer.Argument(..., help="torch.distributed.pipelining CSV (one row per rank)"),
    spec: str = typer.Option(..., "--spec", help="job spec JSON whose costs time the order"),
    out: Optional[str] = typer.Option(None, "--out", help="write the plan JSON here"),
    sync: bool = typer.Option(False, "--sync", help="synchronous optimizer (barrier)"),
):
    """Turn a pipelining CSV into a plan: each rank's order timed as soon as possible with
    the spec's costs, every replica running it, OPT added, then validated."""
    from planner.validate import validate

    if out:
        with user_errors("--out"):
            from planner.interop.pipelining_csv import check_target
            check_target(out, "--out")
    plan = _imported(path, spec, sync)
    errs = validate(plan)
    if not errs and out:
        with user_errors("--out"):
            plan.save(out)
    _report(plan, errs)


def validate_if_csv(path: str, spec: Optional[str]) -> bool:
    """If `path` is a pipelining CSV, validate it as imported with `spec` and return True;
    a CSV without `--spec` is refused with one line. False: not a CSV (a plan's JSON)."""
    from planner.interop.csv_import import looks_like_csv
    from planner.validate import validate

    try:
        text = _read(path)
    except (OSError, ValueError):
        return False  # not readable as text: the plan reader says why
    if not looks_like_csv(text):
        if spec:
            with user_errors("plan"):
                raise ValueError("--spec is for a pipelining CSV; a plan's JSON carries its job")
        return False
    if not spec:
        typer.echo(f"error: {path} is a pipelining CSV, not a plan: give its job spec with "
                   f"--spec JOB.json (or run recycle import-csv)", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    plan = _imported(path, spec, sync=False)
    _report(plan, validate(plan))
    return True
