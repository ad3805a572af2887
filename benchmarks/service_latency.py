"""How fast does a new plan reach every worker? (`recycle serve`, loopback only)

Starts the service in a subprocess, registers a job with D x S workers (256 by default)
and simulates the workers in --procs client processes (each takes an equal share; the
clock is CLOCK_MONOTONIC, shared by all processes on the machine). Each simulated worker
long-polls its own share of the plan on one keep-alive connection
(GET /v1/jobs/{id}/workers/{r}/{s}/plan?after=V&wait=30), JSON-decodes every answer, and
heartbeats every few seconds on another. Then failure events are posted one by one on a
separate connection, timing from the POST until the last worker has parsed a plan with
the version the event produced. Two cases: plans precomputed (cache hit) and a cache miss
(greedy published at once). `--client raw` (default) uses benchmarks/rawhttp.py, a
minimal asyncio HTTP/1.1 client; `--client httpx` the httpx client, whose ~1 ms of CPU per
request would otherwise dominate. Writes benchmarks/results/service_latency.md.

    PYTHONPATH=. .venv/bin/python benchmarks/service_latency.py --client raw,httpx
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rawhttp import ERRORS, close, connect, run_loop

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin"


def uniform_spec(D, S, M, F=10):
    return {"replicas": D, "stages": S, "microbatches": M,
            "cost": {"F": [F] * S, "I": [10] * S, "W": [8] * S, "OPT": [5] * S},
            "p2p": {"intra": 1, "cross": 2},
            "memory": {"activation": [4] * S, "capacity": [40] * S}}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


def now():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def cpu_s(pid):
    """CPU seconds (user + system) process `pid` has used so far (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fleet:
    """Some simulated workers, each long-polling its share of the plan on one connection
    and heartbeating on another; reports (version, first, last) once all hold a version."""

    def __init__(self, url, kind, job_id, token, workers, hb_interval, report):
        self.job, self.hb, self.report = job_id, hb_interval, report
        self.version = {w: -1 for w in workers}
        self.count: dict[int, int] = {}
        self.first: dict[int, float] = {}
        self.conns = {w: (connect(kind, url, token), connect(kind, url, token))
                      for w in self.version}
        self.tasks = []

    def _got(self, w, v):
        self.version[w] = v
        self.count[v] = self.count.get(v, 0) + 1  # each worker sees each version once
        self.first.setdefault(v, now())
        if self.count[v] == len(self.version):
            self.report(v, self.first.pop(v), now())

    async def _poller(self, r, s):
        after, conn = -1, self.conns[(r, s)][0]
        path = f"/v1/jobs/{self.job}/workers/{r}/{s}/plan?wait=30&after="
        while True:
            try:
                status, body = await conn.request("GET", f"{path}{after}")
            except ERRORS:
                await asyncio.sleep(0.05)
                continue
            if status == 200:
                after = json.loads(body)["version"]  # a worker would parse its actions here
                self._got((r, s), after)
            elif status != 204:
                print(f"worker {r}:{s}: {status} {body[:200]!r}", file=sys.stderr)
                return

    async def _heartbeat(self, r, s):
        await asyncio.sleep(random.random() * self.hb)
        it, conn = 0, self.conns[(r, s)][1]
        while True:
            try:
                await conn.request("POST", f"/v1/jobs/{self.job}/heartbeats",
                                   {"replica": r, "stage": s, "iteration": it})
            except ERRORS:
                pass
            it += 1
            await asyncio.sleep(self.hb)

    async def run(self, stop):
        for w in self.version:
            self.tasks.append(asyncio.create_task(self._poller(*w)))
            self.tasks.append(asyncio.create_task(self._heartbeat(*w)))
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for pair in self.conns.values():
            for c in pair:
                await close(c)


def fleet_process(url, kind, job, token, workers, hb, queue, stop):
    """One client process: its share of the workers, reporting to the parent's queue."""
    fleet = Fleet(url, kind, job, token, [tuple(w) for w in workers], hb,
                  lambda v, t0, t1: queue.put((v, t0, t1)))
    run_loop(fleet.run(stop))


class Fleets:
    """The simulated workers spread over `procs` processes."""

    def __init__(self, url, kind, job, token, D, S, procs, hb):
        ws = [(r, s) for r in range(D) for s in range(S)]
        ctx = multiprocessing.get_context("spawn")
        self.queue, self.stop_ev = ctx.Queue(), ctx.Event()
        self.n = min(procs, len(ws))
        self.procs = [ctx.Process(target=fleet_process, daemon=True, args=(
            url, kind, job, token, ws[i::self.n], hb, self.queue, self.stop_ev))
            for i in range(self.n)]
        self.seen: dict[int, list[tuple[float, float]]] = {}
        self.workers = len(ws)

    def start(self):
        for p in self.procs:
            p.start()

    def wait_all(self, version, timeout):
        """(first, last): when the first worker got `version` and when the last process
        reported that all its workers hold it (events go one at a time, so every worker
        sees every version)."""
        end = time.monotonic() + timeout
        while True:
            got = self.seen.get(version, ())
            if len(got) >= self.n:
                return min(t0 for t0, _ in got), max(t1 for _, t1 in got)
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"not every client process reached v{version}: "
                                   f"{ {v: len(t) for v, t in self.seen.items()} }")
            try:
                v, t0, t1 = self.queue.get(True, left)
            except Exception:
                continue
            self.seen.setdefault(v, []).append((t0, t1))

    def stop(self):
        self.stop_ev.set()
        for p in self.procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()


