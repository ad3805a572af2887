"""The local channel between a node agent and its workers: a loopback HTTP server that
speaks the service's worker API (the subset workers use), so a worker talks to its agent
exactly as it would to the service (executor/sources/http_source.py), pointed there by
RECYCLE_AGENT.

  GET  /v1/jobs/{id}/plan?after=V&wait=S                 the whole plan (fetched once per
                                                          version per node)
  GET  /v1/jobs/{id}/workers/{r}/{s}/plan?after=V&wait=S  the worker's share, from the
                                                          node's share
  POST /v1/jobs/{id}/heartbeats                          kept; the agent sends them on
  POST /v1/jobs/{id}/suspects | events | finish           forwarded to the service as is

Requests need the job's token (the port is reachable by every local user). The routes
are the service's own declarations (planner/control/routes.py): matched, and their
queries read, as the service reads them.
"""
from __future__ import annotations

import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import urlsplit

from planner.control import routes as R

# a worker's requests the agent passes on to the service as they came
FORWARDED = (R.SUSPECTS, R.EVENTS, R.FINISH)

class NodeView(Protocol):
    """What the local channel needs of its node agent (agent.py): no import of it, so the
    two modules do not import each other."""
    job_id: str
    token: str
    node: str
    cells: set

    def local_plan(self, after, wait: float, worker) -> tuple: ...

    def local_beat(self, worker, body: bytes, pid) -> tuple: ...

    def forward(self, route, raw: bytes) -> tuple: ...

MAX_BODY = 1 << 20


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    agent: NodeView

    def log_message(self, fmt, *args):  # quiet: the agent logs what matters
        pass

    def _send(self, status: int, body: bytes = b"", version=None) -> None:
        self.send_response(status)
        if version is not None:
            self.send_header("ETag", f'"v{version}"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _error(self, status: int, detail: str, **extra) -> None:
        self._send(status, json.dumps({"detail": detail, **extra}).encode())

    def _route(self, routes: tuple):
        """(the declared route the request is, its parameters, its query) once the token
        is checked; None when it was answered with an error."""
        url = urlsplit(self.path)
        token = (self.headers.get("Authorization") or "").partition(" ")[2].strip()
        if not hmac.compare_digest(token.encode(), self.agent.token.encode()):
            self._error(401, "invalid token")
            return None
        for route in routes:
            args = route.match(url.path)
            if args is None:
                continue
            if args["job_id"] != self.agent.job_id:
                self._error(404, f"this agent serves job {self.agent.job_id} only")
                return None
            return route, args, url.query.encode("latin-1")
        self._error(404, f"no route {self.command} {url.path}")
        return None

    def do_GET(self):  # noqa: N802 - the stdlib's name
        got = self._route((R.JOB_PLAN, R.WORKER_PLAN))
        if got is None:
            return
        route, args, qs = got
        q = route.parse_query(qs)
        if q is None:
            return self._error(422, f"query: {', '.join(route.query)} as plain numbers "
                                    f"within bounds")
        worker = (args["replica"], args["stage"]) if route is R.WORKER_PLAN else None
        if worker is not None and worker not in self.agent.cells:
            return self._error(422, f"worker {worker[0]}:{worker[1]} is not on node "
                                    f"{self.agent.node}")
        status, body, version = self.agent.local_plan(q["after"], min(q["wait"], 60.0), worker,
                                                      self.headers.get("X-Recycle-Pid"))
        self._send(status, body, version)

    def do_POST(self):  # noqa: N802
        got = self._route((R.WORKER_BEAT, *FORWARDED))
        if got is None:
            return
        route = got[0]
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            return self._error(413, f"request body larger than {MAX_BODY} bytes")
        raw = self.rfile.read(n) if n else b""
        if route is R.WORKER_BEAT:
            try:
                body = json.loads(raw)
                w = (int(body["replica"]), int(body["stage"]))
            except (ValueError, KeyError, TypeError):
                return self._error(422, "heartbeat: replica and stage required")
            status, answer = self.agent.local_beat(w, body, self.headers.get("X-Recycle-Pid"))
            return self._send(status, json.dumps(answer).encode())
        status, answer = self.agent.forward(route, raw)
        return self._send(status, answer)


class LocalChannel:
    """The loopback server, in daemon threads (one per connection: a node has few)."""

    def __init__(self, agent: NodeView, port: int = 0):
        handler = type("Handler", (_Handler,), {"agent": agent})
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="agent-local")

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
