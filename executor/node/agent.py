"""`recycle agent`: one per machine, between that node's workers and the service.

What it does for its node (ranks `node * per_node` onwards, as torchrun numbers them):
  - starts the node's workers (`python -m executor.worker`), or with `attach` serves
    workers someone else started (torchrun) that find it by RECYCLE_AGENT;
  - heartbeats for all of them in one request per interval (POST .../nodes/{n}/heartbeats),
    from the heartbeats they send it over the local channel (local.py): a worker that stops
    beating locally (hung) is left out, so the service still times it out;
  - long-polls once for the node (GET .../nodes/{n}/plan) and answers its workers' plan
    long-polls from that: their share from the node's share, the whole plan (what the
    executor's workers take) fetched once per version for the node;
  - sees a local worker's process exit at once (its child, or for attached workers the pid
    they announce) and posts that worker's failure with its incarnation: no heartbeat
    timeout to wait out;
  - machines come and go (docs/api.md, "Node events"): on a preemption notice (SIGTERM, as
    spot instances get) it posts a node remove for its workers, one plan version without
    them all, before it stops them; started with no node rank (a new instance), it posts a
    node add and serves the vacant node the service gives it, whose workers then join
    (each a new incarnation of a dead worker's id, with no state).
Workers without an agent talk to the service themselves as before; nothing in the service
depends on agents.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

import httpx

from executor.node.changes import AgentError, NodeChanges, _detail
from executor.node.local import LocalChannel
from executor.runtime.transport.waiting import retried
from executor.timeouts import Timeouts
from planner.control import routes as R
from planner.control.routes import Route

log = logging.getLogger("recycle.agent")
Worker = tuple[int, int]
POLL_S = 30.0


def worker_share(share: dict, worker: Worker) -> dict:
    """A local worker's share (what the service's /workers/{r}/{s}/plan gives) from the
    node's: its entry, the shared fields, and the route rows of its own micro-batches."""
    entry = next(w for w in share["workers"] if (w["replica"], w["stage"]) == worker)
    mine = sorted({a["microbatch"] for a in entry["actions"] if a["microbatch"] is not None})
    common = {k: v for k, v in share.items() if k not in ("node_rank", "workers")}
    return {**entry, **common, "routes": {str(g): share["routes"][str(g)] for g in mine}}


