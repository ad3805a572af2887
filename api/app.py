"""The FastAPI app factory: wiring of store, cache, service, monitor and precompute."""
from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import page
from api.routes import jobs as routes_jobs, ops as routes_ops, plans as routes_plans, workers as routes_workers
from api.fastpath import FastPlans
from api.hotpath.views import prebuilt_views
from api.heartbeats import Monitor
from api.metrics import Metrics
from api.nodes import routes as routes_nodes
from api.nodes.table import NodeTable
from api.precompute import BackgroundSolver, Precomputer
from api.security import Auth
from api.jobs.runtime import ApiError, ServiceConfig
from api.service import Service
from api.storage.postgres_store import open_cache, open_store

log = logging.getLogger("recycle.api")
VERSION = "0.1.0"


class BodyLimit:
    """413 for a body over `limit` bytes, by Content-Length or as it streams in."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            status = 413 if length.isdigit() else 400
            detail = (f"request body larger than {self.limit} bytes" if status == 413
                      else "bad Content-Length")
            return await JSONResponse({"detail": detail}, status)(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:  # FastAPI re-raises HTTPException from body reads
                    raise HTTPException(413, f"request body larger than {self.limit} bytes")
            return msg

        return await self.app(scope, limited, send)


INTERNAL = "internal error; see the service log"


class App(FastAPI):
    """FastAPI with the plan long-poll fast path (api/fastpath.py) in front of it all.

    It is also the last line against unexpected exceptions. Starlette answers one with our
    500 handler and then re-raises it, and uvicorn closes the connection on an exception
    that escapes the app, so a keep-alive client lost its connection (and the request it
    had pipelined) after a 500. Here an exception after a complete answer is dropped (it
    was logged by the handler); one before any answer (the fast path has no handler) gets
    the same JSON 500; only one in the middle of a body still reaches uvicorn, which must
    then close the connection (the client would otherwise wait for the rest)."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        state = {"started": False, "done": False}

        async def tracked(msg):
            if msg["type"] == "http.response.start":
                state["started"] = True
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                state["done"] = True
            await send(msg)

        try:
            got = await self.fast.handle(scope, receive, tracked)
            if got is not True:  # not for the fast path: `got` replays what it read
                await super().__call__(scope, got, tracked)
        except Exception:  # noqa: BLE001 - see the class docstring
            if state["done"]:
                return
            if state["started"]:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await JSONResponse({"detail": INTERNAL}, 500)(scope, receive, tracked)


def _one_line(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:3]:
        loc = ".".join(str(x) for x in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    more = len(exc.errors()) - 3
    return ("; ".join(parts) + (f" (+{more} more)" if more > 0 else "")).replace("\n", " ")[:500]


def _plain_pairs(node) -> None:
    """`[int, int]` pairs come out of pydantic as `prefixItems`; say `items` instead, which
    means the same when every position has one schema and which more tools understand."""
    if isinstance(node, dict):
        pre = node.get("prefixItems")
        if pre and "items" not in node and all(p == pre[0] for p in pre):
            node["items"] = node.pop("prefixItems")[0]
        for v in node.values():
            _plain_pairs(v)
    elif isinstance(node, list):
        for v in node:
            _plain_pairs(v)


def create_app(db_path: str, admin_token: Optional[str] = None,
               heartbeat_timeout_s: float = 10.0, precompute_failures: int = 2,
               *, cache_path: Optional[str] = None, config: Optional[ServiceConfig] = None,
               **overrides) -> FastAPI:
    """The service on SQLite file `db_path`, or on PostgreSQL at a postgresql:// URL
    (api/storage/postgres_store.py); the plan cache shares it unless `cache_path`.
    `overrides` set any ServiceConfig field (solvers, cpsat_time_limit_s, max_wait_s...)."""
    cfg = config or ServiceConfig(heartbeat_timeout_s=heartbeat_timeout_s,
                                  precompute_failures=precompute_failures, **overrides)
    if not admin_token:
        admin_token = secrets.token_urlsafe(24)
        log.warning("no admin token given; generated one: %s", admin_token)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store = await open_store(db_path, app)  # a PostgreSQL standby waits here
        cache = open_cache(cache_path or db_path, app, cfg.cache_memory_actions)
        svc = Service(store, cache, cfg, app.state.metrics)
        svc.load()
        bg = BackgroundSolver(cfg.solver_workers)
        svc.monitor, svc.precomputer = Monitor(svc), Precomputer(svc, bg)
        svc.prebuild = lambda job, plan: prebuilt_views(
            job, plan, app.state.nodes.per_node.get(job.id))
        app.state.service = svc
        bg.start()
        svc.monitor.start()
        for job in svc.jobs.values():  # resume unfinished precompute
            svc.precomputer.start(job)
        try:
            yield
        finally:
            await svc.monitor.stop()
            await svc.precomputer.stop()
            await bg.stop()
            cache.close()
            store.close()

    app = App(title="ReCycle plan service", version=VERSION, lifespan=lifespan,
              description="Failure events in, versioned plans out. See docs/api.md.")
    app.fast = FastPlans(app)
    app.state.metrics = Metrics()
    app.state.auth = Auth(admin_token, lambda job_id: app.state.service.token_hash(job_id))
    app.state.config = cfg
    app.state.nodes = NodeTable(cfg.heartbeat_timeout_s)
    for r in (routes_jobs, routes_plans, routes_workers, routes_ops, routes_nodes):
        app.include_router(r.router)
    page.register(app)  # the live cluster page: /, /jobs/{id}, /v1/page/...
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes)
    default_openapi = app.openapi

    def openapi():
        if app.openapi_schema is None:
            _plain_pairs(default_openapi())
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse({"detail": exc.detail, **exc.extra}, exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _one_line(exc)}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return JSONResponse({"detail": "body: not valid UTF-8 JSON"}, 422)
        return JSONResponse({"detail": str(exc.detail)}, exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": INTERNAL}, 500)

    return app
