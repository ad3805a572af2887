"""Issue 7, executor side: each test failed on the main it was written against.

Causes: (1) every --rejoin entry of a worker consumed at its first death; (2) torch's group
counter drifting after a failed rendezvous; (4) a rejoin gate re-armed after it was met,
and gates for workers that do not exist; (6) `--iterations` that no run can reach; (7) a
SIGKILLed coordinator leaving workers behind; (8) the store listening on every interface.
"""
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from executor.launch.report.run_record import failed_by_iteration
from executor.inputs.launch_spec import Faults, LaunchSpec
from test_executor_runtime import CFG, M, assert_exact, logs, run

pytestmark = pytest.mark.hard_timeout(150)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECYCLE = [sys.executable, "-m", "recycle.cli"]


def test_repeated_rejoins_each_consume_one_entry(tmp_path):
    """Cause 1: kill, rejoin, kill again, rejoin again: one restart per death, both kills
    land, and training is exact."""
    res = run(tmp_path, 2, 2, 10, faults=Faults(kills=[(0, 1, 2), (0, 1, 6)],
                                               rejoins=[(0, 1, 4), (0, 1, 8)]))
    assert_exact(res, 2, 2, 10, tmp_path)
    kills = [e for e in res.events if e.startswith("SIGKILL worker 0:1")]
    restarts = [e for e in res.events if e.startswith("restarting worker 0:1")]
    assert len(kills) == 2 and len(restarts) == 2, res.events
    assert "at iteration 4" in restarts[0] and "at iteration 8" in restarts[1]
    failed = failed_by_iteration(res.summary.plans, 10)
    assert failed == ([[]] * 2 + [[[0, 1]]] * 2) * 2 + [[]] * 2, res.summary.plans
    kinds = sorted(r["kind"] for r in res.summary.recovery)
    assert kinds == ["kill", "kill", "rejoin", "rejoin"], res.summary.recovery


def test_killed_in_its_own_rejoin_iteration_does_not_stall(tmp_path):
    """Cause 4: the hold for the rejoin at 4 is released once it is met; the second death
    in iteration 4 must not re-arm it (it stalled for 10 x --timeout)."""
    res = run(tmp_path, 2, 2, 6, faults=Faults(kills=[(0, 1, 2), (0, 1, 4)], rejoins=[(0, 1, 4)]),
              timeout=3.0)
    assert_exact(res, 2, 2, 6, tmp_path)
    text = res.output + logs(tmp_path)
    assert "did not come in time" not in text and "not admitted within" not in text, text


def _world_member(port, who, out):
    """Process A: a world whose rendezvous fails (its peer never comes), then the next
    version's world with that peer. Process B: only the second world."""
    from executor.runtime.transport.comm import CommError, World
    from executor.runtime.transport.endpoints import connect_store
    store = connect_store("127.0.0.1", port, timeout_s=10)
    me, peer = ((0, 0), (1, 0)) if who == "A" else ((1, 0), (0, 0))
    try:
        if who == "A":
            try:
                World(store, 1, me, [me, peer], timeout_s=1.0)
                out.put((who, "v1 formed without its peer?"))
                return
            except CommError:
                store.set("a-failed", "1")
        else:
            store.wait(["a-failed"])
        w = World(store, 2, me, [me, peer], timeout_s=5.0)
        got = w.allgather_ints([7 if who == "A" else 9])
        w.close()
        out.put((who, sorted(v[0] for v in got.values())))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put((who, f"{type(exc).__name__}: {exc}"[:300]))


def test_world_forms_after_a_failed_rendezvous():
    """Cause 2: a failed rendezvous must not shift this process's store keys: the next
    version's world forms with a peer that never saw the failed one."""
    from executor.runtime.transport.endpoints import host_store
    store = host_store("127.0.0.1", 0, 10)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_world_member, args=(store.port, who, out)) for who in "AB"]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.kill()
            p.join()
    assert got == {"A": [7, 9], "B": [7, 9]}, got


