"""`recycle train --service` end to end: a real `recycle serve` subprocess, real worker
processes (gloo, CPU), real SIGKILLs. Workers poll the service for plans, heartbeat to it
and report suspects; the service declares failures and publishes every plan. Whatever
happens, losses and final parameters must equal the one-process reference
(docs/design.md section 7).
"""
from __future__ import annotations

import glob
import io
import os
import re
import signal
import threading
import time
from functools import lru_cache

import httpx
import pytest
from rich.console import Console

from api_support import ProcServer, admin_headers
from executor.launch.launcher import Coordinator
from executor.launch.report.run_record import failed_by_iteration
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.compute.model import ModelConfig
from executor.compute.one_process.reference import compare, train_reference
from executor.sources.service_source import ServiceWatch
from executor.runtime.peer_snapshots.cadence import AUTO
from planner.job import JobSpec

pytestmark = pytest.mark.hard_timeout(150)  # the coordinator's deadline is 50 s
CFG = ModelConfig(vocab=32, seq_len=8, d_model=16, n_heads=2, n_layers=2, micro_batch_size=2)
D, S, M = 2, 2, 2
# heartbeats go every 0.5 s; a suspect silent for 1 s is declared failed
# Straggler detection is off in these tests of failures: on loaded cores it may measure a
# worker slow and post a speed event (a re-plan), which the event counts here do not
# expect (a full run beside a chaos soak failed so once). tests/test_service_speeds.py and
# tests/test_node_agent.py test it.
NO_SPEEDS = ("--speed-window", "0")
SERVE = ("--solvers", "greedy", "--max-failures", "1", "--heartbeat-timeout", "3",
         "--suspect-grace", "1", *NO_SPEEDS)


@lru_cache(maxsize=None)
def reference(iterations, replicas=D, stages=S):
    return train_reference(CFG, replicas, M, iterations, stages)


def register(url: str, replicas=D, stages=S, shape="auto") -> tuple[str, str]:
    r = httpx.post(url + "/v1/jobs", headers=admin_headers(),
                   params={"max_failures": 1, "shape": shape},
                   json=JobSpec.uniform(replicas, stages, M).model_dump(mode="json"))
    r.raise_for_status()
    return r.json()["id"], r.json()["token"]


def coordinator(tmp_path, url, jid, token, iterations, timeout=4.0, faults=Faults(),
                snapshot_every=AUTO):
    watch = ServiceWatch(url, jid, token, timeout_s=30)
    out = io.StringIO()
    spec = LaunchSpec(CFG, watch.plan.job, iterations, faults, deadline_s=50,
                      run_dir=str(tmp_path),
                      **sections(timeout=timeout, snapshot_every=snapshot_every))
    coord = Coordinator(spec, console=Console(file=out, width=200), service=watch)
    coord.output = out
    return coord


def logs(tmp_path):
    return "".join(open(f).read() for f in sorted(glob.glob(str(tmp_path / "worker-*.log"))))


def history(url, jid):
    with httpx.Client(base_url=url, headers=admin_headers(), timeout=10) as c:
        job = c.get(f"/v1/jobs/{jid}").json()
        job.pop("precompute")
        plans = [c.get(f"/v1/jobs/{jid}/plans/{p['version']}").json() for p in job["plans"]]
        return {"job": job, "events": c.get(f"/v1/jobs/{jid}/events").json(), "plans": plans}


def assert_exact(res, coord, iterations, tmp_path):
    assert res.summary is not None, f"halted: {res.halted}\n{coord.output.getvalue()}"
    diffs = compare(res.summary, reference(iterations, coord.D, coord.S), 1e-5)
    assert not diffs, "\n".join(diffs) + "\n" + coord.output.getvalue() + logs(tmp_path)


