"""Real uvicorn servers on 127.0.0.1 for the API tests: in a thread, or in a subprocess
(for kill -9 tests). Free ports are picked by binding port 0."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx

from api.server import Server

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "admin-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(D=4, S=4, M=8, **kw) -> dict:
    from planner.job import JobSpec
    return JobSpec.uniform(D, S, M, **kw).model_dump(mode="json")


def admin_headers(token: str = ADMIN) -> dict:
    return {"Authorization": f"Bearer {token}"}


def register_job(admin: httpx.Client, shape: Optional[str] = None, **kw) -> tuple[str, str]:
    """A job of spec(**kw) registered with the admin client: (job id, worker token)."""
    r = admin.post("/v1/jobs", json=spec(**kw), params={"shape": shape} if shape else None)
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["token"]


def token_client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Bearer {token}"})


def wait_healthy(url: str, timeout: float = 30.0, proc=None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not come up")


class ThreadServer:
    """create_app(...) served by uvicorn in a background thread."""

    def __init__(self, db_path: str, **kw):
        from api.app import create_app
        kw.setdefault("solvers", ("greedy",))
        self.app = create_app(str(db_path), ADMIN, **kw)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = Server(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                             lifespan="on")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        wait_healthy(self.url)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    @property
    def service(self):
        return self.app.state.service


class ProcServer:
    """`python -m api serve` in a subprocess; kill() sends SIGKILL."""

    def __init__(self, db_path: str, *args: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "api", "serve", "--db", str(db_path), "--port",
                    str(self.port), "--admin-token", ADMIN, "--log-level", "warning", *args]
        self.proc = None

    def start(self) -> "ProcServer":
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        wait_healthy(self.url, proc=self.proc)
        return self

    def kill(self) -> None:
        import signal
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
