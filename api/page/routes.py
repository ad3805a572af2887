"""The live cluster page: the HTML shell at `/` and `/jobs/{id}`, its static files, and its
two admin data routes (a snapshot, and a server-sent event stream of snapshots).

The shell carries no job data and is served to anyone; every byte of job data comes from
`/v1/page/...`, which needs the admin token in `Authorization: Bearer` (401 without one,
403 with a worker token). The browser keeps the token in sessionStorage and takes it from
a login box or the URL fragment (`#token=...`), which browsers never send to the server:
so the token is never in a URL that a server or proxy could log.

The stream is `fetch`ed (EventSource cannot send an Authorization header): one snapshot
at once, then one on every change of the job (the service's per-job wake-up, the same one
long-polls park on) and at least every `PUSH_S` seconds for the heartbeat ages.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from api.hotpath.encode import whole_plan
from api.page.view import history, job_view
from api.security import ADMIN, AuthRoute, bearer

STATIC = Path(__file__).with_name("static")
FILES = {"page.js": "text/javascript", "page.css": "text/css", "favicon.svg": "image/svg+xml"}
PUSH_S = 1.0      # heartbeat ages refresh at least this often
HISTORY_S = 5.0   # events and versions re-read at least this often (and on every change)
# Scripts from this origin only, none inline (styles may be inline): a token in this page can
# only go where page.js sends it.
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                      "style-src 'self' 'unsafe-inline'; "
                                      "frame-ancestors 'none'; base-uri 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store"}

shell = APIRouter(include_in_schema=False)
data = APIRouter(prefix="/v1/page", route_class=AuthRoute, dependencies=[Depends(bearer)],
                 include_in_schema=False)


def _file(name: str, media_type: str) -> Response:
    return Response((STATIC / name).read_bytes(), media_type=media_type, headers=HEADERS)


@shell.get("/")
async def index():
    return _file("index.html", "text/html; charset=utf-8")


@shell.get("/jobs/{job_id}")
async def job_page(job_id: str):
    return _file("index.html", "text/html; charset=utf-8")


@shell.get("/page/{name}")
async def static(name: str):
    if name not in FILES:
        raise HTTPException(404, f"no page file {name!r}")
    return _file(name, FILES[name])


@data.get("/jobs", openapi_extra=ADMIN)
async def jobs(request: Request):
    svc = request.app.state.service
    return [{"id": j.id, "state": j.state, "version": j.version,
             "replicas": j.spec.replicas, "stages": j.spec.stages, "failed": len(j.failed),
             "created": j.created} for j in svc.jobs.values()]


@data.get("/jobs/{job_id}/view", openapi_extra=ADMIN)
async def view(job_id: str, request: Request):
    svc = request.app.state.service
    job = svc.job(job_id)
    return job_view(svc, job, history(svc.store, job.id))


@data.get("/jobs/{job_id}/plan", openapi_extra=ADMIN)
async def plan(job_id: str, request: Request):
    """The plan in force, or the last one of a halted job: unlike /v1/jobs/{id}/plan this
    never answers 410, so a halt racing the page's fetch is not an error in the browser."""
    job = request.app.state.service.job(job_id)
    # gzip-compressed once per version, shared with the agents' fetches (api/hotpath)
    body, headers = await whole_plan(job.plan_bytes, job.version,
                                     request.headers.get("accept-encoding"))
    return Response(body, media_type="application/json", headers={
        k.decode(): v.decode() for k, v in headers
        if k in (b"cache-control", b"content-encoding", b"vary")})


@data.get("/jobs/{job_id}/live", openapi_extra=ADMIN)
async def live(job_id: str, request: Request):
    svc = request.app.state.service
    job = svc.job(job_id)  # 404 before the stream starts

    async def stream():
        hist, hist_at = None, 0.0
        changed = True
        while not svc.closing:
            wake = job.changed  # set (and replaced) by the next publish
            if changed or time.monotonic() - hist_at > HISTORY_S:
                hist, hist_at = history(svc.store, job.id), time.monotonic()
            body = json.dumps(job_view(svc, job, hist), separators=(",", ":"))
            yield f"event: view\ndata: {body}\n\n"
            try:
                await asyncio.wait_for(wake.wait(), PUSH_S)
                changed = True
            except asyncio.TimeoutError:
                changed = False

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