async def scenario(url, kind, name, spec, max_failures, events, args):
    admin = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"},
                              timeout=60)
    r = (await admin.post("/v1/jobs", json=spec, params={"max_failures": max_failures})).json()
    job, token = r["id"], r["token"]
    t0 = time.monotonic()
    while (await admin.get(f"/v1/jobs/{job}/precompute")).json()["state"] != "done":
        if time.monotonic() - t0 > 300:
            raise TimeoutError("precompute did not finish")
        await asyncio.sleep(0.2)
    log(f"{kind} {name}: job {job} registered, precompute done in {time.monotonic() - t0:.1f} s")
    fleets = Fleets(url, kind, job, token, spec["replicas"], spec["stages"], args.procs,
                    args.heartbeat_interval)
    fleets.start()
    poster = connect(kind, url, ADMIN)  # the failure POST goes on its own connection
    rows = []
    try:
        await asyncio.to_thread(fleets.wait_all, 0, 60)
        log(f"{kind} {name}: {fleets.workers} workers in {fleets.n} processes hold v0")
        await asyncio.sleep(args.heartbeat_interval + 1.0)  # every worker has heartbeaten
        for i, (ev, rep, st) in enumerate(events):
            c0, t0 = cpu_s(args.server_pid), now()
            status, data = await poster.request("POST", f"/v1/jobs/{job}/events", {
                "event_id": f"{name}-{i}", "kind": ev, "replica": rep, "stage": st})
            t_ack = now()
            body = json.loads(data)
            if status != 200:
                raise RuntimeError(f"event {i}: {status} {body}")
            first, last = await asyncio.to_thread(fleets.wait_all, body["plan_version"], 20)
            rows.append({"kind": ev, "source": body["plan_source"], "ack": t_ack - t0,
                         "first": first - t0, "all": last - t0,
                         "cpu": cpu_s(args.server_pid) - c0})
            log(f"{kind} {name} {i} {ev} v{body['plan_version']} ({body['plan_source']}): ack "
                f"{rows[-1]['ack'] * 1000:.1f} ms, first {rows[-1]['first'] * 1000:.1f} ms, "
                f"all {rows[-1]['all'] * 1000:.1f} ms")
            await asyncio.sleep(args.gap)
    finally:
        fleets.stop()
        await close(poster)
        await admin.post(f"/v1/jobs/{job}/finish")  # else its silent workers get declared failed
        await admin.aclose()
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(client, name, rows):
    fail = [x for x in rows if x["kind"] == "failure"]
    ms = [x["all"] * 1000 for x in fail]
    ack = [x["ack"] * 1000 for x in fail]
    first = [x["first"] * 1000 for x in fail]
    srcs = sorted({x["source"] for x in fail})
    cpu = sum(x["cpu"] for x in fail) * 1000 / len(fail)
    return (f"| {client} | {name} | {'/'.join(srcs)} | {len(fail)} | {pct(ack, 50):.1f} "
            f"| {pct(first, 50):.1f} | **{pct(ms, 50):.1f}** | {pct(ms, 90):.1f} "
            f"| **{pct(ms, 99):.1f}** | {max(ms):.1f} | {cpu:.0f} |")


