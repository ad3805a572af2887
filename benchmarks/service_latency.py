"""How fast does a new plan reach every worker? (`recycle serve`, loopback only)

Starts the service in a subprocess, registers a job with D x S workers (256 by default)
and simulates the workers with asyncio + httpx in --procs client processes (each takes an
equal share of the workers; the clock is CLOCK_MONOTONIC, shared by all processes on the
machine). Each simulated worker long-polls its own
share of the plan (GET /v1/jobs/{id}/workers/{r}/{s}/plan?after=V&wait=30) and heartbeats
every couple of seconds. Then it posts failure events one by one and measures the time
from the POST until every worker holds a plan version at least the one the event
produced. Two cases: plans precomputed (cache hit) and a cache miss (greedy published at
once). Writes benchmarks/results/service_latency.md.

    PYTHONPATH=. .venv/bin/python benchmarks/service_latency.py
"""
from __future__ import annotations

import argparse
import asyncio
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


class Fleet:
    """Some simulated workers, each long-polling its share of the plan and heartbeating;
    reports (version, time) once all of them hold a version."""

    def __init__(self, url, job_id, token, workers, hb_interval, report):
        self.job, self.hb, self.report = job_id, hb_interval, report
        self.version = {w: -1 for w in workers}
        self.count: dict[int, int] = {}
        self.target, self.reached, self.done_at = None, 0, None
        self.all_there = asyncio.Event()
        headers = {"Authorization": f"Bearer {token}"}
        # one client per worker, as in a real fleet; one shared httpx pool with hundreds of
        # connections costs O(connections) per request and would dominate the measurement
        self.clients = {w: httpx.AsyncClient(base_url=url, headers=headers, timeout=60)
                        for w in self.version}
        self.tasks = []

    def _got(self, w, v):
        self.version[w] = v
        self.count[v] = self.count.get(v, 0) + 1  # each worker sees each version once
        if self.count[v] == len(self.version):
            self.report(v, now())

    async def _poller(self, r, s):
        after = -1
        while True:
            try:
                resp = await self.clients[(r, s)].get(f"/v1/jobs/{self.job}/workers/{r}/{s}/plan",
                                           params={"after": after, "wait": 30})
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
                continue
            if resp.status_code == 200:
                after = resp.json()["version"]  # a worker would parse its actions here
                self._got((r, s), after)
            elif resp.status_code != 204:
                print(f"worker {r}:{s}: {resp.status_code} {resp.text[:200]}", file=sys.stderr)
                return

    async def _heartbeat(self, r, s):
        await asyncio.sleep(random.random() * self.hb)
        it = 0
        while True:
            try:
                await self.clients[(r, s)].post(f"/v1/jobs/{self.job}/heartbeats",
                                     json={"replica": r, "stage": s, "iteration": it})
            except httpx.HTTPError:
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
        for c in self.clients.values():
            await c.aclose()


def fleet_process(url, job, token, workers, hb, queue, stop):
    """One client process: its share of the workers, reporting to the parent's queue."""
    fleet = Fleet(url, job, token, [tuple(w) for w in workers], hb,
                  lambda v, t: queue.put((v, t)))
    asyncio.run(fleet.run(stop))


class Fleets:
    """The simulated workers spread over `procs` processes."""

    def __init__(self, url, job, token, D, S, procs, hb):
        ws = [(r, s) for r in range(D) for s in range(S)]
        ctx = multiprocessing.get_context("spawn")
        self.queue, self.stop_ev = ctx.Queue(), ctx.Event()
        self.n = min(procs, len(ws))
        self.procs = [ctx.Process(target=fleet_process, daemon=True, args=(
            url, job, token, ws[i::self.n], hb, self.queue, self.stop_ev)) for i in range(self.n)]
        self.seen: dict[int, list[float]] = {}
        self.workers = len(ws)

    def start(self):
        for p in self.procs:
            p.start()

    def wait_all(self, version, timeout):
        """Time at which the last process reported that all its workers hold `version`
        (events go one at a time, so every worker sees every version)."""
        end = time.monotonic() + timeout
        while True:
            if len(self.seen.get(version, ())) >= self.n:
                return max(self.seen[version])
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"not every client process reached v{version}: "
                                   f"{ {v: len(t) for v, t in self.seen.items()} }")
            try:
                v, t = self.queue.get(True, left)
            except Exception:
                continue
            self.seen.setdefault(v, []).append(t)

    def stop(self):
        self.stop_ev.set()
        for p in self.procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()


