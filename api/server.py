"""The plan service under uvicorn, as plain functions: `recycle serve` (recycle/commands/
serve.py) and `python -m api serve` (api/__main__.py) both call `run_service`."""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field, fields
from typing import Optional

from planner.errors import UserError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


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


def _opt(default, help: str = ""):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServeOptions:
    """What `recycle serve` is asked: one field per flag (--admin-token is admin_token),
    with its default and help, read by both entry points."""
    db: str = _opt("recycle.db", "SQLite file (created if absent), or a postgresql:// URL "
                   "(docs/operators.md: a standby)")
    host: str = _opt("127.0.0.1")
    port: int = _opt(8000)
    admin_token: Optional[str] = _opt(None, "operators' bearer token (default: generated "
                                      "and logged; env RECYCLE_ADMIN_TOKEN)")
    heartbeat_timeout: float = _opt(10.0, "seconds of silence before a worker is declared "
                                    "failed")
    suspect_grace: Optional[float] = _opt(None, "a suspected worker silent this long is "
                                          "declared failed (default: a quarter of the timeout)")
    max_failures: int = _opt(2, "precompute plans for up to this many failures per job")
    solvers: str = _opt("greedy,cpsat", "precompute back-ends, in order")
    cpsat_time_limit: float = _opt(10.0)
    solver_workers: int = _opt(1, "background solver processes")
    speed_window: int = _opt(3, "straggler detection: heartbeat compute times per estimate "
                             "(their minimum); 0 turns detection off")
    elastic_horizon: Optional[float] = _opt(
        None, "time units (the job spec's) a move of a worker to another stage is weighed "
        "over: it is made when the time it saves in that span exceeds its stall (default: "
        "1000 failure-free periods of the job; 0: only into a stage left empty)")
    elastic_snapshots: bool = _opt(
        True, "the jobs' runs keep peer-memory snapshots (`recycle train --snapshot-every`, "
        "on by default): a stage that loses every worker is restored from its snapshot "
        "instead of halting the job; --no-elastic-snapshots for runs with them off (a run "
        "whose auto K turns out off says so in its progress)")
    elastic_disk: bool = _opt(
        True, "the jobs' runs also restore a stage that loses every worker from a disk "
        "checkpoint or their start (`recycle train` always can): with snapshots off such a "
        "loss rolls the job back instead of halting it; --no-elastic-disk for runs that "
        "cannot (their checkpoint directory unreadable from some host, and resumed)")
    log_level: str = _opt("info", ", ".join(LOG_LEVELS))


HELP = {f.name: f.metadata["help"] for f in fields(ServeOptions)}


def _positive(flag: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} must be a positive number of seconds, not {value:g}")


def check_serve_options(o: ServeOptions) -> tuple[str, ...]:
    """One-line UserError for an option the service would misuse; the solver list."""
    from api.jobs.runtime import ServiceConfig
    from api.storage.sqlite_store import check_database
    from planner.solvers.backends import BACKENDS

    if not 0 <= o.port <= 65535:
        raise UserError(f"--port must be 0..65535, not {o.port}")
    _positive("--heartbeat-timeout", o.heartbeat_timeout)
    if o.suspect_grace is not None:
        _positive("--suspect-grace", o.suspect_grace)
    _positive("--cpsat-time-limit", o.cpsat_time_limit)
    limit = ServiceConfig.max_failures_limit
    if not 0 <= o.max_failures <= limit:
        raise UserError(f"--max-failures must be 0..{limit}, not {o.max_failures}")
    if o.solver_workers < 1:
        raise UserError(f"--solver-workers must be at least 1, not {o.solver_workers}")
    if o.speed_window < 0:
        raise UserError(f"--speed-window must be 0 (off) or more, not {o.speed_window}")
    if o.elastic_horizon is not None and not (math.isfinite(o.elastic_horizon)
                                              and o.elastic_horizon >= 0):
        raise UserError(f"--elastic-horizon must be 0 or a positive number of time units, "
                        f"not {o.elastic_horizon:g}")
    names = tuple(s.strip() for s in o.solvers.split(",") if s.strip())
    if not names:
        raise UserError(f"--solvers {o.solvers!r} names no back-end; choose from "
                        f"{', '.join(BACKENDS)}")
    bad = [s for s in names if s not in BACKENDS]
    if bad:
        raise UserError(f"--solvers: unknown back-end {bad[0]!r}; choose from "
                        f"{', '.join(BACKENDS)}")
    if o.log_level.lower() not in LOG_LEVELS:
        raise UserError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, "
                        f"not {o.log_level!r}")
    from api.storage.postgres_store import check_reachable, is_postgres
    if not is_postgres(o.db):
        check_database(o.db)
    elif (why := check_reachable(o.db)) is not None:
        raise UserError(f"--db: cannot reach PostgreSQL: {why}")
    return names


def run_service(o: ServeOptions, solver_list: tuple[str, ...]) -> None:
    """Serve until stopped; `solver_list` is what check_serve_options(o) returned."""
    from api.app import create_app
    from api.storage.postgres_store import is_postgres

    log_level = o.log_level.lower()
    logging.basicConfig(level=log_level.upper() if log_level != "trace" else 5,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    db = o.db if is_postgres(o.db) else os.path.abspath(o.db)
    app = create_app(db, o.admin_token, o.heartbeat_timeout, o.max_failures,
                     solvers=solver_list, cpsat_time_limit_s=o.cpsat_time_limit,
                     solver_workers=o.solver_workers, suspect_grace_s=o.suspect_grace,
                     speed_window=o.speed_window, elastic_horizon=o.elastic_horizon,
                     elastic_snapshots=o.elastic_snapshots, elastic_disk=o.elastic_disk)
    Server(app, host=o.host, port=o.port, log_level=log_level, access_log=False,
           timeout_graceful_shutdown=5).run()