def _alive(pid: int) -> bool:
    """A process of ours or not: gone, or a zombie its parent has not reaped yet, is dead."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


class NodeAgent(NodeChanges):
    def __init__(self, service: str, job_id: str, token: str, node: Optional[int], *,
                 per_node: int = 8,
                 store: Optional[str] = None, attach: bool = False, local_port: int = 0,
                 interval_s: float = 1.0, run_dir: Optional[str] = None, max_restarts: int = 0,
                 say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)):
        if not attach and not store:
            raise AgentError("no store address: pass --store HOST:PORT (the coordinator's, "
                             "`recycle train --external --store-port`) or --attach")
        self.job_id, self.token, self.node, self.per_node = job_id, token, node, per_node
        self.store, self.attach, self.interval = store, attach, interval_s
        self.max_restarts, self.say = max_restarts, say
        self.patience_s = Timeouts().service_outage  # each call to a restarting service
        self.run_dir = run_dir or tempfile.mkdtemp(prefix=f"recycle-agent{'' if node is None else node}-")
        os.makedirs(self.run_dir, exist_ok=True)
        self.agent_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        headers = {"Authorization": f"Bearer {token}"}
        base = service.rstrip("/")
        self.api = httpx.Client(base_url=base, headers=headers, timeout=10.0)  # beats, events
        self.poller = httpx.Client(base_url=base, headers=headers, timeout=10.0)
        self.local = LocalChannel(self, local_port)
        self.cells: list[Worker] = []
        self.timeout_s = 10.0
        self.cond = threading.Condition()
        self.version, self.share = -1, None        # the node's share of the newest version
        self.state, self.halted, self.lost = "running", None, None
        self._full: tuple[int, bytes] = (-1, b"")  # the whole plan, newest fetched version
        self._full_lock = threading.Lock()
        self.beats: dict[Worker, tuple[float, dict]] = {}
        self.refused: dict[tuple[Worker, Optional[int]], str] = {}
        self.incs: dict[Worker, Optional[int]] = {}
        self.pids: dict[Worker, int] = {}          # announced by workers (attach mode)
        self.procs: dict[Worker, subprocess.Popen] = {}
        self.restarts: dict[Worker, int] = {}
        self.reports: list[dict] = []              # deaths seen and what the service said
        self.replaced: Optional[str] = None
        self.stopping = threading.Event()
        self.preempted = threading.Event()  # a preemption notice: remove the node first

    # ---- the service -------------------------------------------------------------------
    def _claim_body(self) -> dict:
        return {"agent_id": self.agent_id, "workers_per_node": self.per_node}

    def claim(self) -> None:
        """Claim the node (AgentError with the service's reason if it refuses)."""
        r = self._post(R.NODE_ATTACH, self._claim_body())
        if r.status_code != 200:
            raise AgentError(f"the plan service refused node {self.node} "
                             f"({r.status_code}): {_detail(r)}")
        body = r.json()
        self.cells = [(w["replica"], w["stage"]) for w in body["workers"]]
        self.timeout_s = body["timeout_s"]
        self.say(f"agent {self.agent_id}: node {self.node} of job {self.job_id}: workers "
                 f"{' '.join(f'{r}:{s}' for r, s in self.cells)}; local channel {self.local.url}")

    def _poll_loop(self) -> None:
        """One long-poll for the node; wakes the workers' local long-polls."""
        backoff = 0.05
        while not self.stopping.is_set():
            try:
                r = self.poller.get(self.url(R.NODE_PLAN), params={
                    "after": self.version, "wait": POLL_S, "workers_per_node": self.per_node},
                    timeout=httpx.Timeout(10.0, read=POLL_S + 10.0))
            except httpx.TransportError:
                self.stopping.wait(backoff)
                backoff = min(2 * backoff, 1.0)
                continue
            backoff = 0.05
            if r.status_code == 200:
                share = r.json()
                with self.cond:
                    if share["version"] > self.version:
                        self.version, self.share = share["version"], share
                        self.cond.notify_all()
            elif r.status_code == 410:
                with self.cond:
                    self.halted = r.json()
                    self.cond.notify_all()
                self.say(f"agent node {self.node}: training halted: {self.halted.get('detail')}")
                return
            elif r.status_code != 204:
                with self.cond:
                    self.lost = (r.status_code, _detail(r))
                    self.cond.notify_all()
                self.stopping.wait(1.0)

    def _beat_loop(self) -> None:
        """One heartbeat per interval for every worker that beat locally of late."""
        while not self.stopping.wait(self.interval):
            fresh_s = 2 * self.interval + 0.5
            now = time.monotonic()
            with self.cond:
                live = [b for t, b in self.beats.values() if now - t < fresh_s]
            try:
                r = self.api.post(self.url(R.NODE_BEAT),
                                  json={**self._claim_body(), "workers": live})
            except httpx.TransportError:
                continue
            if r.status_code == 200:
                body = r.json()
                with self.cond:
                    self.state = body["state"]
                    self.refused = {((x["replica"], x["stage"]),
                                     next((b.get("incarnation") for b in live
                                           if (b["replica"], b["stage"]) ==
                                           (x["replica"], x["stage"])), None)): x["detail"]
                                    for x in body["refused"]}
            elif r.status_code == 409 and "held by agent" in _detail(r):
                self.replaced = _detail(r)  # another agent has our node: stand down
                self.say(f"agent node {self.node}: replaced: {self.replaced}")
                self.stopping.set()
            elif r.status_code == 410:
                self.state = "halted"
            else:
                log.warning("node heartbeat refused (%s): %s", r.status_code, _detail(r))

    def forward(self, route: Route, raw: bytes) -> tuple[int, bytes]:
        """A worker's suspect report, event or finish, to the service as it came."""
        try:
            r = self.api.post(self.url(route), content=raw,
                              headers={"Content-Type": "application/json"})
        except httpx.TransportError as e:
            return 503, json.dumps({"detail": f"agent: plan service unreachable: {e}"}).encode()
        return r.status_code, r.content

    # ---- the local channel -------------------------------------------------------------
    def local_plan(self, after: Optional[int], wait: float, worker: Optional[Worker],
                   pid: Optional[str]):
        """(status, body, version) for a worker's long-poll (local.py)."""
        with self.cond:
            self.cond.wait_for(lambda: (self.halted or self.lost or self.stopping.is_set()
                                        or (self.share is not None
                                            and (after is None or self.version > after))),
                               timeout=wait)
            if self.halted:
                return 410, json.dumps(self.halted).encode(), None
            if self.lost:
                return self.lost[0], json.dumps({"detail": self.lost[1]}).encode(), None
            if self.share is None or (after is not None and self.version <= after):
                return 204, b"", None
            share, version = self.share, self.version
        if worker is not None:
            return 200, json.dumps(worker_share(share, worker)).encode(), version
        return 200, self._whole(version), version

    def _whole(self, version: int) -> bytes:
        """The whole plan of `version`, fetched once for the node's workers."""
        with self._full_lock:
            if self._full[0] != version:
                r = self.api.get(R.PLAN_VERSION.url(job_id=self.job_id, version=version))
                r.raise_for_status()
                self._full = (version, r.content)
            return self._full[1]

    def local_beat(self, w: Worker, body: dict, pid: Optional[str]) -> tuple[int, dict]:
        if w not in self.cells:
            return 422, {"detail": f"worker {w[0]}:{w[1]} is not on node {self.node}"}
        inc = body.get("incarnation")
        with self.cond:
            if pid and pid.isdigit():
                self.pids[w] = int(pid)
            if w in self.procs and pid and int(pid) != self.procs[w].pid:
                return 409, {"detail": f"pid {pid} is not this agent's worker {w[0]}:{w[1]}"}
            self.beats[w] = (time.monotonic(), body)
            self.incs[w] = inc
            why = self.refused.get((w, inc))
            state, version = self.state, self.version
        if why:
            return 409, {"detail": why}
        if state == "halted":
            return 410, {"detail": "job halted", "state": "halted"}
        return 200, {"state": state, "plan_version": version, "timeout_s": self.timeout_s,
                     "incarnation": inc or 1}

    # ---- the node's processes ----------------------------------------------------------
    def spawn(self, w: Worker) -> None:
        from planner.procs import die_with_parent
        env = {**os.environ, "RECYCLE_AGENT": self.local.url, "RECYCLE_TOKEN": self.token,
               "LOCAL_RANK": str(self.cells.index(w))}
        logf = open(os.path.join(self.run_dir, f"worker-{w[0]}-{w[1]}.log"), "ab")
        p = subprocess.Popen([sys.executable, "-m", "executor.worker", "--store", self.store,
                              "--replica", str(w[0]), "--stage", str(w[1])], env=env,
                             stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=die_with_parent)
        logf.close()
        self.procs[w] = p
        self.say(f"agent node {self.node}: started worker {w[0]}:{w[1]} pid {p.pid}")

    def died(self, w: Worker, pid: int, how: str, clean: bool) -> None:
        """A local worker's process is gone: tell the service now, with its incarnation."""
        seen = time.monotonic()
        with self.cond:
            self.beats.pop(w, None)  # never beat for a dead process
            inc = self.incs.pop(w, None)
            self.pids.pop(w, None)
        if clean:
            self.say(f"agent node {self.node}: worker {w[0]}:{w[1]} (pid {pid}) exited {how}")
            return
        body = {"event_id": f"agent-{self.job_id}-n{self.node}-{w[0]}.{w[1]}-pid{pid}",
                "kind": "failure", "replica": w[0], "stage": w[1],
                "reason": f"node agent {self.node}: process {pid} exited ({how})"}
        if inc is not None:
            body["incarnation"] = inc
        status, answer = 0, {}
        try:  # the service may be restarting
            r = retried(lambda: self.api.post(self.url(R.EVENTS), json=body),
                        "a worker's failure", patience_s=self.patience_s,
                        retry_on=(httpx.TransportError,), first_s=0.2,
                        stop=self.stopping.is_set)
            status, answer = r.status_code, (r.json() if r.content else {})
        except (httpx.TransportError, ValueError) as e:
            answer = {"detail": f"plan service unreachable: {e}"}
        ms = (time.monotonic() - seen) * 1000
        report = {"worker": list(w), "pid": pid, "how": how, "incarnation": inc,
                  "status": status, "plan_version": answer.get("plan_version"), "ms": ms}
        self.reports.append(report)
        if status == 200:
            self.say(f"agent node {self.node}: worker {w[0]}:{w[1]} (pid {pid}) exited {how}: "
                     f"failure posted, plan v{answer['plan_version']} ({ms:.0f} ms)")
        else:
            self.say(f"agent node {self.node}: worker {w[0]}:{w[1]} (pid {pid}) exited {how}; "
                     f"failure not applied ({status}): {answer.get('detail', answer)}")
        # Never after the end: a restarted worker would wait for a coordinator that is gone
        ended = self.state == "finished" or (status == 409 and str(answer.get("detail", ""))
                                              .startswith("job is finished"))
        if not self.attach and not ended and self.restarts.get(w, 0) < self.max_restarts:
            self.restarts[w] = self.restarts.get(w, 0) + 1
            self.spawn(w)  # the new process takes the next incarnation and asks back in

    def _watch(self) -> bool:
        """One look at the node's processes; False once there is nothing left to watch."""
        for w, p in list(self.procs.items()):
            code = p.poll()
            if code is not None:
                del self.procs[w]
                how = f"with signal {-code}" if code < 0 else f"with code {code}"
                self.died(w, p.pid, how, clean=code == 0)
        if self.attach:
            with self.cond:
                pids = dict(self.pids)
            for w, pid in pids.items():
                if not _alive(pid):
                    self.died(w, pid, "(seen gone)", clean=self.state == "finished")
            return not self.stopping.is_set()
        return bool(self.procs) and not self.stopping.is_set()

    def run(self) -> int:
        """Claim, serve and watch until the node's workers are done. 0: they all exited
        cleanly; 1: some failed or the agent was replaced."""
        self.local.start()
        if self.node is None:
            self.join()
        self.claim()
        threads = [threading.Thread(target=f, daemon=True, name=n)
                   for f, n in ((self._poll_loop, "agent-poll"), (self._beat_loop, "agent-beat"))]
        for t in threads:
            t.start()
        try:
            if not self.attach:
                for w in self.cells:
                    self.spawn(w)
            while self._watch():
                time.sleep(0.02)
        finally:
            self.stopping.set()
            with self.cond:
                self.cond.notify_all()
            if self.preempted.is_set():  # before the workers go: one version without them
                self.remove_node()
            for p in self.procs.values():
                p.kill()
                p.wait()
            try:
                self.api.post(self.url(R.NODE_DETACH), json=self._claim_body())
            except httpx.TransportError:
                pass
            self.local.close()
            self.api.close()
        failed = [r for r in self.reports if r["status"] != 0]
        return 1 if self.replaced or failed else 0
