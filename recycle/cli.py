"""The `recycle` console command: one entry point over the planner, executor and service.

The commands are typer code over the parts' plain functions (recycle/commands/, one module
per part's commands); they import the parts' heavy dependencies (torch, uvicorn) inside the
commands, so `recycle plan` starts fast.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import typer

app = typer.Typer(help="ReCycle: fault-tolerant pipeline training without spares.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
bench = typer.Typer(help="Benchmarks that print and save their figures.", no_args_is_help=True)
app.add_typer(bench, name="bench")


# (command module, the part it drives): the commands live here, in recycle/commands/,
# over the parts' plain functions; a part left out of a build takes its commands along.
PARTS = (("recycle.commands.train", "executor"), ("recycle.commands.serve", "api"),
         ("recycle.commands.node", "executor"), ("recycle.commands.data", "executor"),
         ("recycle.demo", None), ("recycle.compare", "executor"),
         ("recycle.chaos.cli", None))  # None: no one part (always there)


def _part_missing(exc: ModuleNotFoundError, part) -> bool:
    return part is not None and exc.name is not None and (
        exc.name == part or exc.name.startswith(part + "."))


def _register_parts() -> None:
    """Each part's commands are added; a part missing from this build is simply left out
    (its package is absent, so its commands could only fail)."""
    from recycle.commands.plan import register as planner_commands
    planner_commands(app, bench)
    for module, part in PARTS:
        if part is not None and importlib.util.find_spec(part) is None:
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not _part_missing(exc, part):
                raise
            continue
        mod.register(app)


_register_parts()


# Output that is not a terminal's (a pipe, a file, CI) has no width to fit: rich and typer
# would cut it at 80 columns, truncating option names in help and digits in tables.
PIPE_COLUMNS = 200


def main() -> None:
    from planner.procs import DIE_WITH_PARENT, watch_parent
    if os.environ.pop(DIE_WITH_PARENT, "") == "1":  # popped: not for this one's children
        watch_parent()
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit():
        os.environ["COLUMNS"] = str(PIPE_COLUMNS)  # rich reads it per print; COLUMNS wins
    app()


if __name__ == "__main__":
    main()
