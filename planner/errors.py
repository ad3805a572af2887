"""Exit codes and the typed errors every part raises for input a user can correct.

Shared by the planner, the executor, the service and the CLI (recycle/commands/), so a
part raises a typed error and the CLI alone decides how it ends: one line on stderr and
the code `exit_code` gives. No CLI library here: the parts expose plain functions.
"""
from __future__ import annotations

import json

from pydantic import ValidationError

EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3  # a valid question whose answer is "restore from checkpoint"
EXIT_MODEL_ERROR = 4  # `train`: the model's own code raised (no plan can route around it)


class UserError(ValueError):
    """Input a user can correct (a file, a flag, a spec, a checkpoint): one line says
    what and why. A ValueError, so code that guards plain ValueErrors still catches it."""


class Unplannable(RuntimeError):
    """A valid question with no plan for an answer: restore from a checkpoint (exit 3).
    Base of planner.failures.NoPlanError and planner.control.roles.NoRolesError."""


# What a user can cause, as the CLI reports it (exit 2): a JSONDecodeError and a
# pydantic ValidationError are ValueErrors too, named for the reader.
USER_ERRORS = (UserError, ValidationError, json.JSONDecodeError, ValueError, OSError)


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that ended with `exc`: EXIT_NO_PLAN when no plan routes
    around the failed set, EXIT_BAD_INPUT for anything a user can cause; a TypeError for
    anything else (a bug: it must surface, not be one line)."""
    if isinstance(exc, Unplannable):
        return EXIT_NO_PLAN
    if isinstance(exc, USER_ERRORS):
        return EXIT_BAD_INPUT
    raise TypeError(f"{type(exc).__name__} is not an error a user can cause") from exc


def is_user_error(exc: BaseException) -> bool:
    """Whether `exc` is input a user can correct (exit code 2)."""
    try:
        return exit_code(exc) == EXIT_BAD_INPUT
    except TypeError:
        return False


def one_line(exc: BaseException, what: str = "input") -> str:
    """`exc` as one line for a user: a validation error's first field, a JSON error's
    position, a file's name."""
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
