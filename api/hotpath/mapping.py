"""planner.solvers.backends.map_plan, memoised per canonical replica.

A single failure of replica d renumbers the canonical plan by a permutation that moves
replicas 0..d only, and the next failure's moves most of the same replicas the same way.
map_plan rebuilds every moved worker's actions each time (25-200 ms at 4,096 workers, more
the later the failed replica); here the mapped workers of one canonical replica (all its
stages) are kept, keyed by the canonical plan's worker list, the replica and where the
permutation sends every replica their micro-batches belong to. A hit costs a dict lookup
per replica. The result equals map_plan's (tests/test_service_hotpath.py); jobs with
speeds go to map_plan itself (their job is renumbered too).
"""
from __future__ import annotations

import threading
from typing import Optional

from planner.failures import Canonical
from planner.plan import Plan, WorkerPlan, make_action
from planner.solvers.backends import map_plan


class _Layout:
    """Per canonical plan (its `workers` list): each replica's workers, in stage order, and
    the replicas whose micro-batches they run."""

    def __init__(self, plan: Plan):
        M = plan.job.microbatches
        self.blocks: dict[int, list[WorkerPlan]] = {}
        for w in plan.workers:
            self.blocks.setdefault(w.replica, []).append(w)
        for ws in self.blocks.values():
            ws.sort(key=lambda w: w.stage)
        self.touched = {c: tuple(sorted({c} | {a.microbatch // M for w in ws
                                               for a in w.actions if a.microbatch is not None}))
                        for c, ws in self.blocks.items()}


class MemoMapper:
    """Callable as map_plan(plan, canon), for PlanCache.mapper. `limit`: mapped blocks kept
    and moved actions kept (all are dropped at once beyond it, or beyond 64 canonical plans)."""

    def __init__(self, limit: int = 200_000):
        self.limit = limit
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._layouts: dict[int, tuple[list, _Layout]] = {}  # id(plan.workers) -> layout
        self._blocks: dict[tuple, list[WorkerPlan]] = {}
        self._actions: dict[tuple, object] = {}  # moved actions, shared between blocks
        self._lists: dict[tuple, list] = {}      # and lists of them

    def __call__(self, plan: Plan, canon: Canonical) -> Plan:
        perm = canon.perm
        if list(perm) == sorted(perm):
            return plan
        if plan.job.speed is not None:
            return map_plan(plan, canon)
        with self._lock:
            if len(self._blocks) + len(self._actions) + len(self._lists) > self.limit or len(self._layouts) > 64:
                self._clear()
            got = self._layouts.get(id(plan.workers))
            if got is None:  # the list is kept with its layout: its id stays its own
                got = self._layouts[id(plan.workers)] = (plan.workers, _Layout(plan))
            layout, wid = got[1], id(plan.workers)
            M = plan.job.microbatches
            mapped: dict[int, list[WorkerPlan]] = {}
            for c, ws in layout.blocks.items():
                to = tuple(perm[x] for x in layout.touched[c])
                if to == layout.touched[c]:  # nothing of this replica moves: as it is
                    mapped[c] = ws
                    continue
                key = (wid, c, to)
                block = self._blocks.get(key)
                if block is None:
                    block = self._blocks[key] = [self._worker(w, perm, M) for w in ws]
                mapped[perm[c]] = block
        workers = [w for d in sorted(mapped) for w in mapped[d]]
        routes: list[Optional[list[int]]] = [None] * len(plan.routes)
        for c in range(len(perm)):  # rows of canonical replica c become perm[c]'s
            src, dst = c * M, perm[c] * M
            for m in range(M):
                routes[dst + m] = [perm[d] for d in plan.routes[src + m]]
        failed = sorted((perm[r], s) for r, s in plan.failed)
        return plan.model_copy(update={"routes": routes, "workers": workers, "failed": failed})

    def _worker(self, w: WorkerPlan, perm, M: int) -> WorkerPlan:
        """w renumbered, as map_plan does it: its actions kept unless one moves."""
        acts = w.actions
        if any(a.microbatch is not None and perm[a.microbatch // M] != a.microbatch // M
               for a in acts):
            out = []
            for a in acts:
                g = a.microbatch
                if g is None or perm[g // M] == g // M:
                    out.append(a)
                    continue
                k = (a.op, perm[g // M] * M + g % M, a.start, a.end)
                b = self._actions.get(k)
                out.append(b if b is not None else self._actions.setdefault(k, make_action(*k)))
            ids = tuple(map(id, out))  # equal lists shared, as the cache shares them
            acts = self._lists.get(ids)
            if acts is None:
                acts = self._lists[ids] = out
        return WorkerPlan.model_construct(replica=perm[w.replica], stage=w.stage, actions=acts)
