"""`recycle serve`: the plan service under uvicorn (api/server.py serves; this is its
flags, whose defaults and help are api.server.ServeOptions'). `python -m api serve ...` is
the same command without typer (api/__main__.py)."""
from __future__ import annotations

from typing import Optional

import typer

from api.server import HELP, ServeOptions as O
from recycle.commands.errors import user_errors


def _option(name: str, **kw):
    flag = "--" + name.replace("_", "-")
    if isinstance(getattr(O, name), bool):  # a switch both ways: --x/--no-x
        flag = f"{flag}/--no-{flag[2:]}"
    return typer.Option(getattr(O, name), flag, help=HELP[name] or None, **kw)


def serve(db: str = _option("db"), host: str = _option("host"), port: int = _option("port"),
          admin_token: Optional[str] = _option("admin_token", envvar="RECYCLE_ADMIN_TOKEN"),
          heartbeat_timeout: float = _option("heartbeat_timeout"),
          suspect_grace: Optional[float] = _option("suspect_grace"),
          max_failures: int = _option("max_failures"), solvers: str = _option("solvers"),
          cpsat_time_limit: float = _option("cpsat_time_limit"),
          solver_workers: int = _option("solver_workers"),
          speed_window: int = _option("speed_window"),
          elastic_horizon: Optional[float] = _option("elastic_horizon"),
          elastic_snapshots: bool = _option("elastic_snapshots"),
          elastic_disk: bool = _option("elastic_disk"),
          log_level: str = _option("log_level")) -> None:
    """Serve failure events in, versioned plans out (OpenAPI docs at /docs)."""
    from api.server import check_serve_options, run_service

    opts = O(db=db, host=host, port=port, admin_token=admin_token,
             heartbeat_timeout=heartbeat_timeout, suspect_grace=suspect_grace,
             max_failures=max_failures, solvers=solvers, cpsat_time_limit=cpsat_time_limit,
             solver_workers=solver_workers, speed_window=speed_window,
             elastic_horizon=elastic_horizon, elastic_snapshots=elastic_snapshots,
             elastic_disk=elastic_disk, log_level=log_level)
    with user_errors("serve options"):
        solvers = check_serve_options(opts)
    run_service(opts, solvers)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