def test_worker_sigkilled_and_rejoined_through_the_service(tmp_path):
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 5, faults=Faults(
                            kills=[(1, 0, 1)], rejoins=[(1, 0, 3)]))
        res = coord.run()
        assert_exact(res, coord, 5, tmp_path)
        h = history(srv.url, jid)
        # The death is a failure event at once (the coordinator posts it, no heartbeat
        # timeout), and the new process starts only when the run reaches iteration 3, so
        # iterations 1 and 2 train re-routed every time (they used to race the restart).
        events = [(e["kind"], e["source"], e["replica"], e["stage"]) for e in h["events"]]
        assert events == [("failure", "worker", 1, 0), ("recovery", "worker", 1, 0)], events
        assert h["plans"][-1]["incarnations"] == [[1, 1], [2, 1]]
        failed = failed_by_iteration(res.summary.plans, 5)
        assert failed == [[], [[1, 0]], [[1, 0]], [], []], res.summary.plans
        # the run's last line counts the versions trained under (issue 12, item 15); it
        # used to print the last version's number, one less than the count here
        trained = [p["version"] for p in res.summary.plans]
        assert trained == list(range(len(h["plans"]))) and res.versions == len(trained)
        assert any("SIGKILL worker 1:0 mid-iteration 1" in e for e in res.events)
        assert "loaded stage 0 state from worker (0, 0)" in logs(tmp_path)
        # the live page's view: the coordinator's last progress report, workers finished
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=10) as c:
            view = c.get(f"/v1/page/jobs/{jid}/view").json()
        assert view["state"] == "finished" and view["states"] == [["finished"] * 2] * 2
        p = view["progress"]
        assert (p["iteration"], p["iterations"]) == (4, 5), p
        assert p["loss"] == pytest.approx(res.summary.losses[4]) and p["tokens_per_s"] > 0
        # the snapshots' K (auto, the default; in a 5-iteration run it may be chosen only
        # at the last step, or not at all: the summary then says "auto", the page none)
        # and the memory they held, as the summary says
        el = res.summary.elastic
        chosen = None if el["snapshot_every"] == "auto" else el["snapshot_every"]
        page_k = p.get("snapshot_every")
        assert page_k == chosen or (page_k is None and chosen is not None), (p, el)
        assert p["snapshot_mib"] == el["snapshot_mib_per_worker"] > 0, (p, el)
    finally:
        srv.stop()


def test_a_stage_lost_whole_is_replayed_from_peer_memory_through_the_service(tmp_path):
    """2x2, no rejoin: both stage-1 workers die (iterations 3 and 5). The service, told the
    runs keep snapshots (--elastic-snapshots), moves a stage-0 worker into stage 1 with
    `source: snapshot`; it loads the snapshot and replays stage 1 alone from stage 0's
    boundary logs (stage 0 keeps its work), and the run ends exact."""
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--heartbeat-timeout", "10", "--suspect-grace", "3",
                     "--elastic-snapshots", *NO_SPEEDS).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 8, snapshot_every=2,
                            faults=Faults(kills=[(0, 1, 3), (1, 1, 5)]))
        res = coord.run()
        assert_exact(res, coord, 8, tmp_path)
        h = history(srv.url, jid)
        moves = [m for p in h["plans"] for m in p.get("moves") or []]
        assert [(m["to_stage"], m["source"]) for m in moves if m["source"] == "snapshot"] \
            == [(1, "snapshot")], h["plans"]
        assert h["job"]["failed"] == [[0, 1], [1, 1]] and h["job"]["state"] != "halted"
        text = logs(tmp_path)
        assert "replayed stage 1 iterations" in text and "rolled back to" not in text, text
        el = res.summary.elastic
        assert el["replays"] == 1 and el["retrained_iterations"] <= 1, el
    finally:
        srv.stop()


