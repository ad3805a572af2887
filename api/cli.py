"""`recycle serve`: the plan service under uvicorn. `register(app)` adds the command to a
Typer app (the console command's); `python -m api serve ...` runs it standalone."""
from __future__ import annotations

import logging
import math
import os
from typing import Optional

import typer


class Server:
    """uvicorn.Server that first releases parked long-polls when asked to stop, so
    shutdown does not wait for them (nor cancel them with a traceback)."""

    def __new__(cls, app, **config):
        import uvicorn

        class _Server(uvicorn.Server):
            async def shutdown(self, sockets=None):
                svc = getattr(app.state, "service", None)
                if svc is not None:
                    svc.release_waiters()
                await super().shutdown(sockets)

        server = _Server(uvicorn.Config(app, **config))
        app.state.server = server  # lets startup (a standby waiting) and the store stop it
        return server


def serve(db: str = typer.Option("recycle.db", "--db", help="SQLite file (created if absent), "
                                 "or a postgresql:// URL (docs/operators.md: a standby)"),
          host: str = typer.Option("127.0.0.1", "--host"),
          port: int = typer.Option(8000, "--port"),
          admin_token: Optional[str] = typer.Option(
              None, "--admin-token", envvar="RECYCLE_ADMIN_TOKEN",
              help="operators' bearer token (default: generated and logged)"),
          heartbeat_timeout: float = typer.Option(10.0, "--heartbeat-timeout",
                                                  help="seconds of silence before a worker "
                                                       "is declared failed"),
          suspect_grace: Optional[float] = typer.Option(
              None, "--suspect-grace", help="a suspected worker silent this long is declared "
                                            "failed (default: a quarter of the timeout)"),
          max_failures: int = typer.Option(2, "--max-failures",
                                           help="precompute plans for up to this many "
                                                "failures per job"),
          solvers: str = typer.Option("greedy,cpsat", "--solvers",
                                      help="precompute back-ends, in order"),
          cpsat_time_limit: float = typer.Option(10.0, "--cpsat-time-limit"),
          solver_workers: int = typer.Option(1, "--solver-workers",
                                             help="background solver processes"),
          speed_window: int = typer.Option(
              3, "--speed-window", help="straggler detection: heartbeat compute times per "
                                        "estimate (their minimum); 0 turns detection off"),
          elastic_horizon: Optional[float] = typer.Option(
              None, "--elastic-horizon",
              help="time units (the job spec's) a move of a worker to another stage is "
                   "weighed over: it is made when the time it saves in that span exceeds "
                   "its stall (default: 1000 failure-free periods of the job; 0: only into "
                   "a stage left empty)"),
          log_level: str = typer.Option("info", "--log-level")) -> None:
    """Serve failure events in, versioned plans out (OpenAPI docs at /docs)."""
    from planner.commands.cli_errors import die

    try:
        solver_list = check_serve_options(db, port, heartbeat_timeout, suspect_grace,
                                          max_failures, solvers, cpsat_time_limit,
                                          solver_workers, speed_window, log_level,
                                          elastic_horizon)
    except ValueError as exc:
        die(str(exc))
    from api.app import create_app

    log_level = log_level.lower()
    logging.basicConfig(level=log_level.upper() if log_level != "trace" else 5,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from api.storage.postgres_store import check_reachable, is_postgres
    if is_postgres(db) and (why := check_reachable(db)) is not None:
        typer.echo(f"error: --db: cannot reach PostgreSQL: {why}", err=True)
        raise typer.Exit(2)
    db = db if is_postgres(db) else os.path.abspath(db)
    app = create_app(db, admin_token, heartbeat_timeout, max_failures,
                     solvers=solver_list,
                     cpsat_time_limit_s=cpsat_time_limit, solver_workers=solver_workers,
                     suspect_grace_s=suspect_grace, speed_window=speed_window,
                     elastic_horizon=elastic_horizon)
    Server(app, host=host, port=port, log_level=log_level, access_log=False,
           timeout_graceful_shutdown=5).run()


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _positive(flag: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} must be a positive number of seconds, not {value:g}")


def check_serve_options(db, port, heartbeat_timeout, suspect_grace, max_failures, solvers,
                        cpsat_time_limit, solver_workers, speed_window, log_level,
                        elastic_horizon=None):
    """One-line ValueError for an option the service would misuse; the solver list."""
    from api.jobs.runtime import ServiceConfig
    from api.storage.sqlite_store import check_database
    from planner.solvers.backends import BACKENDS

    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be 0..65535, not {port}")
    _positive("--heartbeat-timeout", heartbeat_timeout)
    if suspect_grace is not None:
        _positive("--suspect-grace", suspect_grace)
    _positive("--cpsat-time-limit", cpsat_time_limit)
    limit = ServiceConfig.max_failures_limit
    if not 0 <= max_failures <= limit:
        raise ValueError(f"--max-failures must be 0..{limit}, not {max_failures}")
    if solver_workers < 1:
        raise ValueError(f"--solver-workers must be at least 1, not {solver_workers}")
    if speed_window < 0:
        raise ValueError(f"--speed-window must be 0 (off) or more, not {speed_window}")
    if elastic_horizon is not None and not (math.isfinite(elastic_horizon)
                                            and elastic_horizon >= 0):
        raise ValueError(f"--elastic-horizon must be 0 or a positive number of time units, "
                         f"not {elastic_horizon:g}")
    names = tuple(s.strip() for s in solvers.split(",") if s.strip())
    if not names:
        raise ValueError(f"--solvers {solvers!r} names no back-end; choose from "
                         f"{', '.join(BACKENDS)}")
    bad = [s for s in names if s not in BACKENDS]
    if bad:
        raise ValueError(f"--solvers: unknown back-end {bad[0]!r}; choose from "
                         f"{', '.join(BACKENDS)}")
    if log_level.lower() not in LOG_LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}")
    from api.storage.postgres_store import is_postgres
    if not is_postgres(db):  # PostgreSQL: its reachability is checked next, in serve
        check_database(db)
    return names


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def main() -> None:
    app = typer.Typer(add_completion=False, help="ReCycle plan service")
    register(app)

    @app.callback()
    def _root() -> None:  # keeps `serve` a named sub-command
        pass

    app()