def _cli(*args, timeout=60):
    return subprocess.run(RECYCLE + list(args), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, says", [
    (["--iterations", "-1"], "--iterations must be at least 1"),
    (["--iterations", "0"], "--iterations must be at least 1"),
    (["--rejoin", "7:7@2"], "no worker 7:7 in a 2x2 grid"),
    (["--kill", "0:1@5", "--iterations", "5"], "training has iterations 0..4"),
    (["--stall", "2:0@1:1", "-d", "2"], "no worker 2:0"),
    (["--timeout", "0"], "--timeout must be positive"),
])
def test_train_refuses_what_no_run_can_do(args, says):
    """Causes 4 and 6: these hung or stalled; now one line and exit code 2."""
    r = _cli("train", *args)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_resume_needs_iterations_past_the_checkpoint(tmp_path):
    """Cause 6: `--resume` of a checkpoint at iteration 3 with --iterations 4 hung forever."""
    from executor.checkpoint import Manifest
    from executor.compute.model import ModelConfig
    ck = tmp_path / "ck"
    ck.mkdir()
    Manifest(2, 2, 4, ModelConfig().to_dict(), 3, [[0.0] * 8] * 4).save(str(ck))
    for n in ("3", "4"):
        r = _cli("train", "--resume", str(ck), "--iterations", n)
        assert r.returncode == 2 and "--iterations must be more than 4" in r.stderr, r.stderr
    r = _cli("train", "--resume", str(tmp_path / "missing"))
    assert r.returncode == 2 and "no checkpoint at" in r.stderr


def _descendants(pid):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    kids.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkilled_coordinator_leaves_no_process(tmp_path):
    """Cause 7: SIGKILL `recycle train` mid-run: its forkserver and every worker go too."""
    p = subprocess.Popen(RECYCLE + ["train", "--iterations", "400", "--run-dir", str(tmp_path)],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        for line in p.stderr:  # wait until training runs: every worker is up
            if line.startswith("iter"):
                break
        kids = _descendants(p.pid)
        assert len(kids) >= 5, kids  # forkserver + 4 workers (+ resource tracker)
        p.kill()
        p.wait()
        end = time.monotonic() + 15
        while time.monotonic() < end and any(_alive(k) for k in kids):
            time.sleep(0.1)
        left = [k for k in kids if _alive(k)]
        assert not left, f"left running: {left}"
    finally:
        for k in _descendants(p.pid) + [p.pid]:
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass


def test_store_listens_on_loopback_only(tmp_path):
    """Cause 8: the coordinator's unauthenticated store must not listen on every interface."""
    from executor.launch.launcher import Coordinator
    from planner.job import JobSpec
    coord = Coordinator(LaunchSpec(CFG, JobSpec.uniform(2, 2, M), 2, run_dir=str(tmp_path)))
    port = coord.store.port
    with open("/proc/net/tcp") as fh:
        rows = [line.split() for line in fh.readlines()[1:]]
    listening = [r[1] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port]
    assert listening == [f"0100007F:{port:04X}"], listening


def test_store_holds_no_service_token(tmp_path):
    """Cause 8: the store's `config` key carried the job's worker token to anyone who could
    reach the port. Local workers get it as a process argument, torchrun'd ones from
    RECYCLE_TOKEN."""
    import json

    import httpx

    from api_support import ThreadServer, admin_headers
    from executor.launch.launcher import Coordinator
    from executor.sources.service_source import ServiceWatch
    from planner.job import JobSpec
    with ThreadServer(tmp_path / "svc.db", precompute_failures=0) as srv:
        r = httpx.post(srv.url + "/v1/jobs", headers=admin_headers(),
                       json=JobSpec.uniform(2, 2, M).model_dump(mode="json"))
        jid, token = r.json()["id"], r.json()["token"]
        watch = ServiceWatch(srv.url, jid, token)
        try:
            coord = Coordinator(LaunchSpec(CFG, watch.plan.job, 2, run_dir=str(tmp_path)),
                                service=watch)
            config = coord.store.get("config").decode()
            assert token not in config and json.loads(config)["service"]["job_id"] == jid
        finally:
            watch.close()