def test_kills_that_leave_a_stage_short_move_a_worker_through_the_service(tmp_path):
    """3x3, kills 0:1@1, 0:2@2 and 1:2@2: stage 2 is left one worker and stage 0 three.
    The service (elastic membership) publishes a plan whose roles move a stage-0 worker to
    stage 2 and plans for the slots that leaves empty; the mover loads stage 2 from its
    live holder, heartbeats under its own id, and the coordinator follows. Exact.
    Straggler detection is off (NO_SPEEDS)."""
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--heartbeat-timeout", "10", "--suspect-grace", "3",
                     *NO_SPEEDS).start()
    try:
        jid, token = register(srv.url, 3, 3)
        coord = coordinator(tmp_path, srv.url, jid, token, 5,
                            faults=Faults(kills=[(0, 1, 1), (0, 2, 2), (1, 2, 2)]))
        res = coord.run()
        assert_exact(res, coord, 5, tmp_path)
        h = history(srv.url, jid)
        assert [(e["kind"], e["source"]) for e in h["events"]] == [("failure", "worker")] * 3
        moved = [p for p in h["plans"] if p.get("moves")]
        assert len(moved) == 1, h["plans"]
        [move] = moved[0]["moves"]
        assert (move["from_stage"], move["to_stage"], move["source"]) == (0, 2, "peer")
        slots = {r["worker"]: (r["replica"], r["stage"]) for r in moved[0]["roles"]}
        assert slots[move["worker"]][1] == 2 and sum(s == 2 for _, s in slots.values()) == 2
        # the job names its dead workers; the plan, the empty slots (one now in stage 0)
        assert h["job"]["failed"] == [[0, 1], [0, 2], [1, 2]]
        assert sorted(s for _, s in h["plans"][-1]["failed"]) == [0, 1, 2]
        assert [p for p in h["job"]["plans"] if p.get("moves")][0]["moves"] == [move]
        # the coordinator followed the move; the mover trained stage 2 from then on
        assert any(f"worker {move['worker']} moves from stage 0 to stage 2" in e
                   for e in res.events), res.events
        assert any(p.get("moves") for p in res.summary.plans), res.summary.plans
        assert "moving from stage 0 to stage 2" in logs(tmp_path)
    finally:
        srv.stop()


def test_three_of_four_lost_the_service_cuts_the_pipeline_and_the_run_stays_exact(tmp_path):
    """2x2 at default flags: three workers die in iteration 2 for good. The service cuts
    the pipeline to one stage (both of the job's) for the one live worker, which takes the
    other stage's state from peer memory and trains on alone, never paused, exact."""
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 6, faults=Faults(
            kills=[(0, 0, 2), (0, 1, 2), (1, 1, 2)]))
        res = coord.run()
        assert_exact(res, coord, 6, tmp_path)
        h = history(srv.url, jid)
        assert "paused" not in [e["state"] for e in h["events"]], h["events"]
        assert h["job"]["state"] == "finished", h["job"]
        last = h["plans"][-1]
        assert last["partition"]["bounds"] == [0, 2] and len(last["roles"]) == 1, last
        assert "changed shape" in logs(tmp_path), logs(tmp_path)
    finally:
        srv.stop()


def test_too_few_live_workers_pause_the_service_job_and_it_resumes_exact(tmp_path):
    """2x2 registered with a fixed shape: three workers die in iteration 2, one live
    worker cannot serve two stages. The service pauses the job (no version while too few
    live; before, it halted), the restarted 0:1 asks back in, and the next version resumes
    from peer memory: every stage rolls back to a copy it kept, the run ends exact."""
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--heartbeat-timeout", "10", "--suspect-grace", "3", *NO_SPEEDS).start()
    try:
        jid, token = register(srv.url, shape="fixed")
        coord = coordinator(tmp_path, srv.url, jid, token, 6, faults=Faults(
            kills=[(0, 0, 2), (0, 1, 2), (1, 1, 2)], restarts=[(0, 1, 4)]))
        res = coord.run()
        assert_exact(res, coord, 6, tmp_path)
        h = history(srv.url, jid)
        states = [e["state"] for e in h["events"]]  # each event's answer
        assert "paused" in states, h["events"]
        assert "halted" not in states and h["job"]["state"] == "finished", h["events"]
        kinds = [(e["kind"], e["replica"], e["stage"]) for e in h["events"]]
        assert kinds[-1] == ("recovery", 0, 1), kinds
        # the newest copy of every stage: a snapshot, or the checkpoint on disk (a tier too)
        assert re.search(r"rolled back to iteration \d+ from (peer-memory snapshots|the "
                         r"checkpoint on disk of iteration)", logs(tmp_path)), logs(tmp_path)
    finally:
        srv.stop()


