"""`recycle compare A.json B.json`: two run summaries (`recycle train --summary`) side by
side, e.g. a run with failures against its --reference. Agreement is reference.compare's
(absolute, relative above magnitude 1): exit 0 within --tol, 1 beyond, 2 on bad input."""
from __future__ import annotations

import json
import math

import typer

from recycle.commands.errors import user_errors


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def load_summary(path: str):
    """The summary in `path`; ValueError/OSError (one line) when it is not one."""
    from executor.compute.one_process.reference import Summary
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        d = json.loads(raw)
    except ValueError as exc:  # also bytes that are not UTF-8
        raise ValueError(f"{path} is not a run summary: not JSON ({str(exc).splitlines()[0]})") from None
    if not (isinstance(d, dict) and all(
            isinstance(d.get(k), list) and all(_number(x) for x in d[k])
            for k in ("losses", "param_checksums"))):
        raise ValueError(f"{path} is not a run summary (from `recycle train --summary`): "
                         f"it needs number lists losses and param_checksums")
    return Summary(losses=[float(x) for x in d["losses"]],
                   param_checksums=[float(x) for x in d["param_checksums"]])


def compare_cmd(
    a: str = typer.Argument(..., help="run summary JSON (`recycle train --summary`)"),
    b: str = typer.Argument(..., help="the summary to compare it with"),
    tol: float = typer.Option(1e-5, "--tol", help="largest difference that agrees (absolute; relative above magnitude 1)"),
):
    """Losses and per-stage parameter checksums of two training runs side by side; exit 0
    if they agree within --tol, 1 if not."""
    from executor.compute.one_process.reference import compare
    with user_errors("compare input"):
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"--tol must be a finite number >= 0, not {tol:g}")
        sa, sb = load_summary(a), load_summary(b)
    rows = [(f"loss[{i}]", x, y) for i, (x, y) in enumerate(zip(sa.losses, sb.losses))]
    rows += [(f"checksum[stage {s}]", x, y)
             for s, (x, y) in enumerate(zip(sa.param_checksums, sb.param_checksums))]
    width = max([len(r[0]) for r in rows] + [5])
    typer.echo(f"{'':<{width}}  {'A':>22}  {'B':>22}  {'diff':>9}")
    for name, x, y in rows:
        typer.echo(f"{name:<{width}}  {x:>22.15g}  {y:>22.15g}  {abs(x - y):>9.3g}")
    worst = max((abs(x - y) for _, x, y in rows), default=0.0)
    differences = compare(sa, sb, tol)
    verdict = "agree" if not differences else f"differ: {'; '.join(differences[:3])}" + (
        f" (and {len(differences) - 3} more)" if len(differences) > 3 else "")
    typer.echo(f"max difference {worst:.3g} (--tol {tol:g}): {verdict}")
    if differences:
        raise typer.Exit(1)
