"""The fast path (api/fastpath.py) and the FastAPI routes answer the hot endpoints from one
declaration each (api/hotpath/endpoints.py). Here: every declaration is its route's own
(path, bounds, defaults, token, body and documented statuses, as the app's OpenAPI schema
has them), its pattern matches its route's paths and no other, and through a real server
every request at a declared bound and just past it, with and without a good token, gets
the same status, bytes and headers with the fast path on and bypassed; the fast path
answers the successes itself, and what is past a bound is the routes' one-line 422."""
from __future__ import annotations

import re

import httpx
import pytest

from api.app import create_app
from api.hotpath.endpoints import (HOT, JOB_PLAN, NODE_BEAT, NODE_PLAN, REQUIRED, WORKER_BEAT,
                                   WORKER_PLAN)
from api_support import ThreadServer, admin_headers, register_job

# The request each endpoint is varied from, one number at a time: (path numbers, query,
# body). Every one of them the fast path answers (the job below has 4 x 4 workers).
BASE = {
    JOB_PLAN: ({}, {"after": -1, "wait": 0}, None),
    WORKER_PLAN: ({"replica": 1, "stage": 2}, {"after": -1, "wait": 0, "incarnation": 1}, None),
    NODE_PLAN: ({"node": 0}, {"after": -1, "wait": 0, "workers_per_node": 4}, None),
    WORKER_BEAT: ({}, {}, {"replica": 1, "stage": 2, "iteration": 0}),
    NODE_BEAT: ({"node": 0}, {}, {"agent_id": "a", "workers_per_node": 4,
                                  "workers": [{"replica": 0, "stage": 0, "iteration": 0}]}),
}
HEADERS = ("content-type", "content-length", "etag", "cache-control", "content-encoding",
           "www-authenticate")


def _openapi(tmp_path) -> dict:
    app = create_app(str(tmp_path / "svc.db"), "admin-token-for-tests-0123456789",
                     precompute_failures=0)
    return app.openapi()["paths"]


def _number(param: dict) -> tuple:
    """(type, minimum, maximum, required, default) of an OpenAPI parameter."""
    schema = param["schema"]
    one = next(s for s in schema.get("anyOf", [schema]) if s.get("type") != "null")
    return (one["type"], one.get("minimum"), one.get("maximum"), param["required"],
            schema.get("default"))


def _declared(num, required: bool) -> tuple:
    default = None if num.default is REQUIRED else num.default
    return ({int: "integer", float: "number"}[num.kind], num.ge, num.le, required, default)


def _sample(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: "abc123" if m.group(1) == "job_id" else "7", template)


def test_every_declaration_is_its_route_s_own(tmp_path):
    paths = _openapi(tmp_path)
    assert set(BASE) == set(HOT), "every hot endpoint needs a request to vary"
    for ep in HOT:
        op = paths.get(ep.template, {}).get(ep.method.lower())
        assert op is not None, f"the fast path answers {ep.method} {ep.template}: no route"
        assert op["x-auth"] == ep.auth, ep.template
        params = {p["name"]: p for p in op["parameters"]}
        assert params.pop("job_id")["schema"]["type"] == "string"
        got = {(p["in"], name): _number(p) for name, p in params.items()}
        want = {("path", n): _declared(v, True) for n, v in ep.path.items()}
        want.update({("query", n): _declared(v, v.default is REQUIRED)
                     for n, v in ep.query.items()})
        assert got == want, ep.template
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        assert (body and body["schema"]["$ref"].rsplit("/", 1)[1]) == \
            (ep.body and ep.body.__name__), ep.template
        assert set(op["responses"]) == {"200", *map(str, ep.errors),
                                        *(["204"] if ep.long_poll else [])}, ep.template


def test_the_patterns_match_their_routes_and_no_other(tmp_path):
    paths = _openapi(tmp_path)
    for ep in HOT:
        assert ep.match(_sample(ep.template)) is not None, ep.template
        for template in paths:
            if template != ep.template:
                assert ep.match(_sample(template)) is None, (ep.template, template)
    assert WORKER_PLAN.match("/v1/jobs/j/workers/1/2/plan") == {
        "job_id": "j", "replica": 1, "stage": 2}
    for bad in ("/v1/jobs/j/workers/-1/2/plan", "/v1/jobs/j/workers/1000001/2/plan",
                "/v1/jobs/j/workers/+1/2/plan", "/v1/jobs/j/workers/1/2/plan/",
                "/v1/jobs/j/x/workers/1/2/plan"):
        assert WORKER_PLAN.match(bad) is None, bad


