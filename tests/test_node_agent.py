"""`recycle agent` end to end: a real service, a coordinator with an external store, two
node agents on loopback (two "nodes" of two workers each) that start real worker processes;
a worker SIGKILLed mid-run is reported by its agent the moment its process exits (the
service's heartbeat timeout is far longer), and training stays exact (docs/design.md
section 7). Plus the agent's bad input: a node outside the job, a second agent for a held node."""
from __future__ import annotations

import glob
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from rich.console import Console

from api_support import ROOT, ProcServer, admin_headers, free_port
from executor.launch.launcher import Coordinator
from executor.inputs.launch_spec import Faults, LaunchSpec, sections
from executor.compute.one_process.reference import compare
from executor.sources.service_source import ServiceWatch
from test_e2e_service import CFG, D, M, S, reference, register

pytestmark = pytest.mark.hard_timeout(150)
# Heartbeat timeout 20 s, suspect grace 10 s: a new plan within a second or two of a kill
# can only come from the agent's report.
# Every worker runs at a fifth of its speed (a sleep, --slow) so that the kill lands
# mid-run however fast the machine; the service's straggler detection is off (all alike).
SERVE = ("--solvers", "greedy", "--max-failures", "1", "--heartbeat-timeout", "20",
         "--suspect-grace", "10", "--speed-window", "0")
ITERATIONS = 5  # as in test_e2e_service: the reference is computed once per session
SLOW = [(r, s, 0, 0.2) for r in range(D) for s in range(S)]


