"""`recycle serve`: the plan service under uvicorn. `register(app)` adds the command to a
Typer app (the console command's); `python -m api serve ...` runs it standalone."""
from __future__ import annotations

import logging
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
                                        "estimate (median); 0 turns detection off"),
          log_level: str = typer.Option("info", "--log-level")) -> None:
    """Serve failure events in, versioned plans out (OpenAPI docs at /docs)."""
    from api.app import create_app

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from api.store_pg import check_reachable, is_postgres
    if is_postgres(db) and (why := check_reachable(db)) is not None:
        typer.echo(f"error: --db: cannot reach PostgreSQL: {why}", err=True)
        raise typer.Exit(2)
    db = db if is_postgres(db) else os.path.abspath(db)
    app = create_app(db, admin_token, heartbeat_timeout, max_failures,
                     solvers=tuple(s.strip() for s in solvers.split(",") if s.strip()),
                     cpsat_time_limit_s=cpsat_time_limit, solver_workers=solver_workers,
                     suspect_grace_s=suspect_grace, speed_window=speed_window)
    Server(app, host=host, port=port, log_level=log_level, access_log=False,
           timeout_graceful_shutdown=5).run()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def main() -> None:
    app = typer.Typer(add_completion=False, help="ReCycle plan service")
    register(app)

    @app.callback()
    def _root() -> None:  # keeps `serve` a named sub-command
        pass

    app()
