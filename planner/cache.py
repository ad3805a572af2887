"""Plan cache in SQLite, keyed by (job spec hash, canonical failed set, mode).

Plans are stored for the canonical failed set and mapped back by the permutation on the
way out. A put keeps whichever plan has the smaller period, so a later CP-SAT improvement
replaces a greedy plan but a worse plan never overwrites a better one.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable, Optional

from planner.backends import SolveOptions, map_plan, solve
from planner.failures import Canonical, canonical_sets, canonicalize
from planner.job import JobSpec
from planner.plan import Plan
from planner.timeline import Mode

SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
  spec_hash TEXT NOT NULL,
  failed_key TEXT NOT NULL,
  mode TEXT NOT NULL,
  solver TEXT NOT NULL,
  period INTEGER NOT NULL,
  plan_json TEXT NOT NULL,
  created REAL NOT NULL,
  PRIMARY KEY (spec_hash, failed_key, mode)
)
"""


def mode_key(mode: Mode) -> str:
    return f"{'split' if mode.split_backward else 'fused'}-{mode.optimizer}"


class PlanCache:
    def __init__(self, path: str = ":memory:", memory_actions: int = 100_000):
        self.path = path
        self._lock = threading.Lock()
        # the canonical plans last read or written here, parsed, up to `memory_actions`
        # actions in all: a hit costs the mapping only, not a JSON parse (10 ms for 256
        # workers). Writers in other processes are seen once an entry ages out; until then
        # the plan served is still valid, only maybe not the best one.
        self._mem: OrderedDict[tuple, tuple[Plan, int]] = OrderedDict()
        self._mem_budget, self._mem_used = memory_actions, 0
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, job: JobSpec, failed, mode: Mode = Mode()) -> Optional[Plan]:
        canon = canonicalize(job, failed)
        key = (job.spec_hash(), canon.key, mode_key(mode))
        with self._lock:
            plan = self._mem.get(key, (None, 0))[0]
            if plan is not None:
                self._mem.move_to_end(key)
                return map_plan(plan, canon)
            row = self._db.execute("SELECT plan_json FROM plans WHERE spec_hash=? AND "
                                   "failed_key=? AND mode=?", key).fetchone()
        if row is None:
            return None
        plan = Plan.from_json(row[0])
        self._remember(key, plan, replace=False)  # a put meanwhile has the newer plan
        return map_plan(plan, canon)

    def _remember(self, key: tuple, plan: Plan, replace: bool = True) -> None:
        size = sum(len(w.actions) for w in plan.workers) + 1
        with self._lock:
            if not replace and key in self._mem:
                return
            self._mem_used += size - self._mem.pop(key, (None, 0))[1]
            self._mem[key] = (plan, size)
            while self._mem_used > self._mem_budget and self._mem:
                self._mem_used -= self._mem.popitem(last=False)[1][1]

    def put(self, plan: Plan, mode: Optional[Mode] = None) -> bool:
        """Store `plan` (any replica numbering) unless a better one is there; True if stored."""
        mode = mode or Mode(plan.solver.split_backward, plan.solver.optimizer == "staggered")
        canon = canonicalize(plan.job, plan.failed)
        if list(canon.perm) != sorted(canon.perm):
            plan = map_plan(plan, canon.inverse())
        key = (plan.job.spec_hash(), canon.key, mode_key(mode))
        with self._lock:
            row = self._db.execute(
                "SELECT period FROM plans WHERE spec_hash=? AND failed_key=? AND mode=?",
                key).fetchone()
            if row is not None and row[0] <= plan.metrics.period:
                return False
            self._db.execute(
                "INSERT OR REPLACE INTO plans VALUES (?,?,?,?,?,?,?)",
                (*key, plan.solver.name, plan.metrics.period, plan.to_json(), time.time()))
        self._remember(key, plan)
        return True

    def count(self, job: Optional[JobSpec] = None) -> int:
        with self._lock:
            if job is None:
                return self._db.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM plans WHERE spec_hash=?",
                                    (job.spec_hash(),)).fetchone()[0]


def precompute(cache: PlanCache, job: JobSpec, max_failures: int,
               solvers: Iterable[str] = ("greedy", "cpsat"), mode: Mode = Mode(),
               opts: SolveOptions = SolveOptions(),
               progress: Optional[Callable[[int, int, Canonical, Plan], None]] = None) -> int:
    """Fill the cache for every canonical failed set up to `max_failures`, each back-end
    in turn (greedy first so every set has a plan fast). Returns the number of sets."""
    sets = list(canonical_sets(job, max_failures))
    solvers = list(solvers)
    total, done = len(sets) * len(solvers), 0
    for solver in solvers:
        for canon in sets:
            plan = solve(job, canon.failed, solver, mode, opts, canonical=False)
            cache.put(plan, mode)
            done += 1
            if progress:
                progress(done, total, canon, plan)
    return len(sets)
