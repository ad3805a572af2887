"""`python -m api serve ...`: `recycle serve` for a machine with the service alone (no
CLI package): the same flags, read by argparse, served by api/server.py. Bad input is
one line and exit code 2, as everywhere."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from api.server import HELP, ServeOptions, check_serve_options, run_service
from planner.errors import EXIT_BAD_INPUT, USER_ERRORS, one_line

# Each flag is a ServeOptions field (--admin-token is admin_token) with the dataclass's
# default and help, as `recycle serve`'s are (tests/test_serve_entry.py compares them).
_TYPES = {"port": int, "max_failures": int, "solver_workers": int, "speed_window": int,
          "heartbeat_timeout": float, "suspect_grace": float, "cpsat_time_limit": float,
          "elastic_horizon": float}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m api", description="ReCycle plan service")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve failure events in, versioned plans out")
    for f in fields(ServeOptions):
        default = f.default
        if f.name == "admin_token":
            default = os.environ.get("RECYCLE_ADMIN_TOKEN")
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):  # a switch both ways (--x/--no-x), as typer's
            serve.add_argument(flag, dest=f.name, default=default,
                               action=argparse.BooleanOptionalAction, help=HELP[f.name] or None)
            continue
        serve.add_argument(flag, dest=f.name, default=default,
                           type=_TYPES.get(f.name, str), metavar=f.name.upper(),
                           help=HELP[f.name] or None)
    return ap


def main(argv=None) -> int:
    args = vars(parser().parse_args(argv))
    args.pop("command")
    opts = ServeOptions(**args)
    try:
        solvers = check_serve_options(opts)
    except USER_ERRORS as exc:
        print(f"error: {one_line(exc, 'serve options')}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run_service(opts, solvers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
