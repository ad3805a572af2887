"""How fast does a new plan reach every worker, and what do heartbeats cost the service?
(`recycle serve`, loopback only)

Starts the service in a subprocess and, for each fleet size (`--sizes`, workers as
D x 16 stages, 4 micro-batches each) and each mode (`--modes`), registers a job and
simulates its workers in --procs client processes (the clock is CLOCK_MONOTONIC, shared by
all processes on the machine):

  workers  every worker long-polls its own share of the plan on one keep-alive connection
           (GET /v1/jobs/{id}/workers/{r}/{s}/plan?after=V&wait=30), JSON-decodes every
           answer, and heartbeats every --heartbeat-interval s on another (as without an
           agent);
  agents   one simulated node agent per --per-node workers long-polls the node's share
           (GET /v1/jobs/{id}/nodes/{n}/plan), JSON-decodes it and builds each local
           worker's share from it (a worker holds the plan once its agent has built its
           share; the loopback hop from a real agent to its worker processes is not in
           these figures), and heartbeats for all of them in one request
           (POST /v1/jobs/{id}/nodes/{n}/heartbeats) every --heartbeat-interval s.

Per (size, mode): the steady state (service CPU at that heartbeat rate, per 1,000 worker
heartbeats), then failure events posted one by one on a separate connection (a worker
failed then recovered, so every failed set is precomputed: cache hits), timing from the
POST until the last worker holds a plan with the version the event produced, then a
saturation phase (every sender back to back: the heartbeat throughput the service
sustains). `--client raw` (default) uses benchmarks/rawhttp.py, a minimal asyncio HTTP/1.1
client; `--client httpx` the httpx client (workers mode only), whose ~1 ms of CPU per
request would otherwise dominate. Writes benchmarks/results/service_latency.md.

    PYTHONPATH=. .venv/bin/python benchmarks/service_latency.py
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
sys.path.insert(0, str(ROOT))
from executor.node.agent import worker_share  # noqa: E402 - the agent's own cut
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
    """Some simulated workers (or node agents, each for its `per_node` workers): each
    long-polls its share of the plan on one connection and heartbeats on another; reports
    (version, first, last) once all its workers hold a version."""

    def __init__(self, url, kind, job_id, token, units, hb_interval, report, blast,
                 per_node=None):
        self.job, self.hb, self.report, self.blast = job_id, hb_interval, report, blast
        self.per_node = per_node  # None: units are workers; else node ranks
        self.units = units
        self.size = {u: (1 if per_node is None else len(u[1])) for u in units}
        self.workers = sum(self.size.values())
        self.count: dict[int, int] = {}
        self.first: dict[int, float] = {}
        self.conns = {u: (connect(kind, url, token), connect(kind, url, token)) for u in units}
        self.tasks = []

    def _got(self, u, v):
        self.count[v] = self.count.get(v, 0) + self.size[u]  # each unit sees each version once
        self.first.setdefault(v, now())
        if self.count[v] == self.workers:
            self.report(("v", v, self.first.pop(v), now()))

    async def _poller(self, u):
        after, conn = -1, self.conns[u][0]
        if self.per_node is None:
            path = f"/v1/jobs/{self.job}/workers/{u[0]}/{u[1]}/plan?wait=30&after="
        else:
            path = (f"/v1/jobs/{self.job}/nodes/{u[0]}/plan?workers_per_node={self.per_node}"
                    "&wait=30&after=")
        while True:
            try:
                status, body = await conn.request("GET", f"{path}{after}")
            except ERRORS:
                await asyncio.sleep(0.05)
                continue
            if status == 200:
                share = json.loads(body)  # a worker would parse its actions here
                if self.per_node is not None:  # the agent builds each local worker's share
                    views = [worker_share(share, (w["replica"], w["stage"]))
                             for w in share["workers"]]  # as executor/node/agent.py does
                    assert len(views) == self.size[u]
                after = share["version"]
                self._got(u, after)
            elif status != 204:
                print(f"{u}: {status} {body[:200]!r}", file=sys.stderr)
                return

    async def _heartbeat(self, u):
        await asyncio.sleep(random.random() * self.hb)
        it, conn = 0, self.conns[u][1]
        while True:
            if self.per_node is None:
                path, body = f"/v1/jobs/{self.job}/heartbeats", {
                    "replica": u[0], "stage": u[1], "iteration": it}
            else:
                path, body = f"/v1/jobs/{self.job}/nodes/{u[0]}/heartbeats", {
                    "agent_id": f"bench-{u[0]}", "workers_per_node": self.per_node,
                    "workers": [{"replica": r, "stage": s, "iteration": it} for r, s in u[1]]}
            try:
                status, data = await conn.request("POST", path, body)
                if status not in (200, 409):  # 409: this worker is failed right now
                    print(f"heartbeat {u}: {status} {data[:200]!r}", file=sys.stderr)
            except ERRORS:
                pass
            it += 1
            if self.blast.is_set():
                await asyncio.sleep(0)  # saturation: back to back
            else:
                await asyncio.sleep(self.hb)

    async def run(self, stop):
        for u in self.units:
            self.tasks.append(asyncio.create_task(self._poller(u)))
            self.tasks.append(asyncio.create_task(self._heartbeat(u)))
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for pair in self.conns.values():
            for c in pair:
                await close(c)


def fleet_process(url, kind, job, token, units, hb, queue, stop, blast, per_node):
    """One client process: its share of the workers, reporting to the parent's queue."""
    units = ([tuple(u) for u in units] if per_node is None
             else [(n, tuple(tuple(w) for w in cells)) for n, cells in units])
    fleet = Fleet(url, kind, job, token, units, hb, queue.put, blast, per_node)
    run_loop(fleet.run(stop))


