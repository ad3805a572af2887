"""The coordinator's training progress at the service: POST /v1/jobs/{id}/progress (worker
token), what the live page's view holds of it and of a finished job, and ServiceWatch's
reports (rate-limited, the last iteration always) on a real uvicorn server on 127.0.0.1."""
from __future__ import annotations

import time

import httpx
import pytest

from api_support import ThreadServer, admin_headers, register_job, token_client


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("progress") / "service.db"
    with ThreadServer(db, precompute_failures=0) as s:
        yield s


def view(admin, job):
    r = admin.get(f"/v1/page/jobs/{job}/view")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_worker_token_reports_progress_and_the_view_has_it(server, admin):
    job, token = register_job(admin, D=2, S=2, M=4)
    assert view(admin, job)["progress"] is None
    with token_client(server.url, token) as worker:
        r = worker.post(f"/v1/jobs/{job}/progress",
                        json={"iteration": 7, "iterations": 20, "loss": 3.25,
                              "tokens_per_s": 1234.5})
        assert r.status_code == 200, r.text
        assert r.json() == {"state": "running", "iteration": 7}
    p = view(admin, job)["progress"]
    assert (p["iteration"], p["iterations"], p["loss"], p["tokens_per_s"]) == (7, 20, 3.25, 1234.5)
    assert abs(p["at"] - time.time()) < 30
    # another job's token, or none, is refused
    other, other_token = register_job(admin, D=2, S=2, M=4)
    body = {"iteration": 1, "loss": 1.0}
    assert httpx.post(f"{server.url}/v1/jobs/{job}/progress", json=body).status_code == 401
    with token_client(server.url, other_token) as c:
        assert c.post(f"/v1/jobs/{job}/progress", json=body).status_code == 403
    assert admin.post("/v1/jobs/nope/progress", json=body).status_code == 404


@pytest.mark.parametrize("body, where", [
    ({"iteration": -1, "loss": 1.0}, "iteration"),
    ({"iteration": "3", "loss": 1.0}, "iteration"),
    ({"iteration": 1.5, "loss": 1.0}, "iteration"),
    ({"iteration": 3}, "loss"),
    ({"iteration": 3, "loss": "1.0"}, "loss"),
    ({"iteration": 3, "loss": 1e31}, "loss"),
    ({"iteration": 3, "loss": 1.0, "tokens_per_s": -5}, "tokens_per_s"),
    ({"iteration": 3, "loss": 1.0, "iterations": 0}, "iterations"),
    ({"iteration": 3, "loss": 1.0, "iterations": 3}, "not below iterations 3"),
    ({"iteration": 3, "loss": 1.0, "extra": 1}, "extra"),
])
def test_bad_progress_is_a_one_line_422(server, admin, body, where):
    job, token = register_job(admin, D=1, S=2, M=2)
    with token_client(server.url, token) as worker:
        r = worker.post(f"/v1/jobs/{job}/progress", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert where in detail and "\n" not in detail
    assert view(admin, job)["progress"] is None


def test_non_finite_numbers_are_refused(server, admin):
    job, token = register_job(admin, D=1, S=2, M=2)
    with token_client(server.url, token) as worker:
        for raw in (b'{"iteration": 1, "loss": NaN}', b'{"iteration": 1, "loss": 1.0, '
                                                       b'"tokens_per_s": Infinity}'):
            r = worker.post(f"/v1/jobs/{job}/progress", content=raw,
                            headers={"Content-Type": "application/json"})
            assert r.status_code == 422, r.text
            assert "\n" not in r.json()["detail"]


def test_a_finished_job_shows_its_workers_finished(server, admin):
    job, token = register_job(admin, D=2, S=2, M=4)
    with token_client(server.url, token) as worker:
        for d in range(2):
            for s in range(2):
                assert worker.post(f"/v1/jobs/{job}/heartbeats", json={
                    "replica": d, "stage": s, "iteration": 0}).status_code == 200
        assert view(admin, job)["states"] == [["live"] * 2] * 2
        assert worker.post(f"/v1/jobs/{job}/events", json={
            "event_id": "f", "kind": "failure", "replica": 1, "stage": 0}).status_code == 200
        assert worker.post(f"/v1/jobs/{job}/finish").status_code == 200
        v = view(admin, job)
        assert v["state"] == "finished"
        # not "waiting"/"rejoining" (the service forgot their heartbeats at the finish)
        assert v["states"] == [["finished", "finished"], ["failed", "finished"]]
        # the last report may cross the finish: it is still taken
        r = worker.post(f"/v1/jobs/{job}/progress", json={"iteration": 9, "loss": 0.5})
        assert r.status_code == 200 and r.json()["state"] == "finished"
    assert view(admin, job)["progress"]["iteration"] == 9


def test_a_halted_job_answers_410(tmp_path):
    # a service that plans for runs without snapshots halts (with them it would pause)
    with ThreadServer(tmp_path / "service.db", precompute_failures=0,
                      elastic_snapshots=False, elastic_disk=False) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        job, token = register_job(admin, D=1, S=2, M=2)
        assert admin.post(f"/v1/jobs/{job}/events", json={
            "event_id": "h", "kind": "failure", "replica": 0,
            "stage": 1}).json()["state"] == "halted"
        with token_client(server.url, token) as worker:
            r = worker.post(f"/v1/jobs/{job}/progress", json={"iteration": 1, "loss": 1.0})
    assert r.status_code == 410 and "\n" not in r.json()["detail"]


def test_service_watch_reports_at_most_once_a_second_and_always_the_last(server, admin):
    from executor.sources.service_source import ServiceWatch
    job, token = register_job(admin, D=1, S=2, M=2)
    watch = ServiceWatch(server.url, job, token, timeout_s=10)
    try:
        seen = []

        def newest(it):
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:
                p = view(admin, job)["progress"]
                if p is not None and p["iteration"] == it:
                    seen.append(p)
                    return p
                time.sleep(0.02)
            raise AssertionError(f"iteration {it} was not reported: {p}")

        t = 1000.0  # the coordinator's clock (time.monotonic() in the launcher)
        watch.report_progress(0, 4.0, 512, 10, now=t)
        assert newest(0)["tokens_per_s"] is None  # nothing to measure a rate over yet
        watch.report_progress(1, 3.5, 512, 10, now=t + 0.3)  # within the second: not sent
        watch.report_progress(2, 3.0, 512, 10, now=t + 1.0)  # 2 iterations in 1 s
        p = newest(2)
        assert p["loss"] == 3.0 and p["tokens_per_s"] == pytest.approx(1024.0)
        assert p["iterations"] == 10
        time.sleep(0.3)
        assert view(admin, job)["progress"]["iteration"] == 2  # 1 never went out
        watch.report_progress(9, float("nan"), 512, 10, now=t + 1.2)  # the last: always
        p = newest(9)
        assert p["loss"] is None and p["tokens_per_s"] == pytest.approx(512 * 7 / 0.2)
    finally:
        watch.close()
