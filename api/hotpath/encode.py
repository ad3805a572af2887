"""A plan's JSON, and the parts of it that shares carry, assembled from memoised pieces.

Plan.to_json serialises every action of every worker (17 ms at 4,096 workers, 53,000
actions), for every version, although a new version shares almost all its workers' action
lists with earlier ones (PlanCache shares equal parts, mapping.py maps a replica's workers
once). Here each list's JSON is made once and kept, keyed by the list's identity (the
entry keeps the list, so the id stays its own); a plan's JSON is pydantic's for everything
but the workers, with the workers' memoised JSON spliced in: byte for byte Plan.to_json
(tests/test_service_hotpath.py).
"""
from __future__ import annotations

import asyncio
import gzip
from collections import OrderedDict
from typing import Optional

from pydantic import TypeAdapter

from planner.plan import Action, Plan

ACTIONS = TypeAdapter(list[Action])  # pydantic's serialiser: as the plan's JSON has them
HEAD = {"format", "job", "failed", "version", "routes"}  # the fields before `workers`
TAIL = {"metrics", "solver", "incarnations", "roles", "moves", "partition"}  # and after


class JsonParts:
    """Memoised JSON of action lists and the micro-batches they touch (both made at first
    sight of a list, so a warm-up readies both); at most `limit` lists kept (all dropped at
    once beyond it)."""

    def __init__(self, limit: int = 400_000):
        self.limit = limit
        self._memo: dict[int, tuple[list, str, tuple]] = {}

    def _get(self, actions: list) -> tuple[list, str, tuple]:
        got = self._memo.get(id(actions))
        if got is None or got[0] is not actions:
            if len(self._memo) >= self.limit:
                self._memo = {}
            mbs = tuple({a.microbatch for a in actions if a.microbatch is not None})
            got = self._memo[id(actions)] = (actions, ACTIONS.dump_json(actions).decode(), mbs)
        return got

    def actions(self, actions: list) -> str:
        """ACTIONS.dump_json(actions), once per list."""
        return self._get(actions)[1]

    def microbatches(self, actions: list) -> tuple:
        """The micro-batches `actions` touch, once per list."""
        return self._get(actions)[2]

    def plan(self, plan: Plan) -> str:
        """plan.to_json(), the workers' actions from the memo."""
        head = plan.model_dump_json(include=HEAD)
        tail = plan.model_dump_json(include=TAIL)
        workers = ",".join([f'{{"replica":{w.replica},"stage":{w.stage},"actions":'
                            f'{self.actions(w.actions)}}}' for w in plan.workers])
        return f'{head[:-1]},"workers":[{workers}],{tail[1:]}'


PARTS = JsonParts()  # the service's (one process, one event loop)


# ---- whole plans, gzip-compressed once per version -------------------------------------
GZIP_MIN = 64 * 1024  # smaller bodies go as they are


def accepts_gzip(value: Optional[str]) -> bool:
    """Whether an Accept-Encoding header value admits gzip (`gzip` or `*`, not q=0)."""
    for item in (value or "").split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


class Gzipped:
    """Whole plans (2.9 MB at 4,096 workers) gzip-compressed once per body, for the clients
    that accept it: the executor's workers each take the whole plan of every version (through
    their node's agent: one fetch per node and version, 512 at 4,096 workers). Starlette's
    GZipMiddleware would compress every response anew; here the first request of a body
    compresses it in a thread (zlib releases the GIL) and every other one awaits and shares
    that. The newest `keep` bodies' compressed forms are kept."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._done: OrderedDict[int, tuple[bytes, bytes]] = OrderedDict()
        self._pending: dict[int, tuple[bytes, asyncio.Future]] = {}

    async def get(self, body: bytes) -> bytes:
        got = self._done.get(id(body))
        if got is not None and got[0] is body:
            return got[1]
        pending = self._pending.get(id(body))
        if pending is None or pending[0] is not body:
            fut = asyncio.ensure_future(asyncio.to_thread(gzip.compress, body, 1, mtime=0))
            pending = self._pending[id(body)] = (body, fut)
            fut.add_done_callback(lambda f, b=body: self._finish(b, f))
        return await asyncio.shield(pending[1])

    def _finish(self, body: bytes, fut: asyncio.Future) -> None:
        if self._pending.get(id(body), (None,))[0] is body:
            del self._pending[id(body)]
        if not fut.cancelled() and fut.exception() is None:
            self._done[id(body)] = (body, fut.result())
            while len(self._done) > self.keep:
                self._done.popitem(last=False)


GZIP = Gzipped()


async def whole_plan(body: bytes, version: int, accept: Optional[str]
                     ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A whole plan's response body and headers: gzip-compressed when the client accepts
    it and the body is large (its own ETag, as another representation), else as it is."""
    headers = [(b"cache-control", b"no-store"), (b"content-type", b"application/json")]
    if len(body) >= GZIP_MIN and accepts_gzip(accept):
        body = await GZIP.get(body)
        return body, [(b"etag", f'"v{version}-gzip"'.encode()), (b"content-encoding", b"gzip"),
                      (b"vary", b"accept-encoding"), *headers,
                      (b"content-length", str(len(body)).encode())]
    return body, [(b"etag", f'"v{version}"'.encode()), *headers,
                  (b"content-length", str(len(body)).encode())]
