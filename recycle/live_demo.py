"""Part 2 of `recycle demo`: a live CPU cluster driven by the plan service, through a
real SIGKILL and a rejoin, checked against a failure-free run.

Starts `recycle serve` (a subprocess on 127.0.0.1, temp SQLite file), registers a 2x2 job,
and trains it with the code of `recycle train --service`: four worker processes that poll
the service for plans, heartbeat to it and report suspects. Worker 1:0 is SIGKILLed in the
middle of an iteration; the service declares it failed and publishes the re-routed plan,
the survivors roll back the iteration and go on; the worker is restarted, posts its
recovery, loads its state from its live peer and the service moves everyone back to the
full plan. The model trains on real text every machine has (the Python standard library's
own sources, tokenized byte by byte by `recycle data prepare`). Finally the losses are shown
next to a one-process reference run, and plotted (demo-loss.png).
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx
from rich.console import Console
from rich.table import Table

from planner.control import routes as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D, S, M, ITERATIONS = 2, 2, 2, 12
KILL, REJOIN = (1, 0, 3), (1, 0, 7)  # replica, stage, iteration
MODEL = "llama:debug"
TEXT = ("json", "asyncio", "email", "logging")  # standard-library packages trained on


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_service(tmp: str, admin: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "api", "serve", "--db", os.path.join(tmp, "service.db"),
           "--host", "127.0.0.1", "--port", str(port), "--admin-token", admin,
           "--solvers", "greedy", "--max-failures", "1", "--heartbeat-timeout", "3",
           "--suspect-grace", "1", "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(os.path.join(tmp, "service.log"), "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError("the service did not come up")


@dataclass
class DemoResult:
    match: bool  # losses and parameters equal the failure-free run's
    plans: list = field(default_factory=list)  # the versions trained under (Summary.plans)
    rerouted: Optional[dict] = None  # the version with 1:0 failed: its row of the table

    def __bool__(self) -> bool:
        return self.match


def iteration_spans(plans: list[dict], iterations: int) -> list[tuple[int, int]]:
    """[first, last] iteration each version of `plans` (in order) trained."""
    firsts = [p["first_iteration"] for p in plans] + [iterations]
    return [(a, b - 1) for a, b in zip(firsts, firsts[1:])]


def version_rows(plans: list[dict], iteration_end: dict, iterations: int,
                 tokens_per_iteration: int) -> list[dict]:
    """Per version: iterations, failed set, micro-batches per worker, planned period and the
    measured tokens/s over its steady iterations (the first of each version re-runs an
    aborted iteration or waits for a rejoin, so it is left out)."""
    rows = []
    for plan, (a, b) in zip(plans, iteration_spans(plans, iterations)):
        steady = [i for i in range(a + 1, b + 1) if i - 1 in iteration_end and i in iteration_end]
        secs = sum(iteration_end[i] - iteration_end[i - 1] for i in steady)
        rows.append(dict(plan, iterations=(a, b), steady=len(steady),
                         tok_s=len(steady) * tokens_per_iteration / secs if secs > 0 else None))
    return rows


def live_demo(out_dir: str, console: Console) -> DemoResult:
    """Runs the cluster; the result is true when the run under failure matched the
    failure-free reference."""
    import torch

    from executor.launch.launcher import Coordinator
    from executor.launch.report.run_record import failed_by_iteration
    from executor.inputs.launch_spec import Faults, LaunchSpec, sections
    from executor.compute.config import ModelConfig, TrainingSettings
    from executor.compute.one_process.reference import compare, train_reference
    from executor.data.prepare import prepare, stdlib_dir
    from executor.data.token_file import with_data
    from executor.inputs.workload_name import load_workload
    from executor.models.families import architecture
    from executor.sources.service_source import ServiceWatch
    from planner.job import JobSpec

    torch.set_num_threads(1)
    console.rule("[bold]2. A live cluster: 2 replicas x 2 stages, driven by the plan service")
    tmp = tempfile.mkdtemp(prefix="recycle-demo-", dir=os.path.abspath(out_dir))
    data = prepare([os.path.join(stdlib_dir(), p) for p in TEXT], os.path.join(tmp, "text.bin"))
    console.print(f"recycle data prepare: {data.token_file.tokens:,} byte tokens from "
                  f"{data.files} files of the standard library ({', '.join(TEXT)})")
    # warm-up then cosine, clipped by the global norm over both stages: exact as the rest
    cfg = ModelConfig(**architecture(MODEL), micro_batch_size=4)
    training = TrainingSettings(lr=1e-2, lr_schedule="cosine", warmup_iters=2,
                                total_iters=ITERATIONS, clip=1.0, data=data.token_file.path)
    console.print(f"model {MODEL}: {cfg.n_layers} layers, d_model {cfg.d_model}, "
                  f"{cfg.n_heads} heads ({cfg.n_kv_heads} key/value), context {cfg.seq_len}; "
                  f"lr {training.lr:g} with 2 warm-up iterations then cosine, clip at global "
                  f"norm {training.clip:g}")
    admin = secrets.token_urlsafe(16)
    service, url = _start_service(tmp, admin)
    try:
        headers = {"Authorization": f"Bearer {admin}"}
        r = httpx.post(url + R.JOBS.url(), headers=headers, params={"max_failures": 1},
                       json=JobSpec.uniform(D, S, M).model_dump(mode="json"), timeout=30)
        r.raise_for_status()
        job_id, token = r.json()["id"], r.json()["token"]
        console.print(f"service [bold]{url}[/] (pid {service.pid}), job {job_id}: plan v0. "
                      f"Workers poll it for plans, heartbeat to it and report suspects.")
        console.print(f"Training {ITERATIONS} iterations; worker {KILL[0]}:{KILL[1]} gets a real "
                      f"SIGKILL mid-iteration {KILL[2]}: the coordinator reports its death, "
                      f"the service publishes the re-routed plan, and the worker is "
                      f"restarted when the run reaches iteration {REJOIN[2]}.")
        watch = ServiceWatch(url, job_id, token, timeout_s=30)
        run = LaunchSpec(cfg, watch.plan.job, ITERATIONS, faults=Faults(kills=[KILL],
                         rejoins=[REJOIN]), training=training, deadline_s=120,
                         run_dir=os.path.join(tmp, "run"), model=MODEL, **sections(timeout=4.0))
        coord = Coordinator(run, console=console, service=watch)
        t0 = time.monotonic()
        res = coord.run()
        wall = time.monotonic() - t0
        events = httpx.get(url + R.EVENT_LOG.url(job_id=job_id), headers=headers,
                           timeout=10).json()
    finally:
        service.terminate()
        try:
            service.wait(10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
    for e in events:
        console.print(f"service event: {e['kind']} of worker {e['replica']}:{e['stage']} "
                      f"(source {e['source']}) -> plan v{e['plan_version']}, "
                      f"failed {e['failed'] or '-'}")
    run_dir = os.path.join(tmp, "run")
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("worker-"):
            for line in open(os.path.join(run_dir, name)):
                if any(k in line for k in ("aborted", "rolled back", "loaded stage")):
                    console.print("  " + line.strip()[:150], markup=False, highlight=False)
    if res.summary is None:
        console.print(f"[red]training halted: {res.halted}[/]")
        return DemoResult(False)
    tokens = D * M * cfg.micro_batch_size * cfg.seq_len
    rows = version_rows(res.summary.plans, res.iteration_end, ITERATIONS, tokens)
    rerouted = show_versions(console, rows, failed_by_iteration(res.summary.plans, ITERATIONS))
    ref = train_reference(cfg, D, M, ITERATIONS, S, training=training,
                          workload=with_data(load_workload(MODEL), training.data))
    table = Table("iteration", "loss (SIGKILL + rejoin)", "loss (no failure)", "|diff|",
                  title=f"Losses, {wall:.1f} s of training")
    for i, (a, b) in enumerate(zip(res.summary.losses, ref.losses)):
        table.add_row(str(i), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}")
    console.print(table)
    png = plot_losses(out_dir, res.summary.losses, ref.losses)
    console.print(f"loss curves with and without the failure: [bold]{png}[/]")
    diffs = compare(res.summary, ref, 1e-5)
    if diffs:
        console.print("[red bold]MISMATCH[/]: " + "; ".join(diffs))
    else:
        console.print("[green bold]match[/]: every loss and every stage's final parameter "
                      "checksum equals the failure-free run within 1e-5. Worker logs: "
                      f"{run_dir}")
    return DemoResult(not diffs, res.summary.plans, rerouted)


def show_versions(console: Console, rows: list[dict], failed: list) -> Optional[dict]:
    """The table of plan versions: who ran how many micro-batches under each, and what the
    re-routed version kept of the full one's throughput. Returns the first re-routed
    version's row, with `iterations` the whole span trained under its failed set (`failed`:
    per iteration; a re-plan for measured speeds may split it into several versions)."""
    full = [r for r in rows if not r["failed"]]
    base = full[0] if full else None
    table = Table("plan", "iterations", "failed", "micro-batches per worker (F)",
                  "period (planned, spec units)", "tokens/s (measured)", "kept: planned / measured",
                  title="Plan versions the run trained under")
    rerouted = None
    for r in rows:
        a, b = r["iterations"]
        counts = ", ".join(f"{w} {n}" + (f" ({n - M} re-routed)" if n > M else "")
                           for w, n in sorted(r["microbatches"].items()))
        kept = "-"
        if base is not None and r["failed"]:
            full_tok = [x["tok_s"] for x in full if x["tok_s"]]
            measured = (f"{r['tok_s'] / (sum(full_tok) / len(full_tok)):.0%}"
                        if r["tok_s"] and full_tok else "n/a")
            kept = f"{base['period'] / r['period']:.0%} / {measured}"
        if r["failed"] and rerouted is None:
            end = a
            while end + 1 < len(failed) and failed[end + 1] == r["failed"]:
                end += 1
            rerouted = dict(r, iterations=(a, end))
        table.add_row(f"v{r['version']}", f"{a}-{b}" if b > a else str(a),
                      ", ".join(f"{x}:{y}" for x, y in r["failed"]) or "-", counts,
                      str(r["period"]), f"{r['tok_s']:,.0f}" if r["tok_s"] else "n/a", kept)
    console.print(table)
    if rerouted is not None:
        a, b = rerouted["iterations"]
        console.print(f"Iterations {a}-{b} trained re-routed: worker "
                      f"{', '.join(f'{x}:{y}' for x, y in rerouted['failed'])} failed, its "
                      "micro-batches ran on its stage peer in the other replica; the global "
                      "batch stayed the same.")
    return rerouted


def plot_losses(out_dir: str, failed: list[float], clean: list[float]) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    its = range(len(clean))
    ax.plot(its, clean, "o-", lw=3, alpha=0.4, label="no failure (one-process reference)")
    ax.plot(its, failed, "x--", color="black", label=f"SIGKILL of {KILL[0]}:{KILL[1]}, rejoin")
    for it, what in ((KILL[2], "SIGKILL"), (REJOIN[2], "rejoin")):
        ax.axvline(it, color="red" if what == "SIGKILL" else "green", ls=":")
        ax.annotate(what, (it, max(clean)), rotation=90, va="top", ha="right", fontsize=8)
    ax.set(xlabel="iteration", ylabel="training loss (nats per byte)",
           title=f"{MODEL} on standard-library source text, {D}x{S} grid")
    ax.legend()
    path = os.path.join(out_dir, "demo-loss.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