def test_a_rejoin_due_after_the_pause_starts_while_the_service_holds_the_job_paused(tmp_path):
    """The same job with `--rejoin 0:1@4` instead of a restart: a rejoin waits for the
    iteration before its own, which a paused job never reaches; the coordinator did not
    know the service had paused the job, so the run hung until its deadline."""
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--heartbeat-timeout", "10", "--suspect-grace", "3", *NO_SPEEDS).start()
    try:
        jid, token = register(srv.url, shape="fixed")
        coord = coordinator(tmp_path, srv.url, jid, token, 6, faults=Faults(
            kills=[(0, 0, 2), (0, 1, 2), (1, 1, 2)], rejoins=[(0, 1, 4)]))
        res = coord.run()
        assert_exact(res, coord, 6, tmp_path)
        states = [e["state"] for e in history(srv.url, jid)["events"]]
        assert "paused" in states and "halted" not in states, states
    finally:
        srv.stop()


def test_service_sigkilled_and_restarted_mid_run(tmp_path):
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 6)
        result = {}
        runner = threading.Thread(target=lambda: result.setdefault("res", coord.run()),
                                  daemon=True)
        runner.start()
        t0 = time.monotonic()
        while coord.printed < 1 and runner.is_alive() and time.monotonic() - t0 < 40:
            time.sleep(0.005)
        assert coord.printed >= 1 and coord.printed < 5, coord.output.getvalue()
        before = history(srv.url, jid)
        srv.kill()
        # With the service down, a worker dies: the survivors can only go on once they
        # reach the restarted service and it takes the failure (the coordinator's post,
        # retried until the service is back).
        os.kill(coord.processes.pid((1, 1)), signal.SIGKILL)
        time.sleep(0.5)
        srv.start()
        runner.join(50)
        assert not runner.is_alive()
        assert_exact(result["res"], coord, 6, tmp_path)
        after = history(srv.url, jid)
        assert after["plans"][:len(before["plans"])] == before["plans"]
        assert after["events"][:len(before["events"])] == before["events"]
        assert after["job"]["id"] == before["job"]["id"]
        assert [(e["kind"], e["source"]) for e in after["events"]] == [("failure", "worker")]
        assert after["job"]["failed"] == [[1, 1]] and after["job"]["plan_version"] == 1
        # The survivors reconnected: they trained the last iteration under plan v1, which
        # only the restarted service could give them. (A heartbeat count was the old check;
        # the survivors can finish before their next beat, 0.5 s apart, so it was flaky.)
        assert failed_by_iteration(result["res"].summary.plans, 6)[-1] == [[1, 1]]
        assert any("service published plan v1 (failed [(1, 1)])" in e for e in coord.events)
    finally:
        coord.stop()  # a failed assertion must not leave the run and its workers going
        runner.join(20)
        srv.stop()


def test_stalled_worker_resynced_by_the_service(tmp_path):
    """SIGSTOP for longer than the comm timeout but shorter than the suspect grace: peers
    report it, it heartbeats again once continued, so nobody is declared failed and the
    service re-publishes the same failed set; everyone meets in the new version."""
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     "--heartbeat-timeout", "9", "--suspect-grace", "4.5", *NO_SPEEDS).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 5, timeout=2.0,
                            faults=Faults(stalls=[(0, 1, 1, 3.0)]))
        res = coord.run()
        assert_exact(res, coord, 5, tmp_path)
        h = history(srv.url, jid)
        assert h["events"] == []
        assert len(h["plans"]) >= 2 and all(p["failed"] == [] for p in h["plans"])
        assert any("SIGCONT worker 0:1" in e for e in res.events)
        assert "plan v0: iteration 1 aborted" in logs(tmp_path)
    finally:
        srv.stop()


