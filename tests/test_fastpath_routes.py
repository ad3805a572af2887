"""api/fastpath.py answers some requests without FastAPI: its routes and the query
parameters it reads must be FastAPI's own (api/routes/, api/nodes/routes.py), and its
patterns must match exactly those paths, so the two cannot drift apart."""
import re

from api import fastpath
from api.app import create_app


def _routes(tmp_path) -> dict:
    """(METHOD, path template) -> the names of its query parameters, from the app's own
    OpenAPI schema (what FastAPI routes and validates)."""
    app = create_app(str(tmp_path / "svc.db"), "admin-token-for-tests-0123456789",
                     precompute_failures=0)
    return {(method.upper(), path): {p["name"] for p in op.get("parameters", ())
                                     if p["in"] == "query"}
            for path, ops in app.openapi()["paths"].items() for method, op in ops.items()}


def _sample(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: "abc123" if m.group(1) == "job_id" else "7", template)


def test_every_fast_route_is_a_route_of_the_app_with_the_same_query_parameters(tmp_path):
    routes = _routes(tmp_path)
    for template, params in fastpath.QUERY.items():
        assert ("GET", template) in routes, f"fastpath answers GET {template}, not a route"
        assert routes[("GET", template)] == params, template
    for template in fastpath.BEATS:
        assert routes.get(("POST", template)) == set(), template


def test_the_fast_patterns_match_their_routes_and_no_other(tmp_path):
    patterns = {fastpath.JOB_PLAN: fastpath.PATH, fastpath.WORKER_PLAN: fastpath.PATH,
                fastpath.NODE_PLAN: fastpath.NODE_PATH}
    patterns.update({t: fastpath.BEAT_PATH for t in fastpath.BEATS})
    for template, pattern in patterns.items():
        assert pattern.fullmatch(_sample(template)), template
    mine = set(patterns)
    for method, template in _routes(tmp_path):
        if template not in mine:
            for pattern in (fastpath.PATH, fastpath.NODE_PATH, fastpath.BEAT_PATH):
                assert not pattern.fullmatch(_sample(template)), (method, template)
