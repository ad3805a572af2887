"""One HTTP declaration (planner/control/routes.py): the service serves every route its
clients call, with the method declared, and no client spells a path of its own (there
were 23 URL literals in the clients and a regex router in the node agent's channel)."""
import ast
import pathlib

import pytest

from planner.control import routes as R

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_service_serves_every_declared_route_with_its_method(tmp_path):
    from api.app import create_app
    app = create_app(str(tmp_path / "db.sqlite"), "admin-token")
    served = {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}
    missing = [f"{x.method} {x.template}" for x in R.CLIENTS
               if (x.method, x.template) not in served]
    assert not missing, missing


def _strings(tree):
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            docs.add(id(node.body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node


@pytest.mark.parametrize("part", ["executor", "recycle"])
def test_no_client_spells_a_service_path(part):
    spelled = []
    for path in sorted((ROOT / part).rglob("*.py")):
        for node in _strings(ast.parse(path.read_text())):
            if "/v1/" in node.value or node.value.startswith(("/v1", "/nodes", "/events",
                                                             "/heartbeats", "/suspects",
                                                             "/finish", "/plans")):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not spelled, "\n".join(spelled)


def test_a_route_fills_its_parameters_and_matches_only_its_own_paths():
    assert R.WORKER_PLAN.url(job_id="j1", replica=2, stage=0) == "/v1/jobs/j1/workers/2/0/plan"
    assert R.NODE_BEAT.url(job_id="j", node=3) == "/v1/jobs/j/nodes/3/heartbeats"
    with pytest.raises(TypeError, match="takes"):
        R.NODE_BEAT.url(job_id="j")
    assert R.WORKER_PLAN.match("/v1/jobs/j1/workers/2/0/plan") == \
        {"job_id": "j1", "replica": 2, "stage": 0}
    assert R.WORKER_PLAN.match("/v1/jobs/j1/workers/-2/0/plan") is None
    assert R.JOB_PLAN.match("/v1/jobs/j1/workers/2/0/plan") is None
    assert R.JOB_PLAN.parse_query(b"after=3&wait=1.5") == {"after": 3, "wait": 1.5}
    assert R.JOB_PLAN.parse_query(b"after=x") is None
    assert R.JOBS.url() == "/v1/jobs" and R.PLAN_VERSION.url(job_id="a", version=4) == \
        "/v1/jobs/a/plans/4"
