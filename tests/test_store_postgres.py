"""The service with its state in a real PostgreSQL server (started here with initdb and
pg_ctl on a free port): an active service and a standby on one database; the active one
SIGKILLed, the standby takes over with every job, failed set, plan version, event, worker
token and cached plan; the database stopped under it, it stops (fail-stop). A bad URL is
one line and exit code 2."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import httpx
import pytest

from api_support import ROOT, ProcServer, admin_headers, free_port, register_job, \
    token_client, wait_healthy
from pg_support import PgServer

pytestmark = pytest.mark.procs  # its fixtures or tests start processes

ARGS = ("--solvers", "greedy", "--max-failures", "1", "--heartbeat-timeout", "60")


@pytest.fixture
def pg():
    server = PgServer().start()
    try:
        yield server
    finally:
        server.remove()


def launch(server: ProcServer) -> None:
    """Start without waiting for /healthz (a standby does not open its port)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server.proc = subprocess.Popen(server.cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)


def log_until(server: ProcServer, text: str, timeout: float) -> str:
    """The server's stderr so far, read until `text` shows up (AssertionError if not)."""
    buf = server.__dict__.setdefault("log", bytearray())
    fd, end = server.proc.stderr.fileno(), time.monotonic() + timeout
    while text.encode() not in buf:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {text!r} in the log within {timeout} s: {bytes(buf)!r}")
        if select.select([fd], [], [], min(left, 0.2))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"log ended without {text!r}: {bytes(buf)!r}")
            buf.extend(chunk)
    return buf.decode()


def up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def _drive(store) -> list:
    """The same calls on any store; every answer, with wall-clock times masked."""
    plan = {"version": 0, "json": '{"v": 0}', "failed_key": "-", "solver": "greedy",
            "period": 100, "cause": "registered"}
    store.create_job("j", '{"spec": 1}', "sh", "th", 2, plan, ["greedy", "cpsat"], 1.5)
    store.create_job("k", '{"spec": 2}', "sh2", "th2", 1, plan, ["greedy"], 2.5)
    ev = {"event_id": "e1", "kind": "failure", "replica": 1, "stage": 0, "source": "worker",
          "body_json": '{"b": 1}'}
    store.arm_many([("j", 1, 0), ("j", 0, 0), ("j", 0, 0)])
    store.apply_event("j", ev, {"ok": 1}, "running", None, [[1, 0]],
                      {**plan, "version": 1, "failed_key": "1:0", "cause": "failure:worker"})
    speed = {**ev, "event_id": "s1", "kind": "speed", "source": "operator",
             "body_json": '{"speed": 0.5}'}
    store.apply_events("j", [(speed, {"ok": 2})], "running", None, [[1, 0]], None)
    store.set_precompute("j", state="running", done=3, total=9, error="x")
    store.add_plan("j", {**plan, "version": 2, "cause": "precomputed:cpsat", "period": 90})
    store.set_state("k", "finished")

    def rows(rs):
        return [tuple(v if not isinstance(v, float) or v < 1e6 else "t" for v in r) for r in rs]
    return [rows(store.jobs()), rows([store.event("j", "e1")]), store.event("j", "nope"),
            rows(store.events("j")), rows(store.speed_events("j")),
            rows([store.latest_plan("j")]), rows([store.plan("j", 1)]), store.plan("j", 7),
            rows(store.plan_history("j")), rows([store.precompute("j")]),
            sorted(store.armed("j")), store.armed("k"),
            {t: rows(v) for t, v in store.snapshot().items()},
            dict(store.latest_plan("j"))["cause"]]


def test_postgres_store_answers_as_the_sqlite_one(pg, tmp_path):
    from api.storage.sqlite_store import Store
    from api.storage.postgres_store import PgStore
    lite = Store(str(tmp_path / "s.db"))
    pgs = PgStore(pg.url)
    try:
        assert pgs.try_activate()
        assert _drive(pgs) == _drive(lite)
        with pytest.raises(Exception):  # a constraint still holds (one version per number)
            pgs.add_plan("j", {"version": 2, "json": "{}", "failed_key": "-",
                               "solver": "g", "period": 1, "cause": "dup"})
        assert len(pgs.plan_history("j")) == 3  # and the failed transaction left nothing
    finally:
        lite.close()
        pgs.close()


@pytest.mark.hard_timeout(120)
def test_standby_takes_over_on_postgres(pg):
    import psycopg
    active, standby = ProcServer(pg.url, *ARGS), ProcServer(pg.url, *ARGS)
    try:
        active.start()
        admin = httpx.Client(base_url=active.url, headers=admin_headers(), timeout=10)
        job, token = register_job(admin, D=4, S=4, M=8)
        worker = token_client(active.url, token)
        assert worker.post(f"/v1/jobs/{job}/heartbeats",
                           json={"replica": 0, "stage": 0, "iteration": 0}).status_code == 200
        r = worker.post(f"/v1/jobs/{job}/events", json={"event_id": "a-1", "kind": "failure",
                                                        "replica": 1, "stage": 2})
        assert r.status_code == 200 and r.json()["plan_version"] == 1, r.text

        launch(standby)
        log_until(standby, "standby: another service holds", 30)
        time.sleep(0.5)
        assert standby.proc.poll() is None and not up(standby.url)  # standing by

        active.kill()
        t0 = time.monotonic()
        wait_healthy(standby.url, 30, proc=standby.proc)
        print(f"standby took over {time.monotonic() - t0:.2f} s after SIGKILL of the active")

        admin = httpx.Client(base_url=standby.url, headers=admin_headers(), timeout=10)
        worker = token_client(standby.url, token)  # the token issued by the dead service
        got = worker.get(f"/v1/jobs/{job}").json()
        assert got["failed"] == [[1, 2]] and got["plan_version"] == 1
        assert [p["cause"] for p in got["plans"]] == ["registered", "failure:worker"]
        # a re-sent event is answered as before (idempotency survives the takeover)
        again = worker.post(f"/v1/jobs/{job}/events", json={
            "event_id": "a-1", "kind": "failure", "replica": 1, "stage": 2})
        assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
        r = worker.post(f"/v1/jobs/{job}/events", json={"event_id": "b-1", "kind": "failure",
                                                        "replica": 2, "stage": 3})
        assert r.status_code == 200 and r.json()["plan_version"] == 2, r.text
        view = admin.get(f"/v1/page/jobs/{job}/view").json()
        assert view["states"][1][2] == "failed" and view["version"] == 2
        with psycopg.connect(pg.url) as db:
            assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 2
            assert db.execute("SELECT COUNT(*) FROM plan_versions").fetchone()[0] == 3
            assert db.execute("SELECT COUNT(*) FROM plans").fetchone()[0] > 0  # the cache

        # a second standby stops at once when told to (it has not started serving)
        third = ProcServer(pg.url, *ARGS)
        launch(third)
        log_until(third, "standby: another service holds", 30)
        assert third.proc.poll() is None and not up(third.url)
        third.proc.terminate()
        third.proc.wait(10)

        # the database goes away: the service stops rather than serve what it cannot persist
        pg.stop("immediate")
        log_until(standby, "lost the PostgreSQL connection", 15)
        standby.proc.wait(15)
    finally:
        active.stop()
        standby.stop()
        if "third" in locals():
            third.stop()


def test_unreachable_postgres_is_one_line_and_exit_2(tmp_path):
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    p = subprocess.run([sys.executable, "-m", "api", "serve", "--db", url, "--port",
                        str(free_port())], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --db: cannot reach PostgreSQL")
    assert "Traceback" not in p.stderr
