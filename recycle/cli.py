"""The `recycle` console command: one entry point over the planner, executor and service.

Each part registers its own sub-commands; the parts import their heavy dependencies
(torch, uvicorn) inside the commands, so `recycle plan` starts fast.
"""
from __future__ import annotations

import importlib
import os
import sys

import typer

app = typer.Typer(help="ReCycle: fault-tolerant pipeline training without spares.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
bench = typer.Typer(help="Benchmarks that print and save their figures.", no_args_is_help=True)
app.add_typer(bench, name="bench")


def _register_parts() -> None:
    """Each part adds its commands; a part missing from this build is simply left out."""
    from planner.commands.cli import register as planner_commands
    planner_commands(app, bench)
    parts = (("executor.cli", app), ("api.cli", app),
             ("executor.node.cli", app), ("executor.data.cli", app),
             ("recycle.demo", app), ("recycle.compare", app),
             ("recycle.chaos.cli", app))
    for module, group in parts:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(group)


_register_parts()


# Output that is not a terminal's (a pipe, a file, CI) has no width to fit: rich and typer
# would cut it at 80 columns, truncating option names in help and digits in tables.
PIPE_COLUMNS = 200


def main() -> None:
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit():
        os.environ["COLUMNS"] = str(PIPE_COLUMNS)  # rich reads it per print; COLUMNS wins
    app()


if __name__ == "__main__":
    main()
