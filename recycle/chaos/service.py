"""A real `recycle serve` on loopback for a chaos run: started, SIGKILLed, restarted on the
same DB and port, and stopped, each time as its own process session carrying the run's tag.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Optional

from planner.control import routes as R
from recycle.chaos.leaks import kill_group, tagged_env
from recycle.chaos.schedule import ServiceOutage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, db: str, log_path: str, tag: str, snapshots: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = secrets.token_hex(16)
        # Default settings otherwise (heartbeat timeout 10 s, plans for peer-memory
        # snapshots): the service as users run it. The token goes by environment: command
        # lines show in `ps` and in the records. A run with snapshots off (an explicit
        # `--snapshot-every 0`) needs a service that does not plan restores from them.
        self.cmd = [sys.executable, "-m", "recycle.cli", "serve", "--db", db,
                    "--port", str(self.port)] + ([] if snapshots else ["--no-elastic-snapshots"])
        self.log_path, self.tag = log_path, tag
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         env={**tagged_env(self.tag),
                                              "RECYCLE_ADMIN_TOKEN": self.admin},
                                         start_new_session=True)
        self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"recycle serve exited with code {self.proc.returncode} "
                                   f"(log: {self.log_path})")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"recycle serve did not answer /healthz in {timeout_s:g} s")

    def register(self, spec: dict, shape: str = "auto") -> tuple[str, str]:
        """POST /v1/jobs (docs/api.md): returns (job id, worker token). `shape` "fixed"
        for a run that cannot change the pipeline's shape (the run refuses an auto job)."""
        query = "" if shape == "auto" else f"?shape={shape}"
        req = urllib.request.Request(
            self.url + R.JOBS.url() + query, data=json.dumps(spec).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.admin}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        return body["id"], body["token"]

    def sigkill(self) -> None:
        """The crash under test: the service process only (its solver children die with
        it, planner/procs.py); whatever else outlives it is for the leak scan to find."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc.pid)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


class OutageThread(threading.Thread):
    """SIGKILLs the service `at_s` after the run started and restarts it `outage_s` later,
    unless the run ended first. Records what happened and when, for the report."""

    def __init__(self, service: Service, outage: ServiceOutage, done: threading.Event):
        super().__init__(daemon=True, name="chaos-service-outage")
        self.service, self.outage, self.done = service, outage, done
        self.t0 = time.monotonic()
        self.killed_at: Optional[float] = None
        self.restarted_at: Optional[float] = None
        self.error: Optional[str] = None
        self.killed_epoch: Optional[float] = None  # wall clock, to match recovery entries' "at"
        self.restarted_epoch: Optional[float] = None

    def run(self) -> None:
        if self.done.wait(self.outage.at_s):
            return
        self.service.sigkill()
        self.killed_at = time.monotonic() - self.t0
        self.killed_epoch = time.time()
        if self.done.wait(self.outage.outage_s):
            return
        try:
            self.service.start()
            self.restarted_at = time.monotonic() - self.t0
            self.restarted_epoch = time.time()
        except (RuntimeError, TimeoutError, OSError) as exc:
            self.error = f"restart failed: {exc}"

    def record(self) -> dict:
        return {"planned_at_s": self.outage.at_s, "planned_outage_s": self.outage.outage_s,
                "killed_at_s": _r(self.killed_at), "restarted_at_s": _r(self.restarted_at),
                "killed_epoch": self.killed_epoch, "restarted_epoch": self.restarted_epoch,
                "error": self.error}


def _r(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)