class AgentProc:
    """`python -m recycle.cli agent ...` with its stderr lines collected."""

    def __init__(self, url, jid, token, node, *extra):
        rank = [] if node is None else ["--node-rank", str(node)]  # None: a new instance
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recycle.cli", "agent", "--service", url, "--job-id", jid,
             *rank, "--workers-per-node", "2", *extra],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "RECYCLE_TOKEN": token},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

    def pid_of(self, w, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.lines):
                m = re.search(rf"started worker {w[0]}:{w[1]} pid (\d+)", line)
                if m:
                    return int(m.group(1))
            time.sleep(0.05)
        raise AssertionError(f"no worker {w} started: {self.lines}")

    def wait_line(self, pattern, timeout=10.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            hit = [x for x in list(self.lines) if re.search(pattern, x)]
            if hit:
                return hit[0]
            time.sleep(0.02)
        raise AssertionError(f"no line {pattern!r}: {self.lines}")

    def stop(self, timeout=20.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def external_coordinator(tmp_path, srv, jid, token, deadline_s):
    """A coordinator of SLOW's run following the service, for workers the agents start
    (--external): the coordinator, its console's text and its store's port."""
    watch = ServiceWatch(srv.url, jid, token, timeout_s=30)
    port = free_port()
    out = io.StringIO()
    spec = LaunchSpec(CFG, watch.plan.job, ITERATIONS, Faults(slows=SLOW),
                      deadline_s=deadline_s, run_dir=str(tmp_path),
                      **sections(timeout=4.0, external=True, store_port=port))
    return Coordinator(spec, console=Console(file=out, width=200), service=watch), out, port


def test_agents_start_workers_report_a_sigkill_at_once_and_training_stays_exact(tmp_path):
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    agents = []
    try:
        jid, token = register(srv.url)
        coord, out, port = external_coordinator(tmp_path, srv, jid, token, 90)
        result = {}
        runner = threading.Thread(target=lambda: result.setdefault("res", coord.run()),
                                  daemon=True)
        runner.start()
        store = ("--store", f"127.0.0.1:{port}")
        agents = [AgentProc(srv.url, jid, token, n, *store, "--run-dir", str(tmp_path / f"n{n}"))
                  for n in (0, 1)]
        victim = agents[1].pid_of((1, 0))  # node 1 = ranks 2, 3 = workers 1:0, 1:1
        t0 = time.monotonic()
        while coord.printed < 1 and runner.is_alive() and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        assert coord.printed >= 1 and coord.printed < ITERATIONS - 2, out.getvalue()
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30) as admin:
            before = admin.get(f"/v1/jobs/{jid}/plan").json()["version"]
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            r = admin.get(f"/v1/jobs/{jid}/plan", params={"after": before, "wait": 15})
            took = time.monotonic() - killed
            assert r.status_code == 200 and r.json()["failed"] == [[1, 0]], \
                (r.text, agents[1].lines, out.getvalue())
            print(f"SIGKILL of worker 1:0 -> plan v{r.json()['version']} at the service: "
                  f"{took * 1000:.0f} ms")
            assert took < 5.0, took  # the timeout is 20 s, the suspect grace 10 s
            line = agents[1].wait_line(r"worker 1:0 \(pid \d+\) exited with signal 9: "
                                       r"failure posted, plan v\d+")
            print(line.strip())
            runner.join(90)
            assert not runner.is_alive()
            res = result["res"]
            assert res.summary is not None, f"halted: {res.halted}\n{out.getvalue()}"
            diffs = compare(res.summary, reference(ITERATIONS), 1e-5)
            assert not diffs, "\n".join(diffs) + "\n" + out.getvalue()
            events = admin.get(f"/v1/jobs/{jid}/events").json()
            assert [(e["kind"], e["replica"], e["stage"]) for e in events] == [("failure", 1, 0)]
            assert events[0]["event_id"] == f"agent-{jid}-n1-1.0-pid{victim}"  # the agent's
            assert (events[0]["source"], events[0]["incarnation"]) == ("worker", 1)
        assert agents[0].stop() == 0, agents[0].lines  # its workers all finished cleanly
        assert agents[1].stop() == 1, agents[1].lines  # one of its workers died
    finally:
        for a in agents:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait()
        srv.stop()


class HeldRun:
    """A service, SLOW's run held before iteration 2 (the coordinator's store key `hold`,
    as a due rejoin would hold it) and two agents of two workers each, once iterations 0
    and 1 are done; everything stopped on the way out."""

    def __init__(self, tmp_path):
        self.tmp_path, self.agents, self.runner, self.coord = tmp_path, [], None, None
        self.result = {}

    def __enter__(self) -> "HeldRun":
        from executor.runtime.transport.rendezvous import set_counter
        self.srv = ProcServer(self.tmp_path / "service.db", *SERVE).start()
        try:
            self.jid, self.token = register(self.srv.url)
            self.coord, self.out, port = external_coordinator(
                self.tmp_path, self.srv, self.jid, self.token, 120)
            set_counter(self.coord.store, "hold", 3)  # every worker waits before iteration 2
            self.runner = threading.Thread(
                target=lambda: self.result.setdefault("res", self.coord.run()), daemon=True)
            self.runner.start()
            self.store = ("--store", f"127.0.0.1:{port}")
            self.agents += [self.agent(n, f"n{n}") for n in (0, 1)]
        except BaseException:
            self.__exit__()
            raise
        return self

    def agent(self, node, run_dir: str) -> AgentProc:
        """An agent of node `node` (None: a new instance) for this run."""
        return AgentProc(self.srv.url, self.jid, self.token, node, *self.store, "--run-dir",
                         str(self.tmp_path / run_dir))

    def wait_held(self) -> None:
        t0 = time.monotonic()
        while self.coord.printed < 1 and self.runner.is_alive() and time.monotonic() - t0 < 90:
            time.sleep(0.01)
        assert self.coord.printed == 1, self.out.getvalue()  # iterations 0, 1, then the hold

    def release(self):
        """Let the run go on; its result once it ended."""
        from executor.runtime.transport.rendezvous import set_counter
        set_counter(self.coord.store, "hold", 0)
        self.runner.join(90)
        assert not self.runner.is_alive()
        res = self.result["res"]
        assert res.summary is not None, f"halted: {res.halted}\n{self.out.getvalue()}"
        return res

    def __exit__(self, *exc) -> None:
        if self.coord is not None:
            self.coord.stop()
        if self.runner is not None:
            self.runner.join(20)
        for a in self.agents:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait()
        self.srv.stop()


def test_a_preempted_node_is_removed_at_once_and_a_new_node_takes_its_ids(tmp_path):
    """Spot instances: node 1's agent gets its preemption notice (SIGTERM) and posts a node
    remove, one plan version without both its workers; a new instance's agent, started with
    no node rank, posts a node add, is given node 1 (its workers' ids are the dead ones) and
    its workers join as new incarnations with no state, loading it from live peers. The
    test holds iteration 2 until both are back, so the whole story happens mid-run every
    time. Exact."""
    with HeldRun(tmp_path) as run:
        jid, agents, out = run.jid, run.agents, run.out
        run.wait_held()
        with httpx.Client(base_url=run.srv.url, headers=admin_headers(), timeout=30) as admin:
            agents[1].proc.send_signal(signal.SIGTERM)
            assert agents[1].stop() == 0, ''.join(agents[1].lines)
            agents[1].wait_line(r"preemption notice: node removed, plan v1$")
            plan = admin.get(f"/v1/jobs/{jid}/plan").json()
            assert plan["version"] == 1 and plan["failed"] == [[1, 0], [1, 1]]
            new = run.agent(None, "new")
            agents.append(new)
            new.wait_line(rf"joined job {jid} as node 1: workers 1:0 1:1", timeout=30)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:  # both join (a recovery each): v2, v3
                plan = admin.get(f"/v1/jobs/{jid}/plan").json()
                if plan["failed"] == [] and plan["incarnations"] == [[1, 1], [2, 2]]:
                    break
                time.sleep(0.05)
            assert plan["failed"] == [] and plan["incarnations"] == [[1, 1], [2, 2]], \
                (plan["failed"], new.lines, out.getvalue())
            res = run.release()
            diffs = compare(res.summary, reference(ITERATIONS), 1e-5)
            assert not diffs, "\n".join(diffs) + "\n" + out.getvalue()
            events = admin.get(f"/v1/jobs/{jid}/events").json()
            kinds = [(e["kind"], e["replica"], e["stage"]) for e in events]
            assert kinds[:2] == [("remove", None, None), ("add", None, None)], events
            assert sorted(kinds[2:]) == [("recovery", 1, 0), ("recovery", 1, 1)], events
            assert events[0]["workers"] == [{"replica": 1, "stage": s, "incarnation": 1}
                                            for s in (0, 1)]
            assert (events[1]["node_rank"], events[1]["workers"]) == (
                1, [{"replica": 1, "stage": s, "incarnation": 2} for s in (0, 1)])
        logs = "".join(open(f).read() for f in sorted(glob.glob(str(tmp_path / "new" / "*.log"))))
        assert "loaded stage 0 state from worker (0, 0)" in logs, logs
        assert agents[0].stop() == 0 and new.stop() == 0, agents[0].lines + new.lines


def test_a_preempted_node_and_a_kill_leave_one_worker_the_service_cuts_the_pipeline(tmp_path):
    """Node agents and shapes: node 1 is preempted (its agent posts a remove) and worker 0:1
    on node 0 is SIGKILLed (its agent posts the failure) while every worker waits before
    iteration 2; one live worker is left for two stages. The service (shape auto, its
    default) cuts the pipeline to one stage; 0:0 builds the whole model, takes stage 1's
    state from peer memory (or the seed) and trains to the end alone, exact."""
    with HeldRun(tmp_path) as run:
        jid, agents, out = run.jid, run.agents, run.out
        victim = agents[0].pid_of((0, 1))
        run.wait_held()
        with httpx.Client(base_url=run.srv.url, headers=admin_headers(), timeout=30) as admin:
            agents[1].proc.send_signal(signal.SIGTERM)
            assert agents[1].stop() == 0, agents[1].lines
            os.kill(victim, signal.SIGKILL)
            agents[0].wait_line(r"worker 0:1 \(pid \d+\) exited with signal 9: failure "
                                r"posted, plan v\d+", timeout=30)
            plan = admin.get(f"/v1/jobs/{jid}/plan").json()
            assert plan["partition"]["bounds"] == [0, 2], plan
            assert [x["worker"] for x in plan["roles"]] == ["0.0"], plan["roles"]
            res = run.release()
            diffs = compare(res.summary, reference(ITERATIONS), 1e-5)
            assert not diffs, "\n".join(diffs) + "\n" + out.getvalue()
            job = admin.get(f"/v1/jobs/{jid}").json()
            assert job["state"] == "finished", job
        logs = "".join(open(f).read() for f in sorted(glob.glob(str(tmp_path / "n0" / "*.log"))))
        assert "changed shape" in logs, logs


FAKE_WORKER = """
import os, sys, time
from executor.sources.http_source import HttpPlanSource
url, job, token = sys.argv[1:]
src = HttpPlanSource(url, job, token, headers={"X-Recycle-Pid": str(os.getpid())})
src.heartbeat(0, 1, 0, 1)
print("beating", flush=True)
while True:
    time.sleep(0.3)
    src.heartbeat(0, 1, 0, 1)
"""


def test_attached_agent_reports_a_kill_and_bad_input_is_one_line(tmp_path):
    srv = ProcServer(tmp_path / "service.db", "--solvers", "greedy", "--max-failures", "0",
                     "--heartbeat-timeout", "20").start()
    try:
        jid, token = register(srv.url)  # 4 workers: nodes 0..1 at 2 per node
        held = AgentProc(srv.url, jid, token, 0, "--attach")
        try:
            held.wait_line(r"node 0 of job \w+: workers 0:0 0:1")
            runs = {
                "outside": ["--node-rank", "2", "--attach"],
                "second": ["--node-rank", "0", "--attach"],
                "no-store": ["--node-rank", "1"],
            }
            for name, args in runs.items():
                p = subprocess.run(
                    [sys.executable, "-m", "recycle.cli", "agent", "--service", srv.url,
                     "--job-id", jid, "--workers-per-node", "2", *args], cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "RECYCLE_TOKEN": token},
                    capture_output=True, text=True, timeout=60)
                err = p.stderr.strip()
                assert p.returncode == 2 and len(err.splitlines()) == 1, (name, p.stderr)
                assert "Traceback" not in err
                if name == "outside":
                    assert err == (f"error: the plan service refused node 2 (422): node rank 2 "
                                   f"is outside job {jid}: its 4 workers at 2 per node make "
                                   "nodes 0..1")
                elif name == "second":
                    assert err.startswith(f"error: the plan service refused node 0 (409): node "
                                          f"0 of job {jid} is held by agent "), err
                else:
                    assert err.startswith("error: no store address"), err
            # Attached (torchrun starts the workers): a process that heartbeats to the agent
            # as a worker does (executor/sources/http_source.py, with its pid) and is SIGKILLed is
            # reported by the agent from the pid alone.
            local = re.search(r"local channel (http://\S+)", held.lines[0]).group(1)
            fake = subprocess.Popen([sys.executable, "-c", FAKE_WORKER, local, jid, token],
                                    cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                    stdout=subprocess.PIPE, text=True)
            try:
                assert fake.stdout.readline().strip() == "beating"
                time.sleep(1.5)  # the agent has its pid and has beaten for it
                with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30) as a:
                    killed = time.monotonic()
                    fake.kill()
                    r = a.get(f"/v1/jobs/{jid}/plan", params={"after": 0, "wait": 15})
                    assert r.status_code == 200 and r.json()["failed"] == [[0, 1]], r.text
                    assert time.monotonic() - killed < 5.0  # the heartbeat timeout is 20 s
            finally:
                fake.kill()
                fake.wait()
            held.wait_line(rf"worker 0:1 \(pid {fake.pid}\) exited \(seen gone\): failure "
                           r"posted, plan v1")
            # SIGTERM: the agent gives its node back, so another may claim it at once
            held.proc.send_signal(signal.SIGTERM)
            assert held.stop() == 1, held.lines  # 1: one of its workers died
            r = httpx.post(f"{srv.url}/v1/jobs/{jid}/nodes/0/attach",
                           headers={"Authorization": f"Bearer {token}"},
                           json={"agent_id": "next", "workers_per_node": 2})
            assert r.status_code == 200, r.text
        finally:
            if held.proc.poll() is None:
                held.proc.kill()
                held.proc.wait()
    finally:
        srv.stop()