def test_the_query_is_taken_only_when_plain_and_in_bounds():
    q = WORKER_PLAN.parse_query
    assert q(b"") == {"after": None, "wait": 0.0, "incarnation": None}
    assert q(b"after=-1&wait=3600&incarnation=2147483648") == {
        "after": -1, "wait": 3600.0, "incarnation": 2**31}
    for bad in (b"after=-2", b"wait=3600.001", b"incarnation=0", b"after=1&after=2", b"x=1",
                b"after", b"after=1&", b"after=0.5", b"wait=1e3", b"after=%31",
                b"incarnation=2147483649"):
        assert q(bad) is None, bad
    assert NODE_PLAN.parse_query(b"after=1") is None  # workers_per_node is required
    assert NODE_PLAN.parse_query(b"workers_per_node=4096")["workers_per_node"] == 4096


class Switch:
    """The app's fast path, on or bypassed; records whether it answered each request."""

    def __init__(self, fast):
        self.fast, self.on, self.answered = fast, True, False

    async def handle(self, scope, receive, send):
        self.answered = False
        if not self.on:
            return receive
        got = await self.fast.handle(scope, receive, send)
        self.answered = got is True
        return got


def _past(num, side: int):
    """Just past the bound on `side` (-1 below, +1 above)."""
    step = 1 if num.kind is int else 0.001
    return (num.ge - step) if side < 0 else (num.le + step)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    db = tmp_path_factory.mktemp("fastpath") / "s.db"
    with ThreadServer(db, precompute_failures=0, heartbeat_timeout_s=300.0) as srv:
        switch = Switch(srv.app.fast)
        srv.app.fast = switch
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10) as admin:
            jid, token = register_job(admin, D=4, S=4, M=4)
            _, other = register_job(admin, D=2, S=2, M=2)
        with httpx.Client(base_url=srv.url, timeout=10) as c:  # each request its own token
            yield switch, c, jid, token, other


def _both(served, ep, path, query, body, auth: str | None):
    """The answer with the fast path on and bypassed, checked equal; (response, whether the
    fast path answered it)."""
    switch, c, jid, _, _ = served
    url = ep.template.format(job_id=jid, **path)
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    headers = {} if auth is None else {"Authorization": auth}
    seen = []
    for on in (True, False):
        switch.on = on
        r = c.request(ep.method, url, json=body, headers=headers)
        seen.append((r, switch.answered))
    (fast, answered), (slow, _) = seen
    assert (fast.status_code, fast.content) == (slow.status_code, slow.content), (url, auth)
    for h in HEADERS:
        assert fast.headers.get(h) == slow.headers.get(h), (url, h)
    if fast.status_code >= 400:
        detail = fast.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail, (url, detail)
    return fast, answered


def test_fast_path_and_routes_answer_alike_at_every_bound_and_past_it(served):
    """For each declared number, at its bounds and one past each: same answers both ways;
    the successes come from the fast path, a value past a bound is the route's 422 (and
    without a token the 401 comes first, as the routes check the token first)."""
    _, _, _, token, _ = served
    mine = f"Bearer {token}"
    for ep in HOT:
        path, query, body = BASE[ep]
        r, answered = _both(served, ep, path, query, body, mine)
        assert r.status_code == 200 and answered, (ep.template, r.text)
        for where, nums in (("path", ep.path), ("query", ep.query)):
            for name, num in nums.items():
                for value, inside in ((num.ge, True), (num.le, True),
                                      (_past(num, -1), False), (_past(num, +1), False)):
                    p, q = dict(path), dict(query)
                    (p if where == "path" else q)[name] = value
                    r, answered = _both(served, ep, p, q, body, mine)
                    case = (ep.template, name, value, r.status_code, r.text[:200])
                    if inside:
                        assert r.status_code < 300 and answered or r.status_code == 422, case
                    else:
                        assert r.status_code == 422 and not answered, case
                        r, _ = _both(served, ep, p, q, body, None)
                        assert r.status_code == 401, case


def test_fast_path_and_routes_answer_alike_for_every_token_and_a_bad_body(served):
    _, _, _, token, other = served
    for ep in HOT:
        path, query, body = BASE[ep]
        for auth, status in ((None, 401), ("Bearer nope.x", 401), (f"Basic {token}", 401),
                             ("Bearer", 401), (f"Bearer {other}", 403),
                             (f"bearer  {token}", 200), (admin_headers()["Authorization"], 200)):
            r, answered = _both(served, ep, path, query, body, auth)
            assert r.status_code == status and answered == (status == 200), \
                (ep.template, auth, r.status_code)
        if body is not None:
            r, answered = _both(served, ep, path, query, {**body, "stage": -1, "x": 1},
                                f"Bearer {token}")
            assert r.status_code == 422 and not answered, r.text
