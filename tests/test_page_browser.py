"""The live cluster page in a real headless Chromium (Debian's, via Selenium and
chromium-driver) against a real `recycle serve` process: it loads with the admin token
from the URL fragment or the login box, shows a failure posted during the test within a
second, a slow worker, the coordinator's training progress, periods with their unit, a
finished job's workers as finished, and no console error; its data needs the admin token (401/403,
never 5xx) and the token never reaches the server's log."""
from __future__ import annotations

import time

import httpx
import pytest

from api_support import (ADMIN, ProcServer, ThreadServer, admin_headers, register_job, spec,
                         token_client)
from browser_support import chromium, console_errors


def start_server(tmp_path) -> ProcServer:
    return ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                      "--heartbeat-timeout", "60", "--log-level", "info").start()


def js(b, script: str):
    return b.execute_script(script)


def cell_state(b, d: int, s: int):
    return js(b, f"const c = document.querySelector('rect.cell[data-replica=\"{d}\"]"
                 f"[data-stage=\"{s}\"]'); return c ? c.dataset.state : null")


def wait_for(cond, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = cond()
        if value:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise AssertionError(f"the page did not show {what} within {timeout} s")


@pytest.mark.hard_timeout(150)
def test_page_in_chromium(tmp_path):
    """One server and one browser for all of it (each costs seconds to start)."""
    server = start_server(tmp_path)
    try:
        with httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin, \
                chromium() as browser:
            login_box_and_job_list(server, browser, admin)
            shows_a_failure_live(server, browser, admin)
            a_64x16_grid_fits_the_window(server, browser, admin)
            a_paused_job_shows_its_reason(server, browser, admin)
            roles_and_moves_and_node_events(server, browser, admin)
            progress_and_a_finished_job(server, browser, admin)
            assert console_errors(browser) == []
    finally:
        server.stop()
    log = server.proc.stderr.read().decode()
    assert "Application startup complete" in log  # the info-level log was captured
    assert ADMIN not in log  # the token was only ever in headers and the URL fragment


def shows_a_failure_live(server, browser, admin):
    job, token = register_job(admin, D=4, S=4, M=8)
    worker = token_client(server.url, token)
    for d in range(4):
        for s in range(4):
            if (d, s) != (3, 3):
                r = worker.post(f"/v1/jobs/{job}/heartbeats",
                                json={"replica": d, "stage": s, "iteration": 0})
                assert r.status_code == 200, r.text
    js(browser, "sessionStorage.clear()")
    browser.get(f"{server.url}/jobs/{job}#token={ADMIN}")
    wait_for(lambda: js(browser, "return document.body.dataset.version") == "0", 10,
             "plan version 0")
    assert "token" not in browser.current_url  # taken out of the URL bar at once
    assert cell_state(browser, 0, 0) == "live" and cell_state(browser, 3, 3) == "waiting"
    wait_for(lambda: js(browser, "return document.body.dataset.planVersion") == "0", 5,
             "the Gantt chart of v0")
    assert js(browser, "return document.querySelectorAll('#gantt rect').length") > 16 * 3

    # a failure posted now is on the page within a second, without a reload
    js(browser, "window.__same_page = true")
    r = worker.post(f"/v1/jobs/{job}/events",
                    json={"event_id": "page-1", "kind": "failure", "replica": 1, "stage": 2,
                          "reason": "GPU fell off the bus <b>"})
    assert r.status_code == 200, r.text
    took = wait_for(lambda: cell_state(browser, 1, 2) == "failed", 1.0, "the failure")
    wait_for(lambda: js(browser, "return document.body.dataset.version") == "1", 1.0, "v1")
    assert js(browser, "return window.__same_page") is True  # no reload
    print(f"failure POST -> shown on the page: {took * 1000:.0f} ms")
    card = js(browser, "return document.querySelector('[data-k=version] .v').textContent")
    assert card == "1"
    events = js(browser, "return document.querySelector('#events tbody').textContent")
    assert "GPU fell off the bus <b>" in events  # escaped text, not markup

    # an operator's failure fences; a slow worker is shown as such
    admin.post(f"/v1/jobs/{job}/events", json={"event_id": "page-2", "kind": "failure",
                                               "replica": 0, "stage": 3})
    admin.post(f"/v1/jobs/{job}/speeds", json={"event_id": "page-3", "replica": 2,
                                               "stage": 1, "speed": 0.5})
    wait_for(lambda: cell_state(browser, 0, 3) == "fenced", 2.0, "the fenced worker")
    wait_for(lambda: cell_state(browser, 2, 1) == "slow", 2.0, "the slow worker")
    assert console_errors(browser) == []


def login_box_and_job_list(server, browser, admin):
    job, _ = register_job(admin, D=2, S=2, M=4)
    browser.get(server.url + "/")
    js(browser, "sessionStorage.clear()")
    browser.get(server.url + "/")
    wait_for(lambda: js(browser, "return !document.getElementById('login').hidden"), 5,
             "the login box")
    browser.find_element("id", "token").send_keys(ADMIN + "\n")
    wait_for(lambda: job in js(browser, "return document.getElementById('job-table')"
                                        ".textContent"), 5, "the job list")
    browser.find_element("link text", job).click()
    wait_for(lambda: js(browser, "return document.body.dataset.version") == "0", 5,
             "the job's page")
    assert browser.current_url.endswith(f"/jobs/{job}")
    assert console_errors(browser) == []


def a_64x16_grid_fits_the_window(server, browser, admin):
    r = admin.post("/v1/jobs?max_failures=0", json=spec(D=64, S=16, M=4))
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    browser.get(f"{server.url}/jobs/{job}")  # the token is in sessionStorage already
    wait_for(lambda: js(browser, "return document.body.dataset.version") == "0", 15, "v0")
    assert js(browser, "return document.querySelectorAll('#grid rect.cell').length") == 1024
    width = js(browser, "return document.getElementById('grid').getBoundingClientRect().width")
    assert width <= 1300  # every replica visible side by side, no horizontal scrolling
    assert console_errors(browser) == []


def a_paused_job_shows_its_reason(server, browser, admin):
    """Three of four workers dead: the job, registered with a fixed shape, pauses
    (snapshots keep every stage; a service without them would halt; at the default shape
    it would be cut to one stage), and the page says why."""
    job, _ = register_job(admin, shape="fixed", D=2, S=2, M=2)
    browser.get(f"{server.url}/jobs/{job}")
    wait_for(lambda: js(browser, "return document.body.dataset.version") == "0", 5, "v0")
    for k, (d, s) in enumerate(((0, 1), (1, 1), (0, 0))):
        admin.post(f"/v1/jobs/{job}/events", json={"event_id": f"h-{k}", "kind": "failure",
                                                   "replica": d, "stage": s})
    wait_for(lambda: js(browser, "return document.body.dataset.state") == "paused", 2.0,
             "the pause")
    reason = js(browser, "return document.getElementById('reason').textContent")
    assert "1 live worker cannot serve 2 stages" in reason, reason


def roles_and_moves_and_node_events(server, browser, admin):
    """A node removed leaves stage 2 short: the plan moves a stage-0 worker there. The grid
    (by worker) marks it with the slot it fills, the versions table lists the move, the
    Gantt chart names it on its slot's row, the events table the node's workers."""
    job, _ = register_job(admin, D=3, S=3, M=6)
    browser.get(f"{server.url}/jobs/{job}")
    wait_for(lambda: js(browser, "return document.body.dataset.version") == "0", 5, "v0")
    assert js(browser, "return document.querySelectorAll('#grid rect.away').length") == 0
    r = admin.post(f"/v1/jobs/{job}/nodes", json={
        "event_id": "spot-1", "kind": "remove", "reason": "spot preemption notice",
        "workers": [{"replica": r, "stage": s} for r, s in ((0, 1), (0, 2), (1, 2))]})
    assert r.status_code == 200, r.text
    plan = admin.get(f"/v1/jobs/{job}/plan").json()
    [move] = plan["moves"]
    slot = next((x["replica"], x["stage"]) for x in plan["roles"] if x["worker"] == move["worker"])
    home = move["worker"].replace(".", ":")
    wait_for(lambda: js(browser, "return document.body.dataset.planVersion") == "1", 3, "v1")
    away = js(browser, "return [...document.querySelectorAll('#grid rect.away')]"
                       ".map((c) => c.dataset.replica + ':' + c.dataset.stage + '>' + c.dataset.slot)")
    assert away == [f"{home}>{slot[0]}:{slot[1]}"], away
    tip = js(browser, "return document.querySelector('#grid rect.away title').textContent")
    assert f"worker {home} " in tip and f"fills slot {slot[0]}:{slot[1]} (stage 2)" in tip, tip
    versions = js(browser, "return document.querySelector('#versions tbody tr').textContent")
    assert f"{move['worker']} s0\u2192s2 (peer)" in versions, versions
    gantt = js(browser, "return document.getElementById('gantt').textContent")
    assert f"{slot[0]}:{slot[1]} ({move['worker']})" in gantt, gantt  # every replica (3x3)
    events = js(browser, "return document.querySelector('#events tbody tr').textContent")
    assert "remove" in events and "0:1 0:2 1:2" in events and "spot preemption" in events
    r = admin.post(f"/v1/jobs/{job}/nodes", json={"event_id": "spot-2", "kind": "add",
                                                  "count": 1})
    assert r.status_code == 200, r.text
    wait_for(lambda: js(browser, "return document.querySelector('#events tbody tr')"
                                 ".dataset.kind") == "add", 3, "the node add")
    assert console_errors(browser) == []


def card(b, k: str) -> str:
    return js(b, f"const c = document.querySelector('[data-k={k}]'); return c ? c.textContent : ''")


def progress_and_a_finished_job(server, browser, admin):
    job, token = register_job(admin, D=2, S=2, M=2)
    worker = token_client(server.url, token)
    for d in range(2):
        for s in range(2):
            worker.post(f"/v1/jobs/{job}/heartbeats", json={"replica": d, "stage": s,
                                                            "iteration": 0})
    browser.get(f"{server.url}/jobs/{job}")
    wait_for(lambda: cell_state(browser, 1, 1) == "live", 5, "live workers")
    assert "no progress reported yet" in card(browser, "progress")
    # periods carry their unit (the job spec's time unit), on the cards and in the table
    assert card(browser, "period").startswith("period") and " units" in card(browser, "period")
    assert " units" in card(browser, "bound") and " units" in card(browser, "kept")
    assert " units" in js(browser, "return document.querySelector('#versions tbody').textContent")
    # the coordinator's report is on the page within a push (about a second)
    r = worker.post(f"/v1/jobs/{job}/progress", json={"iteration": 41, "iterations": 100,
                                                      "loss": 2.71828, "tokens_per_s": 98765.4,
                                                      "snapshot_every": 4,
                                                      "snapshot_mib": 18.25})
    assert r.status_code == 200, r.text
    wait_for(lambda: "iteration 41 / 100" in card(browser, "progress"), 3, "the progress")
    text = card(browser, "progress")
    assert "loss 2.7183" in text and "98,765 tok/s" in text, text
    assert "snapshots every 4 (18.3 MiB a worker)" in text, text  # K auto chose, memory held
    # training completes: the coordinator tells the service; its workers are finished, not
    # waiting (the service stops watching their heartbeats)
    assert worker.post(f"/v1/jobs/{job}/finish").status_code == 200
    wait_for(lambda: js(browser, "return document.body.dataset.state") == "finished", 3,
             "the finish")
    wait_for(lambda: cell_state(browser, 0, 0) == "finished", 3, "finished workers")
    assert [cell_state(browser, d, s) for d in range(2) for s in range(2)] == ["finished"] * 4
    assert "finished 4" in js(browser, "return document.getElementById('legend').textContent")
    worker.close()


def test_page_data_needs_the_admin_token(tmp_path):
    with ThreadServer(tmp_path / "service.db", precompute_failures=0) as server, \
            httpx.Client(base_url=server.url, headers=admin_headers(), timeout=10) as admin:
        page_data_needs_the_admin_token(server, admin)


def page_data_needs_the_admin_token(server, admin):
    job, token = register_job(admin, D=2, S=2, M=2)
    shell = httpx.get(server.url + f"/jobs/{job}")
    assert shell.status_code == 200 and job not in shell.text  # the shell holds no data
    assert "default-src 'self'" in shell.headers["content-security-policy"]
    for path in (f"/v1/page/jobs/{job}/view", f"/v1/page/jobs/{job}/live",
                 f"/v1/page/jobs/{job}/plan", "/v1/page/jobs"):
        for headers, code in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                              ({"Authorization": f"Bearer {token}"}, 403)):
            r = httpx.get(server.url + path, headers=headers, timeout=5)
            assert r.status_code == code, (path, headers, r.text)
            detail = r.json()["detail"]
            assert detail and "\n" not in detail
    r = admin.get("/v1/page/jobs/nope/view")
    assert r.status_code == 404 and r.json()["detail"] == "no job 'nope'"
    assert admin.get("/page/../api/app.py").status_code == 404
    assert admin.get("/page/secret.py").status_code == 404
    view = admin.get(f"/v1/page/jobs/{job}/view").json()
    assert view["version"] == 0 and view["states"] == [["waiting"] * 2] * 2
