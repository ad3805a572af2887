"""The service's work per failure event at 4,096 workers (256 x 16 x 4), timed piece by
piece in one process (the pieces of api/service.py's event path and api/fastpath.py's
shares, called directly): map the cached canonical plan, serialise it, store it, parse it
once for the shares, build 512 node shares of 8 workers.

    PYTHONPATH=. .venv/bin/python benchmarks/service_event_cost.py
"""
import json, tempfile, time, statistics
from types import SimpleNamespace
from planner.job import JobSpec
from planner.solvers.backends import solve
from planner.cache import PlanCache
from api.fastpath import node_view
spec = JobSpec.uniform(256, 16, 4)
d = tempfile.mkdtemp()
c = PlanCache(d + "/c.db")
c.put(solve(spec, [(0, 3)], "greedy"))
grid = [[1] * 16 for _ in range(256)]
T = {k: [] for k in ("map (cache.get)", "to_json", "sqlite write+fsync", "views: per-version parts", "views: 512 node shares")}
import sqlite3, inspect
VERIFY = "verify" in inspect.signature(PlanCache.get).parameters
if VERIFY:
    T["after the answer: greedy check"] = []
db = sqlite3.connect(d + "/s.db"); db.execute("pragma journal_mode=wal"); db.execute("pragma synchronous=full")
db.execute("create table p(v int, j text)")
for i in range(6):
    f = [(17 + 37 * i, 3)]
    if VERIFY:  # the event's lookup; the greedy check of the renumbering after the answer
        t = time.perf_counter(); p = c.get(spec, f, verify=False); T["map (cache.get)"].append(time.perf_counter() - t)
        t = time.perf_counter(); c.verify(spec, f); T["after the answer: greedy check"].append(time.perf_counter() - t)
    else:  # a tree before verify=False: the check on the event's path
        t = time.perf_counter(); p = c.get(spec, f); T["map (cache.get)"].append(time.perf_counter() - t)
    p = p.stamped(i + 1, grid)
    t = time.perf_counter(); js = p.to_json(); T["to_json"].append(time.perf_counter() - t)
    t = time.perf_counter(); db.execute("insert into p values(?,?)", (i, js)); db.commit(); T["sqlite write+fsync"].append(time.perf_counter() - t)
    job = SimpleNamespace(id="j", plan_bytes=js.encode(), views={}, spec=spec, plan=p)
    t = time.perf_counter(); node_view(job, 0, 8); T["views: per-version parts"].append(time.perf_counter() - t)
    t = time.perf_counter()
    for n in range(1, 512): node_view(job, n, 8)
    T["views: 512 node shares"].append(time.perf_counter() - t)
try:
    from executor.node.agent import worker_share
except ImportError:  # a tree before the cut shares (for side-by-side runs): the old agent's
    def worker_share(share, worker):
        entry = next(w for w in share["workers"] if (w["replica"], w["stage"]) == worker)
        return {**entry, **{k: v for k, v in share.items() if k not in ("node_rank", "workers")}}
share = node_view(job, 5, 8)
t = time.perf_counter()
for _ in range(20):
    d = json.loads(share); [worker_share(d, (w["replica"], w["stage"])) for w in d["workers"]]
dec = (time.perf_counter() - t) / 20
for k, v in T.items():
    print(f"{k}: median {statistics.median(v) * 1000:.0f} ms (min {min(v) * 1000:.0f})")
print(f"one node share: {len(share) / 1e3:.1f} kB; an agent decodes it and cuts its "
      f"workers' shares in {dec * 1000:.2f} ms")
