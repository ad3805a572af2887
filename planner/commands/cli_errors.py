"""Bad input on the command line ends in one clear line and exit code 2, never a traceback."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import typer
from pydantic import ValidationError

from planner.failures import FailedSetError

EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3  # a valid question whose answer is "restore from checkpoint"
EXIT_MODEL_ERROR = 4  # `train`: the model's own code raised (no plan can route around it)


def one_line(exc: BaseException, what: str = "input") -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = err.get("msg", str(exc)).replace("Value error, ", "")
        return f"bad {what}: {loc + ': ' if loc else ''}{msg}{more}"
    if isinstance(exc, json.JSONDecodeError):
        return f"bad {what}: malformed JSON at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}"
    if isinstance(exc, OSError):
        return f"cannot read {exc.filename or what}: {exc.strerror or exc}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@contextmanager
def user_errors(what: str = "input"):
    """Turn the errors a user can cause into one line on stderr and exit code 2."""
    try:
        yield
    except (ValidationError, json.JSONDecodeError, OSError, FailedSetError, ValueError) as exc:
        typer.echo(f"error: {one_line(exc, what)}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def die(message: str, code: int = EXIT_BAD_INPUT):
    typer.echo(f"error: {message}", err=True)
    sys.exit(code)
