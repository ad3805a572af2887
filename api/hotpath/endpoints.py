"""The hot endpoints: the shared route declarations (planner/control/routes.py: path,
the bounds of the numbers in its path and query, long-poll) with what only the service
needs: the token it takes, its body and the statuses it documents.

The fast path (api/fastpath.py) matches and parses requests with these declarations and
the routes (api/routes/plans.py, api/routes/workers.py, api/nodes/routes.py) take their
paths, Path/Query bounds, auth and documented errors from them, so the two cannot disagree
on what is well-formed. The fast path only takes plainly spelled numbers within bounds and
passes anything else on to FastAPI, which then words the error (one line, as always).
tests/test_fastpath_routes.py sends every bound, and one past it, both ways.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fastapi import Path, Query

from api.models import Error, HeartbeatIn
from api.nodes.models import NodeBeatIn
from planner.control import routes as R
from planner.control.routes import (AFTER, INCARNATION, INDEX, NODE, PER_NODE,  # noqa: F401
                                    REQUIRED, VERSION, WAIT, Number, Route)

NO_NEWER = {204: {"description": "no newer version within `wait` seconds"}}


def query(num: Number):
    """The FastAPI Query of a declared number."""
    return Query(num.default, ge=num.ge, le=num.le, description=num.description)


def path(num: Number):
    """The FastAPI Path of a declared number."""
    return Path(ge=num.ge, le=num.le, description=num.description)


@dataclass(frozen=True, eq=False)
class Endpoint:
    route: Route
    errors: tuple[int, ...]        # the statuses documented with the Error model
    body: Optional[type] = None    # the pydantic model of the body
    auth: str = "job"              # api/security.py: the job's worker token, or the admin's

    def __post_init__(self):
        # the route's own, copied once: the fast path calls match and parse_query on every
        # request (a __getattr__ hop cost 1.2 us of 10 per match and parse)
        for name in ("method", "template", "path", "query", "long_poll", "defaults",
                     "required", "match", "parse_query", "under", "url"):
            object.__setattr__(self, name, getattr(self.route, name))

    @property
    def openapi_extra(self) -> dict:
        return {"x-auth": self.auth}

    def responses(self) -> dict:
        return {**{c: {"model": Error} for c in self.errors},
                **(NO_NEWER if self.route.long_poll else {})}


_ERRORS = (401, 403, 404, 409, 410, 413, 422)
JOB_PLAN = Endpoint(R.JOB_PLAN, (401, 403, 404, 410, 413, 422))
WORKER_PLAN = Endpoint(R.WORKER_PLAN, _ERRORS)
NODE_PLAN = Endpoint(R.NODE_PLAN, _ERRORS)
WORKER_BEAT = Endpoint(R.WORKER_BEAT, _ERRORS, body=HeartbeatIn)
NODE_BEAT = Endpoint(R.NODE_BEAT, _ERRORS, body=NodeBeatIn)
HOT = (JOB_PLAN, WORKER_PLAN, NODE_PLAN, WORKER_BEAT, NODE_BEAT)
