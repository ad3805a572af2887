"""The service's work per failure event at 4,096 workers (256 x 16 x 4), timed piece by
piece in one process: the pieces of api/service.py's event path and api/fastpath.py's
shares, called directly, after a precompute of every single-failure set (as the service
does for a job registered with max_failures=1), its warm-up (Service.warm) and
gc.freeze (api/precompute.py settle).

Events are single failures of random workers (seeded), each followed by its recovery; per
failure: the cache lookup and renumbering, the plan's JSON, its fsync'd SQLite write, the
shares' per-version parts and 512 node shares of 8 workers. Side by side in the same run,
the old ways of the same pieces: a lookup whose plan was not kept parsed (Plan.from_json
of the stored JSON, then map_plan), map_plan on a parsed plan, Plan.to_json. On a tree
without api/hotpath (before) it times that tree's own path. Also: the process's resident
memory after the precompute.

    PYTHONPATH=. .venv/bin/python benchmarks/service_event_cost.py [--events 20]
"""
import argparse
import gc
import json
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from planner.cache import PlanCache
from planner.failures import canonical_sets, canonicalize
from planner.job import JobSpec
from planner.plan import Plan
from planner.solvers.backends import map_plan, solve
try:
    from api.hotpath.views import node_view
except ImportError:  # a tree before api/hotpath/views.py (for side-by-side runs)
    from api.fastpath import node_view

try:
    from api.hotpath.encode import PARTS
    from api.hotpath.mapping import MemoMapper
    HOT = True
except ImportError:  # a tree before api/hotpath (for side-by-side runs)
    HOT = False


def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=256)
    args = ap.parse_args()
    spec = JobSpec.uniform(args.replicas, 16, 4)
    D, S = spec.replicas, spec.stages
    d = tempfile.mkdtemp()
    cache = PlanCache(d + "/c.db", 300_000)  # ServiceConfig.cache_memory_actions
    if HOT:
        cache.mapper = MemoMapper()
    rss0, t0 = rss_mb(), time.perf_counter()
    sets = list(canonical_sets(spec, 1))
    for canon in sets:
        cache.put(solve(canon.job(spec), canon.failed, "greedy", canonical=False))
        if HOT and canon.failed:  # Service.warm
            PARTS.plan(cache.get(spec, [(D - 1 - c, s) for c, s in canon.failed],
                                 verify=False))
            PARTS.plan(cache.get(spec, list(canon.failed), verify=False))
    if HOT:  # api/precompute.py settle(): the cache's objects out of the collector's way
        gc.collect()
        gc.freeze()
    pre = time.perf_counter() - t0
    rss1 = rss_mb()
    grid = [[1] * S for _ in range(D)]
    db = sqlite3.connect(d + "/s.db")
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=full")
    db.execute("create table p(v int, j text)")
    T = {k: [] for k in ("lookup and renumbering (cache.get)", "the plan's JSON",
                         "SQLite write + fsync", "shares: per-version parts",
                         "shares: 512 node shares", "sum of the above")}
    old = {k: [] for k in ("lookup of a plan not kept parsed (Plan.from_json + map_plan)",
                           "map_plan of a parsed plan", "Plan.to_json")}
    rng = random.Random(13)
    share = None
    for i in range(args.events):
        f = [(rng.randrange(D), rng.randrange(S))]
        t = time.perf_counter()
        p = cache.get(spec, f, verify=False)
        a = time.perf_counter(); T["lookup and renumbering (cache.get)"].append(a - t)
        p = p.stamped(i + 1, grid)
        js = PARTS.plan(p) if HOT else p.to_json()
        b = time.perf_counter(); T["the plan's JSON"].append(b - a)
        db.execute("insert into p values(?,?)", (i, js))
        db.commit()
        c = time.perf_counter(); T["SQLite write + fsync"].append(c - b)
        job = SimpleNamespace(id="j", plan_bytes=js.encode(), views={}, spec=spec, plan=p)
        node_view(job, 0, 8)
        e = time.perf_counter(); T["shares: per-version parts"].append(e - c)
        for n in range(1, D * S // 8):
            node_view(job, n, 8)
        g = time.perf_counter(); T["shares: 512 node shares"].append(g - e)
        T["sum of the above"].append(g - t)
        share = node_view(job, 5, 8)
        # the old ways, side by side (not on this event's path)
        canon = canonicalize(spec, f)
        row = cache._db.execute("SELECT plan_json FROM plans WHERE failed_key=?",
                                (canon.key,)).fetchone()[0]
        t = time.perf_counter()
        parsed = Plan.from_json(row)
        a = time.perf_counter()
        mapped = map_plan(parsed, canon)
        b = time.perf_counter()
        old["lookup of a plan not kept parsed (Plan.from_json + map_plan)"].append(b - t)
        old["map_plan of a parsed plan"].append(b - a)
        t = time.perf_counter()
        text = mapped.stamped(i + 1, grid).to_json()
        old["Plan.to_json"].append(time.perf_counter() - t)
        assert text == js, "the event path's JSON must be Plan.to_json's"
        del parsed, mapped, text
    try:
        from executor.node.agent import worker_share
    except ImportError:
        worker_share = None
    t = time.perf_counter()
    for _ in range(20):
        dec = json.loads(share)
        if worker_share:
            [worker_share(dec, (w["replica"], w["stage"])) for w in dec["workers"]]
    dec_ms = (time.perf_counter() - t) / 20 * 1000

    def fmt(v):
        return f"median {statistics.median(v) * 1000:.1f} ms, p90 " \
               f"{sorted(v)[int(0.9 * (len(v) - 1))] * 1000:.1f}, max {max(v) * 1000:.1f}"
    print(f"{D * S} workers, {args.events} single failures, tree "
          f"{'with' if HOT else 'without'} api/hotpath")
    print(f"precompute + warm-up of {len(sets)} sets: {pre:.1f} s; resident memory "
          f"{rss0:.0f} -> {rss1:.0f} MB (+{rss1 - rss0:.0f})")
    for k, v in T.items():
        print(f"  {k}: {fmt(v)}")
    print("side by side, the old ways:")
    for k, v in old.items():
        print(f"  {k}: {fmt(v)}")
    print(f"one node share: {len(share) / 1e3:.1f} kB; an agent decodes it and cuts its "
          f"workers' shares in {dec_ms:.2f} ms")
    import gzip
    whole = job.plan_bytes
    t = time.perf_counter()
    gz = gzip.compress(whole, 1, mtime=0)
    gz_ms = (time.perf_counter() - t) * 1000
    nodes = D * S // 8
    print(f"the whole plan (what the executor's workers take, fetched once per node and "
          f"version through an agent): {len(whole) / 1e6:.2f} MB, gzip level 1 "
          f"{len(gz) / 1e3:.0f} kB in {gz_ms:.0f} ms (once per version); {nodes} agents "
          f"fetch {nodes * len(whole) / 1e9:.2f} GB -> {nodes * len(gz) / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
