"""Plan cache in SQLite, keyed by (job spec hash, canonical failed set, mode).

Plans are stored for the canonical failed set and mapped back by the permutation on the
way out. A put keeps whichever plan has the smaller period, so a later CP-SAT improvement
replaces a greedy plan but a worse plan never overwrites a better one.
"""
from __future__ import annotations

import sqlite3
import threading
import time
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
    def __init__(self, path: str = ":memory:"):
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, job: JobSpec, failed, mode: Mode = Mode()) -> Optional[Plan]:
        canon = canonicalize(job, failed)
        with self._lock:
            row = self._db.execute(
                "SELECT plan_json FROM plans WHERE spec_hash=? AND failed_key=? AND mode=?",
                (job.spec_hash(), canon.key, mode_key(mode))).fetchone()
        if row is None:
            return None
        return map_plan(Plan.from_json(row[0]), canon)

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
