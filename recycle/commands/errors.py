"""Bad input on the command line ends in one clear line and exit code 2, never a traceback
(the codes and the errors are planner/errors.py's; this is their typer side)."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import typer

from planner.errors import EXIT_BAD_INPUT, USER_ERRORS, exit_code, one_line


@contextmanager
def user_errors(what: str = "input"):
    """Turn the errors a user can cause into one line on stderr and exit code 2."""
    try:
        yield
    except USER_ERRORS as exc:
        typer.echo(f"error: {one_line(exc, what)}", err=True)
        raise typer.Exit(exit_code(exc)) from None


def die(message: str, code: int = EXIT_BAD_INPUT):
    typer.echo(f"error: {message}", err=True)
    sys.exit(code)
