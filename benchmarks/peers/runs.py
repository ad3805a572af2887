"""One run of each system on the same model, data and kill, and the figures of a run.

`recycle_run` drives the `recycle train` CLI (its own --kill); `torchft_run` starts the
torchft lighthouse (the Rust binary the wheel ships) and one torchft_replica.py process
per replica. Both return a Run: the wall time at which each optimizer step ended, the
samples it trained, the global loss of each step and the time of the kill.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
ITER_LINE = re.compile(r"^iter\s+(\d+)\s+loss\s+([0-9.]+)")


@dataclass
class Setup:
    replicas: int
    microbatches: int
    iterations: int
    model: dict  # ModelConfig fields and the lr (the project's GPT; vocab from the token file)
    data: str
    kill_at: int  # -1: no failure; else replica 1 is SIGKILLed mid-iteration kill_at
    timeout: float

    @property
    def batch(self) -> int:  # samples in one global batch
        return self.replicas * self.microbatches * self.model["micro_batch_size"]


@dataclass
class Run:
    system: str
    kill: bool
    step_end: dict = field(default_factory=dict)  # step -> wall time its update ended
    samples: dict = field(default_factory=dict)   # step -> samples in its update
    losses: dict = field(default_factory=dict)    # step -> global loss (mean of the samples')
    t_kill: Optional[float] = None
    wall: float = 0.0  # the whole command, start-up included
    checksum: Optional[float] = None
    error: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, "RECYCLE_THREADS": "1"}


def recycle_run(st: Setup, workdir: str) -> Run:
    run = Run("recycle", st.kill_at >= 0)
    m = st.model
    summary = os.path.join(workdir, "summary.json")
    cmd = [PY, "-m", "recycle.cli", "train", "--data", st.data, "-d", str(st.replicas),
           "-s", "1", "-m", str(st.microbatches), "--iterations", str(st.iterations),
           "--d-model", str(m["d_model"]), "--layers", str(m["n_layers"]),
           "--heads", str(m["n_heads"]), "--seq-len", str(m["seq_len"]),
           "--micro-batch-size", str(m["micro_batch_size"]), "--lr", str(m["lr"]),
           "--timeout", str(st.timeout), "--device", "cpu", "--summary", summary,
           "--run-dir", os.path.join(workdir, "run"),
           # as torchft here: no periodic checkpoint (only the last), and with S=1 no
           # pipeline bubble for a deferred W to fill, so the fused backward
           "--checkpoint-every", str(st.iterations), "--no-split"]
    if st.kill_at >= 0:
        cmd += ["--kill", f"1:0@{st.kill_at}"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    for line in proc.stdout:  # an iteration's line comes once its step is done
        now = time.time()
        out.append(line)
        hit = ITER_LINE.match(line.strip())
        if hit:
            run.step_end[int(hit.group(1))] = now
    proc.wait()
    run.wall = time.time() - t0
    if proc.returncode != 0:
        run.error = f"exit {proc.returncode}: {''.join(out[-5:])}"
        return run
    with open(summary) as fh:
        s = json.load(fh)
    run.losses = dict(enumerate(s["losses"]))
    # every iteration trains the global batch. Its line, which times it, is printed at most
    # every 0.25 s, but always for the first and last iteration and the first under a new
    # plan: all that figures() reads.
    run.samples = {i: st.batch for i in run.losses}
    run.checksum = sum(s["param_checksums"])
    kills = [r for r in s.get("recovery") or [] if r["kind"] == "kill"]
    run.t_kill = kills[0]["at"] if kills else None
    return run


def torchft_run(st: Setup, workdir: str) -> Run:
    run = Run("torchft", st.kill_at >= 0)
    lh_bin = shutil.which("torchft_lighthouse", path=os.path.dirname(PY)) or "torchft_lighthouse"
    port = _free_port()
    t0 = time.time()
    lighthouse = subprocess.Popen(
        [lh_bin, "--min_replicas", "1", "--bind", f"127.0.0.1:{port}",
         "--join_timeout_ms", str(JOIN_TIMEOUT_MS), "--quorum_tick_ms", str(QUORUM_TICK_MS),
         "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS)],
        stdout=open(os.path.join(workdir, "lighthouse.log"), "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    cfg = json.dumps(st.model | {"data": st.data, "total_iters": st.iterations})
    logs = [os.path.join(workdir, f"replica-{d}.jsonl") for d in range(st.replicas)]
    procs = []
    try:
        for d in range(st.replicas):
            kill = st.kill_at if (d == 1 and st.kill_at >= 0) else -1
            procs.append(subprocess.Popen(
                [PY, os.path.join(ROOT, "benchmarks", "peers", "torchft_replica.py"),
                 "--replica", str(d), "--microbatches", str(st.microbatches),
                 "--iterations", str(st.iterations), "--config", cfg,
                 "--lighthouse", f"http://127.0.0.1:{port}", "--log", logs[d],
                 "--kill-at", str(kill), "--timeout", str(st.timeout)],
                cwd=ROOT, env=_env(), stdout=open(logs[d] + ".out", "w"),
                stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.time() + 600
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
    finally:
        for p in procs + [lighthouse]:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    run.wall = time.time() - t0
    rows = []
    for d, path in enumerate(logs):
        with open(path) as fh:
            rows += [{**json.loads(ln), "replica": d} for ln in fh if ln.strip()]
    if procs[0].returncode != 0:
        run.error = f"replica 0 exit {procs[0].returncode}; see {logs[0]}.out"
        return run
    per_step: dict = {}
    for r in rows:
        if "kill" in r:
            run.t_kill = r["kill"]
        if r.get("committed"):
            per_step.setdefault(r["step"], []).append(r)
        if "checksum" in r and r["replica"] == 0:
            run.checksum = r["checksum"]
    for step, rs in per_step.items():
        run.step_end[step] = max(r["t"] for r in rs)  # the last replica's update
        run.samples[step] = sum(r["samples"] for r in rs)
        run.losses[step] = sum(r["loss"] * r["samples"] for r in rs) / run.samples[step]
    return run


# torchft's lighthouse, tuned for fast recovery (its defaults: join 60 s, heartbeat 5 s)
JOIN_TIMEOUT_MS, QUORUM_TICK_MS, HEARTBEAT_TIMEOUT_MS = 1000, 100, 1000


def figures(run: Run, st: Setup, clean: Optional[Run]) -> dict:
    """samples/s over steps 1..N-1 (from the end of step 0 to the end of the last: both
    systems' start-up is left out), samples dropped, kill -> next step, losses equal."""
    if run.error or not {0, st.iterations - 1} <= set(run.step_end):
        return {"error": run.error or "the first or the last step has no time"}
    span = run.step_end[st.iterations - 1] - run.step_end[0]
    trained = sum(n for s, n in run.samples.items() if s > 0)
    out = {"samples_per_s": trained / span, "steps": len(run.samples),
           "dropped": st.batch * st.iterations - sum(run.samples.values()),
           "wall_s": run.wall}
    if run.t_kill is not None:
        # the step in flight at the kill or a later one (another replica may still be
        # finishing the step before, after the kill)
        after = [t for s, t in run.step_end.items() if s >= st.kill_at and t > run.t_kill]
        out["kill_to_step_s"] = min(after) - run.t_kill if after else None
    if clean is not None and not clean.error:
        diffs = [abs(run.losses[i] - clean.losses[i]) for i in clean.losses if i in run.losses]
        out["max_loss_diff"] = max(diffs) if diffs else None
        out["losses_equal"] = bool(diffs) and len(diffs) == st.iterations and max(diffs) <= 1e-5
        if run.checksum is not None and clean.checksum is not None:
            out["checksum_diff"] = abs(run.checksum - clean.checksum)
            out["checksum_rel"] = out["checksum_diff"] / max(1.0, abs(clean.checksum))
    return out
