"""The `recycle` console command: one entry point over the planner, executor and service.

Each part registers its own sub-commands; the parts import their heavy dependencies
(torch, uvicorn) inside the commands, so `recycle plan` starts fast.
"""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="ReCycle: fault-tolerant pipeline training without spares.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
bench = typer.Typer(help="Benchmarks that print and save their figures.", no_args_is_help=True)
app.add_typer(bench, name="bench")


def _register_parts() -> None:
    from planner.cli import register as register_planner
    register_planner(app, bench)
    for module in ("executor.cli", "api.cli", "recycle.demo"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(app, bench) if mod.register.__code__.co_argcount == 2 else mod.register(app)


_register_parts()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
