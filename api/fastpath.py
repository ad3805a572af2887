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
for byte the ones those routes give. Paths, bounds, tokens and bodies come from the
declarations the routes take theirs from (api/hotpath/endpoints.py), the shares' bytes
from api/hotpath/views.py, and the token check is the routes' (api/security.py).
"""
from __future__ import annotations

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from api.hotpath.encode import whole_plan
from api.hotpath.endpoints import JOB_PLAN, NODE_BEAT, NODE_PLAN, WORKER_BEAT, WORKER_PLAN
from api.hotpath.views import node_cells, node_view, superseded, worker_view
from api.jobs.runtime import ApiError
from api.nodes.beat import node_beat, worker_beat
from api.security import bearer_token

MAX_BEAT_BODY = 1 << 16  # larger bodies go the long way (BodyLimit and all)
BY_METHOD = {"GET": (JOB_PLAN, WORKER_PLAN, NODE_PLAN), "POST": (WORKER_BEAT, NODE_BEAT)}


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
        for ep in BY_METHOD.get(scope["method"], ()):
            args = ep.match(scope["path"])
            if args is not None:
                break
        else:
            return receive
        if ep.body is not None:
            return await self._beat(scope, receive, send, ep, args)
        req = self._accept(scope, ep, args)
        if req is None:
            return receive
        await self._answer(scope, send, *req)
        return True

    async def _beat(self, scope, receive, send, ep, args):
        """POST .../heartbeats and .../nodes/{n}/heartbeats: the same models, checks and
        answers as api/routes/workers.py and api/nodes/routes.py, without FastAPI's routing
        and dependency solving (thousands a second at scale)."""
        length, ctype = None, b"application/json"
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                ctype = value
        if not ctype.startswith(b"application/json") or length is None or not length.isdigit() or int(length) > MAX_BEAT_BODY:
            return receive
        got = self._job(scope, ep, args["job_id"])
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

        try:
            if ep is WORKER_BEAT:
                answer = await worker_beat(svc, job, ep.body.model_validate_json(body))
            else:
                answer = await node_beat(svc, self.root.state.nodes, job, args["node"],
                                         ep.body.model_validate_json(body))
        except ValidationError:
            return replay  # FastAPI words the 422
        except ApiError as err:  # as the ApiError handler answers it
            answer = JSONResponse({"detail": err.detail, **err.extra}, err.status)
            await answer(scope, None, send)
            return True
        await JSONResponse(answer)(scope, None, send)
        return True

    def _job(self, scope, ep, job_id: str):
        """(service, job, query values) for a running job, a query `ep` takes as it is and
        a token that may use `ep` on that job."""
        state = self.root.state
        svc = getattr(state, "service", None)
        query = ep.parse_query(scope["query_string"])
        if svc is None or query is None:
            return None
        job = svc.jobs.get(job_id)
        if job is None or job.state == "halted":
            return None
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        try:  # the routes' own check (AuthRoute); a refusal is theirs to answer
            state.auth.role(bearer_token(header and header.decode("latin-1")), ep.auth, job_id)
        except HTTPException:
            return None
        return svc, job, query

    def _accept(self, scope, ep, args):
        """The arguments of _answer for a plan GET the fast path can answer, else None."""
        got = self._job(scope, ep, args["job_id"])
        if got is None:
            return None
        svc, job, q = got
        worker = None
        if ep is WORKER_PLAN:
            worker = (args["replica"], args["stage"])
            if not (worker[0] < job.spec.replicas and worker[1] < job.spec.stages):
                return None
        elif ep is NODE_PLAN:
            worker = ("node", args["node"], q["workers_per_node"])
            if node_cells(job, *worker[1:]) is None:
                return None
        return svc, job, worker, q["after"], q["wait"], q.get("incarnation")

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