def test_stall_past_heartbeat_timeout_fences_then_rejoins(tmp_path):
    """SIGSTOP past the heartbeat timeout: the service declares the worker failed and the
    others go on without it. Continued, it finds itself out of the plan and exits (fencing);
    it sends no late suspect report (that made the service re-publish for nothing). Its
    exit is seen although the service declared it first, so the due rejoin restarts it."""
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 5, timeout=2.0,
                            faults=Faults(stalls=[(0, 1, 1, 5.0)], rejoins=[(0, 1, 3)]))
        res = coord.run()
        assert_exact(res, coord, 5, tmp_path)
        h = history(srv.url, jid)
        assert [(e["kind"], e["source"], e["replica"], e["stage"]) for e in h["events"]] == [
            ("failure", "heartbeat", 0, 1), ("recovery", "worker", 0, 1)]
        # Failed sets in version order (a re-sync under load repeats one: merged here).
        sets = [p["failed"] for p in h["plans"]]
        assert [s for i, s in enumerate(sets) if i == 0 or s != sets[i - 1]] == [[], [[0, 1]], []]
        # v1, or a later version that re-synced the same failed set before it woke
        assert re.search(r"not in plan v\d+: declared failed \(failed \[\(0, 1\)\]\): stopping",
                         logs(tmp_path)), logs(tmp_path)
        assert any("worker 0:1 failed (process exited with code 0)" in e for e in res.events)
        assert any("restarting worker 0:1" in e for e in res.events)
        assert "loaded stage 1 state from worker (1, 1)" in logs(tmp_path)
    finally:
        srv.stop()


def _run_in_thread(coord):
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("res", coord.run()), daemon=True)
    runner.start()
    return runner, result


def _wait_printed(coord, runner, n, limit=40):
    t0 = time.monotonic()
    while coord.printed < n and runner.is_alive() and time.monotonic() - t0 < limit:
        time.sleep(0.005)
    assert coord.printed >= n, coord.output.getvalue()


def test_kill_and_rejoin_at_the_default_heartbeat_timeout(tmp_path):
    """Issue 7, cause 3: with the service's default 10 s heartbeat timeout the restarted
    worker used to enter the plan that still listed its dead predecessor, fail to connect
    and livelock. Now it waits for a version naming its incarnation."""
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "1",
                     *NO_SPEEDS).start()
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 6, timeout=2.0,
                            faults=Faults(kills=[(0, 1, 1)], rejoins=[(0, 1, 3)]))
        res = coord.run()
        assert_exact(res, coord, 6, tmp_path)
        assert history(srv.url, jid)["plans"][-1]["incarnations"] == [[1, 2], [1, 1]]
        assert "entered plan" in open(tmp_path / "worker-0-1.log").read().split(
            "started (incarnation 2)")[1]
        kinds = sorted(r["kind"] for r in res.summary.recovery)
        assert kinds == ["kill", "rejoin"], res.summary.recovery
    finally:
        srv.stop()


def _service_down_mid_run(tmp_path, while_down, check):
    """Train 4 iterations; after the first, SIGKILL the service, run `while_down`, restart
    it on the same port; the run must end exact, then `check(url, job_id, coordinator)`."""
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    coord = None
    try:
        jid, token = register(srv.url)
        coord = coordinator(tmp_path, srv.url, jid, token, 4)
        runner, result = _run_in_thread(coord)
        _wait_printed(coord, runner, 1)
        srv.kill()
        while_down()
        srv.start()
        runner.join(60)
        assert not runner.is_alive()
        assert_exact(result["res"], coord, 4, tmp_path)
        check(srv.url, jid, coord)
    finally:
        if coord is not None:
            coord.stop()
        srv.stop()


def test_service_down_when_training_ends(tmp_path):
    """Issue 7, cause 5: the service is down for longer than the coordinator used to retry
    /finish (10 s). It comes back, hears that training finished, and the job stays
    finished past the heartbeat timeout instead of being halted."""
    def check(url, jid, coord):
        time.sleep(4)  # past the 3 s heartbeat timeout: nobody heartbeats any more
        job = history(url, jid)["job"]
        assert job["state"] == "finished" and job["failed"] == [], job

    _service_down_mid_run(tmp_path, lambda: time.sleep(12), check)


def test_service_loses_the_job_while_down(tmp_path):
    """Issue 7, cause 5: the database is replaced while the service is down. Training goes
    on under the plan in force and ends with its summary and a one-line warning, no
    traceback."""
    def wipe():
        for f in glob.glob(str(tmp_path / "service.db*")):
            os.remove(f)

    def check(url, jid, coord):
        out = coord.output.getvalue()
        assert "did not record the end of training" in out and "Traceback" not in out, out

    _service_down_mid_run(tmp_path, wipe, check)
