"""The long-poll fast path: plan GETs answered without FastAPI's routing and validation.

When a plan changes, every parked long-poll of the job answers at once and is sent again
at once (one per worker: hundreds). Through FastAPI each costs some hundreds of
microseconds of routing, dependency solving and middleware. The app hands every request here
first (api.app.App, before any middleware); this answers the common, well-formed case:

    GET /v1/jobs/{id}/plan?after=V&wait=S
    GET /v1/jobs/{id}/workers/{replica}/{stage}/plan?after=V&wait=S[&incarnation=K]

with a valid token for that job (or the admin token), a known job and worker, and plain
numbers in range. Anything else (no or bad token, bad or extra parameters, a halted job
before the wait) goes on to FastAPI unchanged, so errors are exactly those of
api/routes/plans.py; the answers here are byte for byte the ones those routes give.
"""
from __future__ import annotations

import json
import re
from typing import Optional

from starlette.responses import JSONResponse

from api.service import ApiError

PATH = re.compile(r"/v1/jobs/([^/]+)(?:/workers/(\d{1,7})/(\d{1,7}))?/plan")
INT = re.compile(r"-?\d{1,16}")
NUM = re.compile(r"\d{1,6}(?:\.\d{1,9})?")


def _query(qs: bytes) -> Optional[tuple[Optional[int], float, Optional[int]]]:
    """(after, wait, incarnation) if the query string has only those, as plain numbers in
    range."""
    after, wait, incarnation = None, 0.0, None
    seen = set()
    for part in qs.decode("latin-1").split("&") if qs else ():
        key, eq, value = part.partition("=")
        if not eq or key in seen:
            return None
        seen.add(key)
        if key == "after" and INT.fullmatch(value) and -1 <= int(value) <= 2**53:
            after = int(value)
        elif key == "wait" and NUM.fullmatch(value) and float(value) <= 3600:
            wait = float(value)
        elif key == "incarnation" and INT.fullmatch(value) and 1 <= int(value) <= 2**31:
            incarnation = int(value)
        else:
            return None
    return after, wait, incarnation


def worker_view(job, replica: int, stage: int) -> bytes:
    """One worker's share of the current plan. The parts every worker shares (routes,
    metrics...) are serialised once per version; each worker adds its actions."""
    key = (replica, stage)
    if key not in job.views:
        if "_common" not in job.views:
            d = json.loads(job.plan_bytes)
            common = {"job_id": job.id, "version": d["version"], "failed": d["failed"],
                      "routes": d["routes"], "metrics": d["metrics"], "solver": d["solver"]}
            job.views["_common"] = json.dumps(common, separators=(",", ":"))[1:-1]
            job.views["_actions"] = {(w["replica"], w["stage"]): w["actions"]
                                     for w in d["workers"]}
            job.views["_incarnations"] = d.get("incarnations")
        actions = job.views["_actions"].get(key)
        grid = job.views["_incarnations"]
        head = json.dumps({"replica": replica, "stage": stage,
                           "in_plan": actions is not None,
                           "incarnation": grid[replica][stage] if grid else 1,
                           "actions": actions or []},
                          separators=(",", ":"))
        job.views[key] = (head[:-1] + "," + job.views["_common"] + "}").encode()
    return job.views[key]


def superseded(job, worker, incarnation: Optional[int]):
    """The 409 for a worker process older than the incarnation the plan admits, else None.
    A newer one gets the plan: it learns the version to wait after (its recovery event
    makes the next one admit it)."""
    if worker is None or incarnation is None:
        return None
    have = job.incarnation(*worker)
    if incarnation >= have:
        return None
    return ApiError(409, f"worker {worker[0]}:{worker[1]} incarnation {incarnation} is "
                         f"superseded by incarnation {have}; it must stop")


class FastPlans:
    """Called by the app (api.app.App) before FastAPI sees a request; `root` is the app."""

    def __init__(self, root):
        self.root = root

    async def handle(self, scope, send) -> bool:
        """Answer the request if it is a plain plan GET; False leaves it to FastAPI."""
        if scope["type"] != "http" or scope["method"] != "GET":
            return False
        m = PATH.fullmatch(scope["path"])
        req = self._accept(scope, m) if m is not None else None
        if req is None:
            return False
        await self._answer(scope, send, *req)
        return True

    def _accept(self, scope, m):
        state = self.root.state
        svc = getattr(state, "service", None)
        query = _query(scope["query_string"])
        if svc is None or query is None:
            return None
        job_id = m.group(1)
        job = svc.jobs.get(job_id)
        if job is None or job.state == "halted":
            return None
        token = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                token = token.strip() if scheme.lower() == "bearer" else None
                break
        if not token or not (state.auth.is_admin(token) or state.auth.worker_job(token) == job_id):
            return None
        worker = None
        if m.group(2) is not None:
            worker = (int(m.group(2)), int(m.group(3)))
            if not (worker[0] < job.spec.replicas and worker[1] < job.spec.stages):
                return None
        elif query[2] is not None:  # not a parameter of /plan: the route ignores it
            return None
        return svc, job, worker, *query

    async def _answer(self, scope, send, svc, job, worker, after, wait, incarnation):
        err, newer = superseded(job, worker, incarnation), False
        if err is None:
            newer = await svc.wait_newer(job, after, wait)
            err = job.halted_error() if job.state == "halted" else \
                superseded(job, worker, incarnation)
        if err is not None:  # as the ApiError handler answers it
            resp = JSONResponse({"detail": err.detail, **err.extra}, err.status)
            return await resp(scope, None, send)
        if not newer:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            return await send({"type": "http.response.body", "body": b""})
        version = job.version
        body = job.plan_bytes if worker is None else worker_view(job, *worker)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"etag", f'"v{version}"'.encode()), (b"cache-control", b"no-store"),
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
