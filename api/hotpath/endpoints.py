"""The hot endpoints, each declared once: its path, the bounds of the numbers in its path
and query, the token it needs, its body and the statuses it documents.

The fast path (api/fastpath.py) matches and parses requests with these declarations and
the routes (api/routes/plans.py, api/routes/workers.py, api/nodes/routes.py) take their
paths, Path/Query bounds, auth and documented errors from them, so the two cannot disagree
on what is well-formed. The fast path only takes plainly spelled numbers within bounds and
passes anything else on to FastAPI, which then words the error (one line, as always).
tests/test_fastpath_routes.py sends every bound, and one past it, both ways.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import Path, Query

from api.models import MAX_INCARNATION, MAX_INDEX, Error, HeartbeatIn
from api.nodes.models import MAX_PER_NODE, NodeBeatIn

REQUIRED = ...  # a query parameter without a default (FastAPI's spelling)
MAX_VERSION = 2**53  # plan versions stay exact in any JSON reader
MAX_WAIT_S = 3600  # a long-poll's `wait`; the server caps it further (max_wait_s)


@dataclass(frozen=True)
class Number:
    """An int or float in a path or query, within [ge, le]; `default` for a query one."""
    kind: type
    ge: int
    le: int
    default: Any = REQUIRED
    description: Optional[str] = None
    plain: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # What the fast path takes: no more digits than the widest bound, a sign only where
        # negatives are allowed, a short fraction for floats; other spellings FastAPI reads.
        digits = len(str(max(abs(self.ge), abs(self.le))))
        text = ("-?" if self.ge < 0 else "") + rf"\d{{1,{digits}}}" + \
            (r"(?:\.\d{1,9})?" if self.kind is float else "")
        object.__setattr__(self, "plain", re.compile(text))

    def parse(self, text: str):
        """The value of `text` if it is plainly spelled and within bounds, else None."""
        if self.plain.fullmatch(text) is None:
            return None
        value = self.kind(text)
        return value if self.ge <= value <= self.le else None

    def query(self):
        return Query(self.default, ge=self.ge, le=self.le, description=self.description)

    def path(self):
        return Path(ge=self.ge, le=self.le, description=self.description)


AFTER = Number(int, -1, MAX_VERSION, None, "return only a version newer than this")
WAIT = Number(float, 0, MAX_WAIT_S, 0.0, "seconds to wait for a newer version (long-poll; "
                                         "capped by the server's max wait)")
INCARNATION = Number(int, 1, MAX_INCARNATION, None,
                     "the caller's incarnation: an older one than the version admits is "
                     "answered 409 (it must stop)")
PER_NODE = Number(int, 1, MAX_PER_NODE, REQUIRED, "as claimed")
INDEX = Number(int, 0, MAX_INDEX)  # a replica or a stage
NODE = Number(int, 0, MAX_INDEX, description="the node's rank (torchrun's --node-rank)")
NO_NEWER = {204: {"description": "no newer version within `wait` seconds"}}


@dataclass(frozen=True, eq=False)
class Endpoint:
    method: str
    template: str                  # FastAPI's path template; {job_id} is any one segment
    path: dict[str, Number]        # the numbers in the path
    query: dict[str, Number]
    errors: tuple[int, ...]        # the statuses documented with the Error model
    body: Optional[type] = None    # the pydantic model of the body
    auth: str = "job"              # api/security.py: the job's worker token, or the admin's
    long_poll: bool = False        # 204 when nothing newer came within `wait`
    pattern: re.Pattern = field(init=False, repr=False)
    defaults: dict = field(init=False, repr=False)  # of the optional query parameters
    required: frozenset = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "defaults", {n: v.default for n, v in self.query.items()
                                              if v.default is not REQUIRED})
        object.__setattr__(self, "required", frozenset(self.query) - set(self.defaults))

        def piece(part: str) -> str:  # a literal, or a named group for a {name}
            if not part.startswith("{"):
                return re.escape(part)
            name = part[1:-1]
            num = self.path.get(name)
            return f"(?P<{name}>{'[^/]+' if num is None else num.plain.pattern})"
        regex = "".join(map(piece, re.split(r"(\{\w+\})", self.template)))
        object.__setattr__(self, "pattern", re.compile(regex))

    def match(self, path: str) -> Optional[dict]:
        """The path's parameters (job_id a str) if `path` is this endpoint's with its
        numbers plainly spelled and within bounds, else None."""
        m = self.pattern.fullmatch(path)
        if m is None:
            return None
        args = m.groupdict()
        for name, num in self.path.items():  # the pattern has checked the spelling
            value = args[name] = num.kind(args[name])
            if not num.ge <= value <= num.le:
                return None
        return args

    def parse_query(self, qs: bytes) -> Optional[dict]:
        """The query's values (defaults filled in) if it names only this endpoint's
        parameters, each once, plainly spelled and within bounds, and every required one;
        else None (FastAPI ignores unknown ones, takes a repeated one's last value...)."""
        values = dict(self.defaults)
        seen = set()
        for part in qs.decode("latin-1").split("&") if qs else ():
            key, eq, text = part.partition("=")
            num = self.query.get(key)
            if num is None or not eq or key in seen or (value := num.parse(text)) is None:
                return None
            seen.add(key)
            values[key] = value
        return values if self.required <= seen else None

    def under(self, prefix: str) -> str:
        """The route's path below its router's `prefix`."""
        if not self.template.startswith(prefix):
            raise ValueError(f"{self.template} is not under {prefix}")
        return self.template[len(prefix):]

    @property
    def openapi_extra(self) -> dict:
        return {"x-auth": self.auth}

    def responses(self) -> dict:
        return {**{c: {"model": Error} for c in self.errors},
                **(NO_NEWER if self.long_poll else {})}


_ERRORS = (401, 403, 404, 409, 410, 413, 422)
JOB_PLAN = Endpoint("GET", "/v1/jobs/{job_id}/plan", {}, {"after": AFTER, "wait": WAIT},
                    (401, 403, 404, 410, 413, 422), long_poll=True)
WORKER_PLAN = Endpoint("GET", "/v1/jobs/{job_id}/workers/{replica}/{stage}/plan",
                       {"replica": INDEX, "stage": INDEX},
                       {"after": AFTER, "wait": WAIT, "incarnation": INCARNATION},
                       _ERRORS, long_poll=True)
NODE_PLAN = Endpoint("GET", "/v1/jobs/{job_id}/nodes/{node}/plan", {"node": NODE},
                     {"after": AFTER, "wait": WAIT, "workers_per_node": PER_NODE},
                     _ERRORS, long_poll=True)
WORKER_BEAT = Endpoint("POST", "/v1/jobs/{job_id}/heartbeats", {}, {}, _ERRORS,
                       body=HeartbeatIn)
NODE_BEAT = Endpoint("POST", "/v1/jobs/{job_id}/nodes/{node}/heartbeats", {"node": NODE},
                     {}, _ERRORS, body=NodeBeatIn)
HOT = (JOB_PLAN, WORKER_PLAN, NODE_PLAN, WORKER_BEAT, NODE_BEAT)