def test_a_finished_run_through_agents_ends_with_every_process_exiting_0(tmp_path):
    # `recycle train --external --service` in a process of its own: its store goes with it.
    # It used to exit as soon as training was done, while the workers still read the store
    # for the end marker: every worker crashed (DistNetworkError, then SIGABRT), the agents
    # exited 1 and, with --max-restarts, restarted workers onto a store that was gone.
    srv = ProcServer(tmp_path / "service.db", *SERVE).start()
    agents, coord = [], None
    try:
        jid, token = register(srv.url)
        port = free_port()
        clog = open(tmp_path / "coordinator.log", "w")
        coord = subprocess.Popen(
            [sys.executable, "-m", "recycle.cli", "train", "--external", "--service", srv.url,
             "--job-id", jid, "--store-port", str(port), "--iterations", "3", "--timeout", "4",
             "--run-dir", str(tmp_path / "run"), "--vocab", "32", "--seq-len", "8",
             "--d-model", "16", "--heads", "2", "--layers", "2", "--micro-batch-size", "2"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "RECYCLE_TOKEN": token},
            stdout=clog, stderr=subprocess.STDOUT)
        clog.close()
        agents = [AgentProc(srv.url, jid, token, n, "--store", f"127.0.0.1:{port}",
                            "--max-restarts", "1", "--run-dir", str(tmp_path / f"n{n}"))
                  for n in (0, 1)]
        # node 1's workers (not the checkpoint writers, whose last parts it waits for)
        pids = [agents[1].pid_of(w) for w in ((1, 0), (1, 1))]
        # Slow workers at the end: stopped the moment the service hears training is done,
        # before they can have seen the coordinator's end marker; the coordinator must wait
        # for them (it used to exit at once: a race its workers lost on a quiet machine).
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30) as admin:
            t0 = time.monotonic()
            while (admin.get(f"/v1/jobs/{jid}").json()["state"] != "finished"
                   and coord.poll() is None and time.monotonic() - t0 < 90):
                time.sleep(0.005)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(2.0)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        assert coord.wait(100) == 0, (tmp_path / "coordinator.log").read_text()
        try:
            codes = [a.stop(30) for a in agents]
        except subprocess.TimeoutExpired:  # e.g. it restarted a worker after the end
            raise AssertionError(f"an agent did not exit: {agents[0].lines + agents[1].lines}")
        lines = agents[0].lines + agents[1].lines
        assert codes == [0, 0], lines
        exits = [x for x in lines if re.search(r"worker \d:\d \(pid \d+\) exited", x)]
        assert len(exits) == 4 and all("exited with code 0" in x for x in exits), lines
        assert sum("started worker" in x for x in lines) == 4, lines  # no restart
        for n in (0, 1):
            for log in (tmp_path / f"n{n}").glob("worker-*.log"):
                text = log.read_text()
                assert "training complete" in text and "Traceback" not in text, text
    finally:
        for p in [a.proc for a in agents] + ([coord] if coord else []):
            if p.poll() is None:
                p.kill()
                p.wait()
        srv.stop()
