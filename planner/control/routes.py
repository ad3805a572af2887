"""The plan service's HTTP routes, declared once, for the service and its clients alike.

Each route is its method, its path template, the bounds of the numbers in its path and
query, and whether it long-polls. The service (api/) serves exactly these: its FastAPI
routes take their paths from here (`under`), its fast path matches and parses with them
(api/hotpath/endpoints.py adds the body, auth and documented errors). The clients
(executor/sources/http_source.py, the node agent and its local channel, the demo and
chaos runs) build every request with `url`, and the node agent's local channel routes
its workers' requests with `match`. tests/test_service_routes.py checks that the service
serves each one and that no client spells a path of its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

REQUIRED = ...  # a query parameter without a default (FastAPI's spelling)
MAX_VERSION = 2**53  # plan versions stay exact in any JSON reader
MAX_WAIT_S = 3600  # a long-poll's `wait`; the server caps it further (max_wait_s)
MAX_INDEX = 1_000_000  # a replica's, stage's or node's number (in bodies and paths alike)
MAX_INCARNATION = 2**31
MAX_PER_NODE = 4096  # workers per node, claimed in a body and named in the plan's query


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


AFTER = Number(int, -1, MAX_VERSION, None, "return only a version newer than this")
WAIT = Number(float, 0, MAX_WAIT_S, 0.0, "seconds to wait for a newer version (long-poll; "
                                         "capped by the server's max wait)")
INCARNATION = Number(int, 1, MAX_INCARNATION, None,
                     "the caller's incarnation: an older one than the version admits is "
                     "answered 409 (it must stop)")
PER_NODE = Number(int, 1, MAX_PER_NODE, REQUIRED, "as claimed")
INDEX = Number(int, 0, MAX_INDEX)  # a replica or a stage
NODE = Number(int, 0, MAX_INDEX, description="the node's rank (torchrun's --node-rank)")
VERSION = Number(int, 0, MAX_VERSION, description="a plan version")


@dataclass(frozen=True, eq=False)
class Route:
    method: str
    template: str                  # FastAPI's path template; {job_id} is any one segment
    path: dict[str, Number] = field(default_factory=dict)  # the numbers in the path
    query: dict[str, Number] = field(default_factory=dict)
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

    def url(self, **values) -> str:
        """The path with its parameters filled in: JOB_PLAN.url(job_id="j1")."""
        names = set(re.findall(r"\{(\w+)\}", self.template))
        if names != set(values):
            raise TypeError(f"{self.template} takes {sorted(names)}, not {sorted(values)}")
        return self.template.format(**{k: str(v) for k, v in values.items()})

    def match(self, path: str) -> Optional[dict]:
        """The path's parameters (job_id a str) if `path` is this route's with its
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
        """The query's values (defaults filled in) if it names only this route's
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


_JOB = "/v1/jobs/{job_id}"
_NODE = _JOB + "/nodes/{node}"
JOBS = Route("POST", "/v1/jobs")
# a worker's (or its node agent's local channel's)
JOB_PLAN = Route("GET", _JOB + "/plan", query={"after": AFTER, "wait": WAIT}, long_poll=True)
WORKER_PLAN = Route("GET", _JOB + "/workers/{replica}/{stage}/plan",
                    {"replica": INDEX, "stage": INDEX},
                    {"after": AFTER, "wait": WAIT, "incarnation": INCARNATION}, long_poll=True)
PLAN_VERSION = Route("GET", _JOB + "/plans/{version}", {"version": VERSION})
WORKER_BEAT = Route("POST", _JOB + "/heartbeats")
SUSPECTS = Route("POST", _JOB + "/suspects")
PROGRESS = Route("POST", _JOB + "/progress")
# a job's events, the coordinator's and the node agents'
JOB = Route("GET", _JOB)
EVENTS = Route("POST", _JOB + "/events")
EVENT_LOG = Route("GET", _JOB + "/events")
NODES = Route("POST", _JOB + "/nodes")
FINISH = Route("POST", _JOB + "/finish")
# a node agent's
NODE_PLAN = Route("GET", _NODE + "/plan", {"node": NODE},
                  {"after": AFTER, "wait": WAIT, "workers_per_node": PER_NODE},
                  long_poll=True)
NODE_BEAT = Route("POST", _NODE + "/heartbeats", {"node": NODE})
NODE_ATTACH = Route("POST", _NODE + "/attach", {"node": NODE})
NODE_DETACH = Route("POST", _NODE + "/detach", {"node": NODE})

CLIENTS = (JOBS, JOB_PLAN, WORKER_PLAN, PLAN_VERSION, WORKER_BEAT, SUSPECTS, PROGRESS, JOB,
           EVENTS, EVENT_LOG, NODES, FINISH, NODE_PLAN, NODE_BEAT, NODE_ATTACH, NODE_DETACH)
