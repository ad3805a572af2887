"""Schemathesis fuzzing of every operation in the OpenAPI schema, against a real server.

Run 1, without valid credentials (no token, a forged one, another job's): every guarded
operation answers 401/403 and the database is byte-for-byte unchanged afterwards.
Run 2, with valid tokens: no 5xx, every 4xx carries a one-line reason, responses match
the schema, and nothing is stored except what was acknowledged (the untouched job's rows
are unchanged, and the fuzzed job holds exactly the events and speed events that got a
200, plus any the straggler detector posted itself).
"""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, negative_data_rejection,
                                 not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from api.jobs.runtime import ServiceConfig
from api_support import ThreadServer, admin_headers, spec

LIMIT = ServiceConfig().max_body_bytes



def settings_for(examples: int):
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]


pytestmark = pytest.mark.procs  # its server runs in a process of its own


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    db = tmp_path_factory.mktemp("fuzz") / "service.db"
    with ThreadServer(db, heartbeat_timeout_s=120, precompute_failures=0, max_wait_s=0.05,
                      max_grid=256, max_failures_limit=1) as s:
        c = httpx.Client(base_url=s.url, headers=admin_headers(), timeout=10)
        target = c.post("/v1/jobs", json=spec(D=8, S=2, M=2)).json()
        other = c.post("/v1/jobs", json=spec(D=2, S=2, M=2)).json()
        c.post(f"/v1/jobs/{other['id']}/events",
               json={"event_id": "keep", "kind": "failure", "replica": 1, "stage": 0})
        schema = schemathesis.openapi.from_url(s.url + "/openapi.json")
        yield s, c, schema, target, other


def operations(schema):
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 13
    return ops


def one_line_reason(resp) -> None:
    if 400 <= resp.status_code < 500:
        detail = resp.json()["detail"]
        assert isinstance(detail, str) and detail and "\n" not in detail, resp.text
        assert "Traceback" not in detail


def refused(status: int, sent: int) -> bool:
    """How a guarded operation answers a request without valid credentials: 401/403, or
    413 for a body over the limit, which the service refuses before it reads anything,
    credentials included (api/app.py BodyLimit)."""
    return status in (401, 403) or (status == 413 and sent > LIMIT)


def fuzz(op, target_id, headers_list, on_response, mode, examples):
    """Fuzz `op` once per header set; the headers are fixed into the strategy, so the
    negative mode breaks the parameters and body, not our credentials."""
    path = {"job_id": target_id} if "{job_id}" in op.path else None
    for headers in headers_list:
        @settings_for(examples)
        @given(case=op.as_strategy(generation_mode=mode, path_parameters=path,
                                   headers=headers or None))
        def run(case):
            if not headers:
                for key in list(case.headers or {}):
                    if key.lower() == "authorization":
                        del case.headers[key]
            resp = case.call()
            assert resp.status_code < 500, f"{op.label}: {resp.status_code} {resp.text}"
            on_response(op, case, resp)

        try:
            run()
        except Unsatisfiable:
            # nothing to break in an operation without parameters or body
            assert mode == GenerationMode.NEGATIVE, op.label


def test_fuzz_without_valid_credentials(env):
    server, _, schema, target, other = env
    before = server.service.store.snapshot()

    headers = [{}, {"Authorization": "Bearer forged"},
               {"Authorization": f"Bearer {target['id']}.forged"},
               {"Authorization": f"Bearer {other['token']}"}]

    def check(op, case, resp):
        if "x-auth" in op.definition.raw:
            sent = len(resp.request.body or b"")
            assert refused(resp.status_code, sent), f"{op.label}: {resp.status_code} ({sent} B)"
            one_line_reason(resp)

    for op in operations(schema):
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(op, target["id"], headers, check, mode, examples=12)
    assert server.service.store.snapshot() == before


def test_an_oversized_body_without_credentials_is_refused_unread(env):
    """The fuzz once sent a node event of over 1 MiB with a forged token: 413, which the
    check took for a guarded operation let through. It is refused before anything is read."""
    server, _, _, target, _ = env
    before = server.service.store.snapshot()
    body = b'{"event": "add", "nodes": ["' + b"x" * LIMIT + b'"]}'
    r = httpx.post(f"{server.url}/v1/jobs/{target['id']}/nodes", content=body, timeout=10,
                   headers={"Authorization": f"Bearer {target['id']}.forged",
                            "Content-Type": "application/json"})
    assert r.status_code == 413 and refused(r.status_code, len(body)), r.text
    one_line_reason(r)
    assert not refused(413, LIMIT)  # a 413 for a body within the limit is no refusal
    assert server.service.store.snapshot() == before


def test_fuzz_with_valid_tokens(env):
    server, c, schema, target, other = env
    store = server.service.store
    protected = {t: [r for r in rows if other["id"] in r] for t, rows in store.snapshot().items()}
    acked, created = set(), set()

    headers = [admin_headers(), {"Authorization": f"Bearer {target['token']}"}]

    def check(op, case, resp):
        case.validate_response(resp, checks=CHECKS)
        one_line_reason(resp)
        if op.path.endswith(("/events", "/speeds", "/nodes")) and op.method.upper() == "POST" \
                and resp.status_code == 200:
            acked.add(resp.json()["event_id"])
        if op.path == "/v1/jobs" and op.method.upper() == "POST" and resp.status_code == 201:
            created.add(resp.json()["id"])

    for op in operations(schema):
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(op, target["id"], headers, check, mode, examples=25)
    print(f"fuzz: {len(acked)} events accepted, {len(created)} jobs registered")
    after = store.snapshot()
    assert {t: [r for r in rows if other["id"] in r] for t, rows in after.items()} == protected
    # every event stored was acknowledged, but for the straggler detector's own (fuzzed
    # heartbeats may carry compute times)
    assert {r[2] for r in after["events"] if r[1] == target["id"] and r[6] != "detector"} \
        == acked
    assert {r[0] for r in after["jobs"]} == {target["id"], other["id"]} | created
    assert httpx.get(server.url + "/healthz").status_code == 200