async def scenario(url, name, spec, max_failures, events, args):
    admin = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"},
                              timeout=60)
    r = (await admin.post("/v1/jobs", json=spec, params={"max_failures": max_failures})).json()
    job, token = r["id"], r["token"]
    t0 = time.monotonic()
    while (await admin.get(f"/v1/jobs/{job}/precompute")).json()["state"] != "done":
        if time.monotonic() - t0 > 300:
            raise TimeoutError("precompute did not finish")
        await asyncio.sleep(0.2)
    log(f"{name}: job {job} registered, precompute done in {time.monotonic() - t0:.1f} s")
    fleets = Fleets(url, job, token, spec["replicas"], spec["stages"], args.procs,
                    args.heartbeat_interval)
    fleets.start()
    await asyncio.to_thread(fleets.wait_all, 0, 60)
    log(f"{name}: {fleets.workers} workers in {fleets.n} processes hold v0")
    await asyncio.sleep(1.0)
    rows = []
    for i, (kind, rep, st) in enumerate(events):
        t0 = now()
        resp = await admin.post(f"/v1/jobs/{job}/events", json={
            "event_id": f"{name}-{i}", "kind": kind, "replica": rep, "stage": st})
        t_ack = now()
        body = resp.json()
        done_at = await asyncio.to_thread(fleets.wait_all, body["plan_version"], 20)
        rows.append({"kind": kind, "source": body["plan_source"], "ack": t_ack - t0,
                     "all": done_at - t0})
        log(f"{name} {i} {kind} v{body['plan_version']} ({body['plan_source']}): ack "
            f"{rows[-1]['ack'] * 1000:.1f} ms, all workers {rows[-1]['all'] * 1000:.1f} ms")
        await asyncio.sleep(args.gap)
    fleets.stop()
    await admin.aclose()
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(name, rows):
    fail = [x for x in rows if x["kind"] == "failure"]
    ms = [x["all"] * 1000 for x in fail]
    ack = [x["ack"] * 1000 for x in fail]
    srcs = sorted({x["source"] for x in fail})
    return (f"| {name} | {'/'.join(srcs)} | {len(fail)} | {pct(ack, 50):.1f} | {pct(ms, 50):.1f} "
            f"| {pct(ms, 90):.1f} | {pct(ms, 99):.1f} | {max(ms):.1f} |")


async def main_async(args, url):
    D, S, M = args.replicas, args.stages, args.microbatches
    rng = random.Random(0)
    # cached: fail one worker, recover it, next one; every set has <= 1 failure (precomputed)
    cached = []
    for _ in range(args.failures):
        w = (rng.randrange(D), rng.randrange(S))
        cached += [("failure", *w), ("recovery", *w)]
    # miss: failures accumulate, so every failed set is new (spread so no stage dies)
    order = [(r, (r + k) % S) for k in range(S) for r in range(D)]
    miss = [("failure", *w) for w in order[:args.failures]]
    res = {"cached": await scenario(url, "cached", uniform_spec(D, S, M), 1, cached, args),
           "miss": await scenario(url, "miss", uniform_spec(D, S, M, F=11), 0, miss, args)}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--failures", type=int, default=20, help="failure events per scenario")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between events (after all workers hold the last version)")
    ap.add_argument("--heartbeat-interval", type=float, default=5.0)
    ap.add_argument("--procs", type=int, default=4, help="client processes the simulated "
                    "workers are spread over")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/service_latency.md"))
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = tempfile.mkdtemp(prefix="recycle-bench-")
    cmd = [sys.executable, "-m", "api", "serve", "--db", f"{tmp}/bench.db", "--port", str(port),
           "--admin-token", ADMIN, "--solvers", "greedy", "--heartbeat-timeout", "120",
           "--log-level", "warning"]
    srv = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        res = asyncio.run(main_async(args, url))
    finally:
        srv.terminate()
        srv.wait(15)
    n = args.replicas * args.stages
    lines = [
        "# Service latency: failure event to new plan on every worker", "",
        f"{n} simulated workers ({args.replicas} replicas x {args.stages} stages, "
        f"{args.microbatches} micro-batches each) spread over {args.procs} asyncio + httpx "
        "client processes, each "
        "long-polling its own share of the plan and heartbeating every "
        f"{args.heartbeat_interval:g} s; the service (`python -m api serve`, uvicorn with h11, "
        "SQLite WAL + synchronous=FULL, greedy solver) in another process; loopback only.", "",
        "Latency = from sending the failure POST until the last of the "
        f"{n} workers has received a plan version at least the one the event produced "
        "(client-side parsing included). `ack` = the POST's own round trip.", "",
        "| case | plan from | failures | ack p50 ms | all-workers p50 ms | p90 ms | p99 ms "
        "| max ms |", "|---|---|---|---|---|---|---|---|",
        summarize("cached (precomputed, k=1)", res["cached"]),
        summarize("cache miss (greedy at once)", res["miss"]), "",
        "Each fan-out is 2 x 256 HTTP requests handled by the one service process (the "
        "answers, then every worker's next long-poll; the answer bytes are built once per "
        "version and worker, see api/service.py). About 1 ms of CPU each on this machine "
        "(~1.2 ms per sequential round trip, client included), so with "
        "the clients on the same shared cores the all-workers time is CPU-bound, whatever "
        "the number of client processes. `ack` is the service's own event path (SQLite "
        "commit included).", "",
        f"p99 over {args.failures} failures per case is close to the max. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}; load average "
        f"{os.getloadavg()[0]:.1f} at the end (other jobs share the CPUs).", "",
        "Command:", "", "```",
        "PYTHONPATH=. .venv/bin/python benchmarks/service_latency.py " + " ".join(sys.argv[1:]),
        "```", ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