async def main_async(args, url, kind):
    D, S, M = args.replicas, args.stages, args.microbatches
    rng = random.Random(0)
    # cached: fail one worker, recover it, next one; every set has <= 1 failure (precomputed)
    ws = [(rng.randrange(D), rng.randrange(S)) for _ in range(args.failures)]
    cached = [(k, *w) for w in ws for k in ("failure", "recovery")]
    # miss: failures accumulate, so every failed set is new (spread so no stage dies)
    order = [(r, (r + k) % S) for k in range(S) for r in range(D)]
    miss = [("failure", *w) for w in order[:args.failures]]
    # a different spec per client and case, so no case finds plans another one cached
    f = 10 + 2 * ["raw", "httpx"].index(kind)
    return {"cached": await scenario(url, kind, "cached", uniform_spec(D, S, M, F=f), 1,
                                     cached, args),
            "miss": await scenario(url, kind, "miss", uniform_spec(D, S, M, F=f + 1), 0,
                                   miss, args)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--failures", type=int, default=20, help="failure events per scenario")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between events (after "
                    "all workers hold the last version)")
    ap.add_argument("--heartbeat-interval", type=float, default=3.0)
    ap.add_argument("--procs", type=int, default=2, help="client processes the simulated "
                    "workers are spread over")
    ap.add_argument("--client", default="raw", help="raw, httpx or both (raw,httpx)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/service_latency.md"))
    args = ap.parse_args()
    kinds = [k.strip() for k in args.client.split(",") if k.strip()]
    if not kinds or set(kinds) - {"raw", "httpx"}:
        ap.error("--client: raw, httpx or raw,httpx")
    port = free_port()
    url, res, tmp = f"http://127.0.0.1:{port}", {}, tempfile.mkdtemp(prefix="recycle-bench-")
    cmd = [sys.executable, "-m", "api", "serve", "--db", f"{tmp}/bench.db", "--port", str(port),
           "--admin-token", ADMIN, "--solvers", "greedy", "--heartbeat-timeout", "120",
           "--log-level", "warning"]
    load0 = os.getloadavg()
    srv = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    args.server_pid = srv.pid
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        for kind in kinds:
            res[kind] = run_loop(main_async(args, url, kind))
    finally:
        srv.terminate()
        srv.wait(15)
    write_report(args, res, load0, os.getloadavg())


def server_stack():
    import importlib.metadata as md
    have = []
    for mod in ("uvloop", "httptools"):
        try:
            have.append(f"{mod} {md.version(mod)}")
        except md.PackageNotFoundError:
            pass
    return f"uvicorn {md.version('uvicorn')} with {', '.join(have) or 'h11 and asyncio'}"


def write_report(args, res, load0, load1):
    n = args.replicas * args.stages
    rows = [summarize(k, name, r[case]) for k, r in res.items()
            for case, name in (("cached", "cached (precomputed, k=1)"),
                               ("miss", "cache miss (greedy at once)"))]
    lines = [
        "# Service latency: failure event to new plan on every worker", "",
        f"{n} simulated workers ({args.replicas} replicas x {args.stages} stages, "
        f"{args.microbatches} micro-batches each) in {args.procs} client processes; each "
        "worker long-polls its own share of the plan on one keep-alive connection and "
        f"heartbeats every {args.heartbeat_interval:g} s on another. The service "
        f"(`python -m api serve`, {server_stack()}, SQLite WAL + synchronous=FULL, greedy "
        "solver) in another process; loopback only.", "",
        "Latency = from sending the failure POST (on its own connection) until the last of "
        f"the {n} workers has JSON-decoded a plan with the version the event produced. "
        "`ack` = the POST's round trip; `first` = until the first worker has it; `service "
        "CPU` = CPU time the service process used from the POST until the last worker had "
        "the plan, mean per failure (less sensitive to the load than the latencies).", "",
        "| client | case | plan from | failures | ack p50 ms | first p50 ms "
        "| all-workers p50 ms | p90 ms | p99 ms | max ms | service CPU ms/event |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"With {args.failures} failures per case, p99 (nearest rank) is the max. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}; load average "
        f"(1 min) {load0[0]:.2f} before, {load1[0]:.2f} after.", "",
        "Command:", "", "```",
        "PYTHONPATH=. .venv/bin/python benchmarks/service_latency.py " + " ".join(sys.argv[1:]),
        "```", ""]
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""  # a hand-written "## Notes" part stays
    text = "\n".join(lines) + (old[old.index("## Notes"):] if "## Notes" in old else "")
    out.parent.mkdir(parents=True, exist_ok=True), out.write_text(text), print(text)


if __name__ == "__main__":
    main()