class Fleets:
    """The simulated workers (or agents) spread over `procs` processes."""

    def __init__(self, url, kind, job, token, D, S, procs, hb, per_node=None):
        ws = [(r, s) for r in range(D) for s in range(S)]  # rank order
        units = ws if per_node is None else [
            (n, ws[n * per_node:(n + 1) * per_node]) for n in range(-(-len(ws) // per_node))]
        ctx = multiprocessing.get_context("spawn")
        self.queue, self.stop_ev, self.blast = ctx.Queue(), ctx.Event(), ctx.Event()
        self.n = min(procs, len(units))
        self.procs = [ctx.Process(target=fleet_process, daemon=True, args=(
            url, kind, job, token, units[i::self.n], hb, self.queue, self.stop_ev, self.blast,
            per_node)) for i in range(self.n)]
        self.seen: dict[int, list[tuple[float, float]]] = {}
        self.workers, self.units = len(ws), len(units)

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
                _, v, t0, t1 = self.queue.get(True, left)
            except Exception:
                continue
            self.seen.setdefault(v, []).append((t0, t1))

    def cpu(self):
        """CPU seconds the client processes have used so far."""
        return sum(cpu_s(p.pid) for p in self.procs)

    def stop(self):
        self.stop_ev.set()
        for p in self.procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()


async def beats_cpu(admin, pid):
    """(worker heartbeats taken so far, service CPU seconds, time)."""
    text = (await admin.get("/metrics")).text
    n = next(float(line.split()[-1]) for line in text.splitlines()
             if line.startswith("recycle_heartbeats_total "))
    return n, cpu_s(pid), now()


def rate(a, b):
    """(worker heartbeats per second, service cores busy, CPU ms per 1,000 heartbeats)."""
    beats, cpu, dt = b[0] - a[0], b[1] - a[1], b[2] - a[2]
    return beats / dt, cpu / dt, (cpu * 1000 / beats * 1000 if beats else float("nan"))


async def scenario(url, kind, mode, spec, events, args):
    admin = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"},
                              timeout=300)  # a saturated service answers late, not never
    r = (await admin.post("/v1/jobs", json=spec, params={"max_failures": 1})).json()
    job, token = r["id"], r["token"]
    t0 = time.monotonic()
    while (await admin.get(f"/v1/jobs/{job}/precompute")).json()["state"] != "done":
        if time.monotonic() - t0 > 600:
            raise TimeoutError("precompute did not finish")
        await asyncio.sleep(0.2)
    n = spec["replicas"] * spec["stages"]
    name = f"{n} {mode}"
    log(f"{kind} {name}: job {job} registered, precompute done in {time.monotonic() - t0:.1f} s")
    fleets = Fleets(url, kind, job, token, spec["replicas"], spec["stages"], args.procs,
                    args.heartbeat_interval, args.per_node if mode == "agents" else None)
    fleets.start()
    poster = connect(kind, url, ADMIN)  # the failure POST goes on its own connection
    out = {"workers": n, "mode": mode, "units": fleets.units, "rows": []}
    try:
        await asyncio.to_thread(fleets.wait_all, 0, 180)
        log(f"{kind} {name}: {fleets.workers} workers ({fleets.units} pollers) in "
            f"{fleets.n} processes hold v0")
        await asyncio.sleep(args.heartbeat_interval + 1.0)  # every worker has heartbeaten
        a = await beats_cpu(admin, args.server_pid)
        await asyncio.sleep(args.steady)
        out["steady"] = rate(a, await beats_cpu(admin, args.server_pid))
        log(f"{kind} {name}: steady {out['steady'][0]:.0f} heartbeats/s, service "
            f"{out['steady'][1]:.2f} cores, {out['steady'][2]:.1f} ms CPU per 1,000")
        t_events = time.monotonic()
        for i, (ev, rep, st) in enumerate(events):
            if ev == "failure" and time.monotonic() - t_events > args.budget:
                log(f"{kind} {name}: --budget of {args.budget:g} s spent after {i // 2} failures")
                break
            c0, k0, t0 = cpu_s(args.server_pid), fleets.cpu(), now()
            status, data = await poster.request("POST", f"/v1/jobs/{job}/events", {
                "event_id": f"{name}-{i}".replace(" ", "-"), "kind": ev, "replica": rep,
                "stage": st})
            t_ack = now()
            body = json.loads(data)
            if status != 200:
                raise RuntimeError(f"event {i}: {status} {body}")
            first, last = await asyncio.to_thread(fleets.wait_all, body["plan_version"], 120)
            out["rows"].append({"kind": ev, "source": body["plan_source"], "ack": t_ack - t0,
                                "first": first - t0, "all": last - t0,
                                "cpu": cpu_s(args.server_pid) - c0,
                                "client_cpu": fleets.cpu() - k0})
            x = out["rows"][-1]
            log(f"{kind} {name} {i} {ev} v{body['plan_version']} ({body['plan_source']}): ack "
                f"{x['ack'] * 1000:.1f} ms, first {x['first'] * 1000:.1f} ms, "
                f"all {x['all'] * 1000:.1f} ms, cpu {x['cpu'] * 1000:.0f} ms")
            await asyncio.sleep(args.gap)
        if args.blast > 0:
            fleets.blast.set()
            await asyncio.sleep(1.0)
            a = await beats_cpu(admin, args.server_pid)
            await asyncio.sleep(args.blast)
            out["blast"] = rate(a, await beats_cpu(admin, args.server_pid))
            fleets.blast.clear()
            log(f"{kind} {name}: saturated {out['blast'][0]:.0f} heartbeats/s, service "
                f"{out['blast'][1]:.2f} cores")
    finally:
        fleets.stop()
        await close(poster)
        await admin.post(f"/v1/jobs/{job}/finish")  # else its silent workers get declared failed
        await admin.aclose()
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(client, res, args):
    fail = [x for x in res["rows"] if x["kind"] == "failure"]
    ms = [x["all"] * 1000 for x in fail]
    ack = [x["ack"] * 1000 for x in fail]
    first = [x["first"] * 1000 for x in fail]
    cpu = sum(x["cpu"] for x in fail) * 1000 / len(fail)
    ccpu = sum(x["client_cpu"] for x in fail) * 1000 / len(fail)
    steady, blast = res["steady"], res.get("blast", (float("nan"),) * 3)
    who = ("per worker" if res["mode"] == "workers"
           else f"via {res['units']} agents ({args.per_node} per node)")
    return (f"| {res['workers']:,} | {who} | {client} | {len(fail)} | {pct(ack, 50):.1f} "
            f"| {pct(first, 50):.1f} | **{pct(ms, 50):.1f}** | {pct(ms, 90):.1f} "
            f"| **{pct(ms, 99):.1f}** | {cpu:.0f} | {ccpu:.0f} | {steady[0]:,.0f} | {steady[1]:.2f} "
            f"| {steady[2]:.0f} | {blast[0]:,.0f} | {blast[1]:.2f} |")


def sizes_of(text):
    out = []
    for part in text.split(","):
        n = int(part)
        if n % 16:
            raise SystemExit(f"--sizes: {n} is not a multiple of 16 stages")
        out.append(n)
    return out


async def main_async(args, url, kind):
    rng = random.Random(0)
    res = []
    for i, n in enumerate(args.sizes):
        D, S, M = n // 16, 16, args.microbatches
        for j, mode in enumerate(args.modes):
            if mode == "agents" and kind != "raw":
                continue
            # fail one worker, recover it, next one: every set has <= 1 failure (cached)
            ws = [(rng.randrange(D), rng.randrange(S)) for _ in range(args.failures)]
            events = [(k, *w) for w in ws for k in ("failure", "recovery")]
            # a different spec per case, so no case finds plans another one cached
            f = 10 + 2 * ["raw", "httpx"].index(kind) + 4 * i + j
            res.append(await scenario(url, kind, mode, uniform_spec(D, S, M, F=f), events,
                                      args))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256,1024,4096", help="workers per job (x 16 stages)")
    ap.add_argument("--modes", default="workers,agents", help="workers, agents or both")
    ap.add_argument("--per-node", type=int, default=8, help="workers per agent")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--failures", type=int, default=20, help="failure events per case")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between events (after "
                    "all workers hold the last version)")
    ap.add_argument("--heartbeat-interval", type=float, default=1.0,
                    help="seconds between heartbeats of a worker, or of an agent")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of events per case "
                    "at most (no new failure after that)")
    ap.add_argument("--steady", type=float, default=10.0, help="seconds of steady state")
    ap.add_argument("--blast", type=float, default=5.0, help="seconds of saturation (0: none)")
    ap.add_argument("--procs", type=int, default=2, help="client processes the simulated "
                    "workers are spread over")
    ap.add_argument("--client", default="raw", help="raw, httpx or both (raw,httpx)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/service_latency.md"))
    args = ap.parse_args()
    args.sizes = sizes_of(args.sizes)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    kinds = [k.strip() for k in args.client.split(",") if k.strip()]
    if not kinds or set(kinds) - {"raw", "httpx"}:
        ap.error("--client: raw, httpx or raw,httpx")
    if not args.modes or set(args.modes) - {"workers", "agents"}:
        ap.error("--modes: workers, agents or workers,agents")
    port = free_port()
    url, res, tmp = f"http://127.0.0.1:{port}", {}, tempfile.mkdtemp(prefix="recycle-bench-")
    cmd = [sys.executable, "-m", "api", "serve", "--db", f"{tmp}/bench.db", "--port", str(port),
           "--admin-token", ADMIN, "--solvers", "greedy", "--heartbeat-timeout", "120",
           "--log-level", "warning"]
    load0, loads = os.getloadavg(), []
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
            loads.append(os.getloadavg()[0])
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
    rows = [summarize(k, r, args) for k, rs in res.items() for r in rs]
    hb = args.heartbeat_interval
    lines = [
        "# Service latency and heartbeat cost: failure event to new plan on every worker", "",
        f"Simulated workers ({', '.join(f'{n:,}' for n in args.sizes)}: D replicas x 16 "
        f"stages, {args.microbatches} micro-batches each) in {args.procs} client processes, "
        "either each worker on its own (it long-polls its share of the plan on one "
        f"keep-alive connection and heartbeats every {hb:g} s on another: the service as "
        f"without agents) or through simulated node agents, one per {args.per_node} workers "
        "(one long-poll for the node's share, from which the agent builds each of its "
        f"workers' shares, and one heartbeat for all of them every {hb:g} s). The service "
        f"(`python -m api serve`, {server_stack()}, SQLite WAL + synchronous=FULL, greedy "
        "solver) in another process; loopback only.", "",
        "Latency = from sending the failure POST (on its own connection) until the last "
        "worker holds (has JSON-decoded) a plan with the version the event produced; every "
        "failed set is precomputed (a worker fails, then recovers: k=1 cache hits). `ack` = "
        "the POST's round trip; `first` = until the first worker has it; `CPU/event` = CPU "
        "time the service used from the POST until the last worker had the plan, mean per "
        "failure; `clients' CPU/event` the same for the client processes (every simulated "
        "worker or agent decoding its share, on the same 2 cores; real agents decode on "
        "their own machines). `steady`: over "
        f"{args.steady:g} s with no events, worker heartbeats taken per second, the "
        "service's CPU in cores, and its CPU per 1,000 worker heartbeats (long-polls parked "
        "meanwhile). `saturated`: every sender back to back for "
        f"{args.blast:g} s, the worker heartbeats per second the service took (the clients "
        "share the 2 cores, so this is a floor).", "",
        "| workers | heartbeats and long-polls | client | failures | ack p50 ms "
        "| first p50 ms | all-workers p50 ms | p90 ms | p99 ms | CPU/event ms "
        "| clients' CPU/event ms "
        "| steady heartbeats/s | steady service cores | CPU ms / 1,000 heartbeats "
        "| saturated heartbeats/s | saturated service cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"Up to {args.failures} failures per case (fewer where --budget {args.budget:g} s ran "
        "out: see `failures`); with so few, p99 (nearest rank) is the max. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other "
        f"engineers' test runs), Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}; load average (1 min) {load0[0]:.2f} before, "
        f"{load1[0]:.2f} after.", "",
        "Command:", "", "```",
        "PYTHONPATH=. .venv/bin/python benchmarks/service_latency.py " + " ".join(sys.argv[1:]),
        "```", ""]
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""  # a hand-written "## Notes" part stays
    text = "\n".join(lines) + (old[old.index("## Notes"):] if "## Notes" in old else "")
    out.parent.mkdir(parents=True, exist_ok=True), out.write_text(text), print(text)


if __name__ == "__main__":
    main()
