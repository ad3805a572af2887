"""The long-poll fast path: plan GETs answered without FastAPI's routing and validation.

When a plan changes, every parked long-poll of the job answers at once and is sent again
at once (one per worker: hundreds). Through FastAPI each costs some hundreds of
microseconds of routing, dependency solving and middleware. The app hands every request here
first (api.app.App, before any middleware); this answers the common, well-formed case:

    GET /v1/jobs/{id}/plan?after=V&wait=S
    GET /v1/jobs/{id}/workers/{replica}/{stage}/plan?after=V&wait=S[&incarnation=K]
    GET /v1/jobs/{id}/nodes/{node}/plan?after=V&wait=S&workers_per_node=K
    POST /v1/jobs/{id}/heartbeats, POST /v1/jobs/{id}/nodes/{node}/heartbeats

with a valid token for that job (or the admin token), a known job and worker, and plain
numbers in range. Anything else (no or bad token, bad or extra parameters, a halted job
before the wait) goes on to FastAPI unchanged, so errors are exactly those of
api/routes/plans.py, api/routes/workers.py and api/nodes/routes.py (a heartbeat body that
does not validate is replayed to FastAPI, which words the 422); the answers here are byte
for byte the ones those routes give.
"""
from __future__ import annotations

import re
from typing import Optional

from pydantic import ValidationError
from starlette.responses import JSONResponse

from api.hotpath.encode import whole_plan
from api.hotpath.views import node_cells, node_view, superseded, worker_view
from api.jobs.runtime import ApiError

PATH = re.compile(r"/v1/jobs/([^/]+)(?:/workers/(\d{1,7})/(\d{1,7}))?/plan")
NODE_PATH = re.compile(r"/v1/jobs/([^/]+)/nodes/(\d{1,7})/plan")
BEAT_PATH = re.compile(r"/v1/jobs/([^/]+)(?:/nodes/(\d{1,7}))?/heartbeats")
MAX_BEAT_BODY = 1 << 16  # larger bodies go the long way (BodyLimit and all)
# The query parameters each fast route reads, by FastAPI's path template: a request with
# any other goes to FastAPI. tests/test_fastpath_routes.py checks these templates and
# parameters against the routes themselves (api/routes/, api/nodes/routes.py), and the
# patterns above against the templates, so the two paths cannot drift apart.
JOB_PLAN = "/v1/jobs/{job_id}/plan"
WORKER_PLAN = "/v1/jobs/{job_id}/workers/{replica}/{stage}/plan"
NODE_PLAN = "/v1/jobs/{job_id}/nodes/{node}/plan"
QUERY = {JOB_PLAN: {"after", "wait"}, WORKER_PLAN: {"after", "wait", "incarnation"},
         NODE_PLAN: {"after", "wait", "workers_per_node"}}
BEATS = ("/v1/jobs/{job_id}/heartbeats", "/v1/jobs/{job_id}/nodes/{node}/heartbeats")
INT = re.compile(r"-?\d{1,16}")
NUM = re.compile(r"\d{1,6}(?:\.\d{1,9})?")


def _query(qs: bytes) -> Optional[tuple]:
    """(after, wait, incarnation, workers_per_node, the names given) if the query string
    has only those, as plain numbers in range."""
    after, wait, incarnation, per_node = None, 0.0, None, None
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
        elif key == "workers_per_node" and INT.fullmatch(value) and 1 <= int(value) <= 4096:
            per_node = int(value)
        else:
            return None
    return after, wait, incarnation, per_node, seen


class FastPlans:
    """Called by the app (api.app.App) before FastAPI sees a request; `root` is the app."""

    def __init__(self, root):
        self.root = root

    async def handle(self, scope, receive, send):
        """Answer the request if it is a plain plan GET or a well-formed heartbeat (True);
        otherwise the `receive` FastAPI must read the request from (a heartbeat's body,
        once read here, is replayed)."""
        if scope["type"] != "http":
            return receive
        if scope["method"] == "POST":
            return await self._beat(scope, receive, send)
        if scope["method"] != "GET":
            return receive
        m = PATH.fullmatch(scope["path"])
        if m is not None:
            req = self._accept(scope, m)
        else:
            m = NODE_PATH.fullmatch(scope["path"])
            req = self._accept_node(scope, m) if m is not None else None
        if req is None:
            return receive
        await self._answer(scope, send, *req)
        return True

    async def _beat(self, scope, receive, send):
        """POST .../heartbeats and .../nodes/{n}/heartbeats: the same models, checks and
        answers as api/routes/workers.py and api/nodes/routes.py, without FastAPI's routing
        and dependency solving (thousands a second at scale)."""
        m = BEAT_PATH.fullmatch(scope["path"])
        if m is None or scope["query_string"]:
            return receive
        length, ctype = None, b"application/json"
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                ctype = value
        if not ctype.startswith(b"application/json") or length is None or not length.isdigit() or int(length) > MAX_BEAT_BODY:
            return receive
        got = self._job(scope, m)
        if got is None:
            return receive
        svc, job, _ = got
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return receive  # the client went away: let the app see it too
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)

        async def replay():
            return {"type": "http.request", "body": body, "more_body": False}

        from api.nodes.beat import node_beat, worker_beat
        from api.nodes.models import NodeBeatIn
        from api.models import HeartbeatIn
        try:
            if m.group(2) is None:
                answer = await worker_beat(svc, job, HeartbeatIn.model_validate_json(body))
            else:
                answer = await node_beat(svc, self.root.state.nodes, job, int(m.group(2)),
                                         NodeBeatIn.model_validate_json(body))
        except ValidationError:
            return replay  # FastAPI words the 422
        except ApiError as err:  # as the ApiError handler answers it
            answer = JSONResponse({"detail": err.detail, **err.extra}, err.status)
            await answer(scope, None, send)
            return True
        await JSONResponse(answer)(scope, None, send)
        return True

    def _job(self, scope, m):
        """(service, job, query) for a running job and a token that may read it."""
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
        return svc, job, query

    def _accept_node(self, scope, m):
        got = self._job(scope, m)
        if got is None:
            return None
        svc, job, (after, wait, _, per_node, seen) = got
        node = int(m.group(2))
        if not seen <= QUERY[NODE_PLAN] or per_node is None or \
                node_cells(job, node, per_node) is None:
            return None
        return svc, job, ("node", node, per_node), after, wait, None

    def _accept(self, scope, m):
        got = self._job(scope, m)
        if got is None:
            return None
        svc, job, query = got
        if not query[4] <= QUERY[JOB_PLAN if m.group(2) is None else WORKER_PLAN]:
            return None  # a parameter the route does not read (FastAPI ignores it)
        worker = None
        if m.group(2) is not None:
            worker = (int(m.group(2)), int(m.group(3)))
            if not (worker[0] < job.spec.replicas and worker[1] < job.spec.stages):
                return None
        return svc, job, worker, *query[:3]

    async def _answer(self, scope, send, svc, job, worker, after, wait, incarnation):
        node, worker = (worker[1:], None) if worker and worker[0] == "node" else (None, worker)
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
        if node is None and worker is None:  # the whole plan: maybe gzip-compressed
            accept = next((v.decode("latin-1") for k, v in scope["headers"]
                           if k == b"accept-encoding"), None)
            body, headers = await whole_plan(job.plan_bytes, version, accept)
        else:
            body = node_view(job, *node) if node is not None else worker_view(job, *worker)
            headers = [(b"etag", f'"v{version}"'.encode()), (b"cache-control", b"no-store"),
                       (b"content-length", str(len(body)).encode()),
                       (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
