"""`recycle chaos`: random fault schedules against real `recycle train` runs, judged against
the one-process reference. Exit 0 when every run is exact, 1 otherwise, 2 for bad input."""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import dataclasses
from typing import Optional

import typer

from recycle.commands.errors import user_errors


def register(app: typer.Typer) -> None:
    app.command("chaos")(chaos_cmd)


def chaos_cmd(
    seed: int = typer.Option(0, "--seed", help="schedules are drawn from this seed (>= 0)"),
    runs: int = typer.Option(1, "--runs", help="how many schedules to draw and run (>= 1)"),
    service: bool = typer.Option(False, "--service",
                                 help="through a real `recycle serve`, which is also SIGKILLed "
                                      "and restarted mid-run"),
    json_path: Optional[str] = typer.Option(None, "--json", help="write every run's record "
                                                                 "and the summary here"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit",
                                               help="wall seconds per run before it counts as "
                                                    "a hang (default 120, 240 with --service)"),
    out_dir: Optional[str] = typer.Option(None, "--out-dir",
                                          help="logs, cached references and the dirs of failed "
                                               "runs (default: a new temp dir)"),
    shape: Optional[str] = typer.Option(None, "--shape",
                                        help="`recycle train --shape` for every run drawn with "
                                             "the default (auto or speed; the draws of "
                                             "--shape fixed keep it)"),
):
    """Train under random kills, rejoins, stalls (and service crashes); report each outcome."""
    from rich.console import Console

    from recycle.chaos.report import (kinds_line, recovery_lines, summarize, summary_line,
                                      table)
    from recycle.chaos.runner import run_schedule
    from recycle.chaos.schedule import draw

    with user_errors("chaos options"):
        if runs < 1:
            raise ValueError(f"--runs must be at least 1, got {runs}")
        if seed < 0:
            raise ValueError(f"--seed must be >= 0, got {seed}")
        if shape not in (None, "auto", "speed"):
            raise ValueError(f"--shape must be auto or speed, not {shape!r}")
        if time_limit is not None and not time_limit > 0:
            raise ValueError(f"--time-limit must be positive, got {time_limit:g}")
        if json_path:  # fail now, not after an hour of runs (and valid JSON from now on)
            _save(json_path, seed, [], complete=False)
        out_dir = out_dir or tempfile.mkdtemp(prefix="recycle-chaos-")
        os.makedirs(out_dir, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so a run's `finally` kills its process group and service.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    err = Console(stderr=True)
    err.print(f"chaos: seed {seed}, {runs} run(s){' through the service' if service else ''}; "
              f"logs in {out_dir}")
    records = []
    for sched in draw(seed, runs, service):
        if shape is not None and sched.shape is None and sched.model is None:
            sched = dataclasses.replace(sched, shape=shape)
        err.print(f"run {sched.index + 1}/{runs}: {sched.grid} m{sched.microbatches} "
                  f"n{sched.iterations} {sched.describe()}")
        rec = run_schedule(sched, out_dir, time_limit)
        err.print(f"  -> {rec['outcome']} in {rec['wall_s']:.1f} s"
                  + (f" ({rec['note']})" if rec.get("note") else "")
                  + (f": {rec['error']}" if rec.get("error") else "")
                  + (f" (kept {rec['run_dir']})" if rec.get("run_dir") else ""))
        records.append(rec)
        if json_path:  # after every run: a soak stopped half way keeps what it ran
            _save(json_path, seed, records, complete=False)
    summary = summarize(records)
    out = Console(width=None if sys.stdout.isatty() else 160)  # a log file: do not fold at 80
    out.print(table(records))
    for line in recovery_lines(summary):
        out.print(line)
    for rec in records:
        if rec["outcome"] != "exact" and rec.get("command"):
            out.print(f"{rec['name']} ({rec['outcome']}): {rec['command']}", soft_wrap=True)
        for leak in rec["leaks"]:
            out.print(f"{rec['name']}: leaked process {leak}", soft_wrap=True)
    out.print(summary_line(summary))
    out.print(kinds_line(summary), soft_wrap=True)
    if json_path:
        _save(json_path, seed, records, complete=True)
    raise typer.Exit(0 if summary["ok"] else 1)


def _save(path: str, seed: int, records: list, complete: bool) -> None:
    """The records so far and their summary; `complete` once every run drawn has run.
    Written aside and renamed, so an interrupt never leaves half a file."""
    from recycle.chaos.report import summarize
    with open(path + ".tmp", "w") as fh:
        json.dump({"seed": seed, "complete": complete, "runs": records,
                   "summary": summarize(records)}, fh, indent=1)
    os.replace(path + ".tmp", path)
