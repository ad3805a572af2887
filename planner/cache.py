"""Plan cache in SQLite, keyed by (job identity hash, canonical key, mode).

Plans are stored for the canonical case (failed set and, with stragglers, the quantised
speed grid, renumbered: planner/failures.py) and mapped back by the permutation on the way
out; a plan is only ever served for the exact job it was made for (`cache_key`). The
identity hash leaves speeds out (JobSpec.identity_hash), so one job's plans for every
speed pattern share it; without speeds it is the spec hash. A put keeps whichever plan has
the smaller period, so a later CP-SAT improvement replaces a greedy plan but a worse plan
never overwrites a better one.

A cached plan is never worse than the greedy plan of the case asked for: the greedy plan
depends on the replica numbering (ties go to lower replicas) and on speeds, so the first
`get` of a (case, numbering) in a process whose numbering differs from the canonical one,
or that has speeds, runs greedy (milliseconds; 0.2-0.5 s at 4,096 workers) and, if it is
better, stores and serves that instead. The service asks with `verify=False` on an event's
path and makes the check (`verify`) after the answer, publishing greedy's plan as the next
version if it is better: for a renumbering without speeds the two rarely differ. A stale
entry (routed before routing used speeds, or by a back-end that was handed a poor routing,
or greedy's plan of another numbering) never outlives one lookup.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable, Optional, Union

from planner.solvers.backends import SolveOptions, map_plan, solve
from planner.failures import Canonical, canonical_sets, canonicalize
from planner.job import JobSpec
from planner.plan import Plan, WorkerPlan, make_action
from planner.plan import Mode
from planner.shapes.partition import Partition

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


def cache_key(job: JobSpec, canon: Canonical, mode: Mode,
              partition: Optional[Partition] = None) -> tuple[str, str, str]:
    """(the job's identity hash, canonical key, mode): the row a case lives in. The
    identity leaves speeds out and the canonical key carries them, quantised; a job whose
    speeds are off the 0.1 grid gets its exact (renumbered) speeds appended, so it never
    shares a row with its quantised neighbour. Without speeds the hash is the spec hash.
    A plan of a shape (its partition set) has the partition appended to the hash: two
    cuts may make equal jobs, and a plan is served with the partition it was made for;
    unset, the key is what it was before shapes."""
    key = canon.key
    cjob = canon.job(job)
    if cjob.speed is not None:
        grid = canon.speed or tuple((1.0,) * job.stages for _ in range(job.replicas))
        if tuple(map(tuple, cjob.speed)) != grid:
            key += "#" + ";".join(f"{r}:{s}@{v!r}" for r, row in enumerate(cjob.speed)
                                  for s, v in enumerate(row) if v != 1.0)
    ident = job.identity_hash()
    if partition is not None:
        ident += "|" + partition.key()
    return ident, key, mode_key(mode)


class _Parts:
    """Equal parts of the plans kept parsed, shared: actions (frozen), workers' action
    lists and route rows. The canonical plans of one job differ in a few workers only (at
    4,096 workers, its 17 single-failure plans hold 905,200 actions of which 50,796 are
    distinct), so sharing keeps every one of them parsed for ~1/15 of the memory. Plans
    are data that nobody mutates (planner/plan.py), which makes the sharing safe."""

    def __init__(self):
        self.actions: dict[tuple, object] = {}
        self.lists: dict[tuple, list] = {}
        self.workers: dict[tuple, WorkerPlan] = {}
        self.rows: dict[tuple, list] = {}

    def __len__(self) -> int:
        return len(self.actions) + len(self.lists) + len(self.workers) + len(self.rows)

    def share(self, plan: Plan) -> tuple[Plan, int]:
        """`plan` made of shared parts, and how many parts it added (its memory charge)."""
        before = len(self)
        acts, lists, wps, rows = self.actions, self.lists, self.workers, self.rows
        workers = []
        for w in plan.workers:
            mine = []
            for a in w.actions:
                k = (a.op, a.microbatch, a.start, a.end)
                b = acts.get(k)
                mine.append(b if b is not None else acts.setdefault(k, make_action(*k)))
            ids = tuple(map(id, mine))  # the actions are shared: their ids name them
            shared = lists.get(ids)
            if shared is None:
                shared = lists[ids] = mine
            wkey = (w.replica, w.stage, id(shared))
            wp = wps.get(wkey)
            if wp is None:
                wp = wps[wkey] = WorkerPlan.model_construct(replica=w.replica, stage=w.stage,
                                                            actions=shared)
            workers.append(wp)
        routes = []
        for t in map(tuple, plan.routes):
            row = rows.get(t)
            routes.append(row if row is not None else rows.setdefault(t, list(t)))
        return plan.model_copy(update={"workers": workers, "routes": routes}), \
            len(self) - before


class PlanCache:
    def __init__(self, path: str = ":memory:", memory_actions: int = 100_000):
        self.path = path
        self._lock = threading.Lock()
        # the canonical plans last read or written here, parsed, up to `memory_actions`
        # parts in all (a part: an action, or a worker's list of them, or a route row;
        # ~600 B at most; equal parts are shared between plans, _Parts): a hit costs the
        # mapping only, not a JSON parse (10 ms at 256 workers, 130-200 ms at 4,096).
        # Writers in other processes are seen once an entry ages out; until then the plan
        # served is still valid, only maybe not the best one.
        self._mem: OrderedDict[tuple, tuple[Plan, int]] = OrderedDict()
        self._mem_budget, self._mem_used = memory_actions, 0
        self._parts, self._share_lock = _Parts(), threading.Lock()
        # canonical plan -> the asked numbering (planner.solvers.backends.map_plan); the
        # service puts a memoised equivalent here (api/hotpath/mapping.py)
        self.mapper: Callable[[Plan, Canonical], Plan] = map_plan
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)
        # (key, perm) pairs whose entry this process has checked against greedy (speeds)
        self._checked: set[tuple] = set()

    def close(self) -> None:
        self._db.close()

    def get(self, job: JobSpec, failed, mode: Mode = Mode(), *, verify: bool = True,
            partition: Optional[Partition] = None) -> Optional[Plan]:
        """The cached plan for (`job`, `failed`), mapped to their numbering; None on a miss.
        `verify=False` leaves out the greedy check of a renumbering without speeds (a
        greedy solve: 0.2 s at 4,096 workers, on an event's path); the caller then runs
        `verify` off that path. With speeds the check is always made here. `partition`:
        the plan of that shape (`job` is then the shaped job)."""
        canon = canonicalize(job, failed)
        key = cache_key(job, canon, mode, partition)
        with self._lock:
            plan = self._mem.get(key, (None, 0))[0]
            if plan is not None:
                self._mem.move_to_end(key)
            else:
                row = self._db.execute("SELECT plan_json FROM plans WHERE spec_hash=? AND "
                                       "failed_key=? AND mode=?", key).fetchone()
        if plan is None:
            if row is None:
                return None
            # a put meanwhile has the newer plan
            plan = self._remember(key, Plan.from_json(row[0]), replace=False)
        out = self.mapper(plan, canon)
        if verify or job.speed is not None:
            out = self._versus_greedy(job, failed, mode, key, canon, out) or out
        return out

    def verify(self, job: JobSpec, failed, mode: Mode = Mode(),
               greedy: Union[Plan, None, bool] = None,
               partition: Optional[Partition] = None) -> bool:
        """The check `get(verify=False)` left out: True if greedy of this numbering beat
        the cached plan (it is stored, and `get` serves it from now on). `greedy`: that
        plan, solved elsewhere (the service solves it in a child process); False: it was,
        and is no better (the case is only marked checked)."""
        canon = canonicalize(job, failed)
        key = cache_key(job, canon, mode, partition)
        if (key, canon.perm) in self._checked:
            return False
        if greedy is False:
            with self._lock:
                self._checked.add((key, canon.perm))
            return False
        out = self.get(job, failed, mode, verify=False, partition=partition)
        return out is not None and \
            self._versus_greedy(job, failed, mode, key, canon, out, greedy) is not None

    def unverified(self, job: JobSpec, failed, mode: Mode = Mode(),
                   partition: Optional[Partition] = None) -> bool:
        """Whether `get(verify=False)` left a check for `verify` to make (a renumbering
        without speeds, not checked yet in this process)."""
        canon = canonicalize(job, failed)
        return job.speed is None and self._unchecked(job, canon,
                                                     cache_key(job, canon, mode, partition))

    def _unchecked(self, job: JobSpec, canon: Canonical, key) -> bool:
        """A case whose cached plan may lose to greedy of the asked numbering (it has speeds,
        or is renumbered) and that this process has not checked yet."""
        renumbered = list(canon.perm) != sorted(canon.perm)
        return (job.speed is not None or renumbered) and (key, canon.perm) not in self._checked

    def _versus_greedy(self, job, failed, mode, key, canon, out: Plan,
                       greedy: Optional[Plan] = None) -> Optional[Plan]:
        """Greedy's plan if it beats `out` (then stored), once per (case, numbering)."""
        if not self._unchecked(job, canon, key):
            return None
        if greedy is None:
            greedy = solve(job, failed, "greedy", mode)
        if out.partition is not None:  # the same shape's plan: kept under its key
            greedy = greedy.model_copy(update={"partition": out.partition})
        better = greedy.metrics.period < out.metrics.period
        if better:
            self.put(greedy, mode)
        with self._lock:
            self._checked.add((key, canon.perm))
        return greedy if better else None

    def _remember(self, key: tuple, plan: Plan, replace: bool = True) -> Plan:
        """Keep `plan` parsed (made of shared parts); the plan kept for `key`. A plan is
        charged the parts it added; once the shared parts alone exceed the budget they are
        dropped (the plans kept hold theirs), so memory stays under twice the budget."""
        with self._lock:
            if not replace and key in self._mem:
                return self._mem[key][0]
        with self._share_lock:  # not self._lock: lookups go on meanwhile (30 ms at 4,096)
            if len(self._parts) > self._mem_budget:
                self._parts = _Parts()
            plan, size = self._parts.share(plan)
        size += (len(plan.workers) + len(plan.routes)) // 64 + 1  # the plan's own lists
        with self._lock:
            if not replace and key in self._mem:
                return self._mem[key][0]
            self._mem_used += size - self._mem.pop(key, (None, 0))[1]
            self._mem[key] = (plan, size)
            while self._mem_used > self._mem_budget and self._mem:
                self._mem_used -= self._mem.popitem(last=False)[1][1]
            return plan

    def put(self, plan: Plan, mode: Optional[Mode] = None) -> bool:
        """Store `plan` (any replica numbering) unless a better one is there; True if stored."""
        mode = mode or Mode(plan.solver.split_backward, plan.solver.optimizer == "staggered")
        if plan.roles is not None or plan.moves is not None:
            # the schedule of a filled-slot set is the same whoever fills the slots: it is
            # stored without roles, and stamped with the roles of the moment when served
            plan = plan.model_copy(update={"roles": None, "moves": None})
        canon = canonicalize(plan.job, plan.failed)
        key = cache_key(plan.job, canon, mode, plan.partition)
        if list(canon.perm) != sorted(canon.perm):
            plan = map_plan(plan, canon.inverse())
        with self._lock:
            row = self._db.execute(
                "SELECT period FROM plans WHERE spec_hash=? AND failed_key=? AND mode=?",
                key).fetchone()
            if row is not None and row[0] <= plan.metrics.period:
                return False
            self._db.execute(
                "INSERT OR REPLACE INTO plans VALUES (?,?,?,?,?,?,?)",
                (*key, plan.solver.name, plan.metrics.period, plan.to_json(), time.time()))
            self._checked = {c for c in self._checked if c[0] != key}  # a new plan
        self._remember(key, plan)
        return True

    def count(self, job: Optional[JobSpec] = None) -> int:
        """Plans stored in all, or for `job`: any failed set, any speeds."""
        with self._lock:
            if job is None:
                return self._db.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM plans WHERE spec_hash=?",
                                    (job.identity_hash(),)).fetchone()[0]


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
            plan = solve(canon.job(job), canon.failed, solver, mode, opts, canonical=False)
            cache.put(plan, mode)
            done += 1
            if progress:
                progress(done, total, canon, plan)
    return len(sets)
