"""Background solving: a small process pool fed from a priority queue.

Solves run in child processes (spawned, niced) so CP-SAT's model building never holds the
service's GIL. Priorities: 0 improve the plan in force after a cache miss, 1 precompute
with greedy, 2 precompute with cpsat; so every likely failed set gets a plan fast, and a
live job's improvement never waits behind another job's precompute backlog.
Progress is persisted per job; after a restart precompute resumes where it stopped.
"""
from __future__ import annotations

import asyncio
import gc
import importlib.util
import itertools
import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Optional

from planner.cache import mode_key
from planner.failures import Worker, canonical_sets
from planner.plan import Mode, Plan
from planner.procs import die_with_parent

log = logging.getLogger("recycle.api")
IMPROVE, GREEDY, CPSAT = 0, 1, 2
# Failed sets of this size are kept ready for the event path (Service.warm): single
# failures are the likeliest events; all sets of two would not fit in memory at scale.
WARM_FAILURES = 1


def cpsat_available() -> bool:
    return importlib.util.find_spec("planner.solvers.cpsat") is not None


def _child_init() -> None:
    # A SIGKILLed service runs no cleanup: without this its solver processes (and, through
    # the pipe they inherit, multiprocessing's resource tracker, which exits at EOF once
    # every holder of the pipe is gone) ran on forever under pid 1. PR_SET_PDEATHSIG fires
    # when the *thread* that spawned us exits: see BackgroundSolver._get_pool.
    die_with_parent()
    try:
        os.nice(10)
    except OSError:
        pass


def _solve_child(spec_json: str, failed: list, solver: str, canonical: bool,
                 time_limit: float) -> tuple[str, float]:
    from planner.solvers.backends import SolveOptions, solve
    from planner.job import JobSpec
    t0 = time.perf_counter()
    plan = solve(JobSpec.model_validate_json(spec_json), failed, solver,
                 opts=SolveOptions(time_limit=time_limit, num_workers=1), canonical=canonical)
    return plan.to_json(), time.perf_counter() - t0


def greedy_if_better(spec_json: str, failed: list, period: int) -> Optional[str]:
    """Greedy's plan for `failed` as numbered (JSON) if its period beats `period`, else
    None: the service parses 2.9 MB at 4,096 workers only when it will use it."""
    from planner.solvers.backends import solve
    from planner.job import JobSpec
    plan = solve(JobSpec.model_validate_json(spec_json), failed, "greedy", canonical=False)
    return plan.to_json() if plan.metrics.period < period else None


def settle() -> None:
    """After a precompute or warm-up: collect, then move every object alive into the
    garbage collector's permanent generation (gc.freeze). The cache's plans and the event
    path's memos are hundreds of thousands of long-lived objects; left in the oldest
    generation, each full collection walks them all (0.3-1.3 s at 4,096 workers on the
    test machine, every few seconds under heartbeat load: pauses on the event path).
    Frozen objects are still freed by reference counting when the cache drops them; only
    cycles among them would outlive it, and plans have none."""
    gc.collect()
    gc.freeze()


class BackgroundSolver:
    def __init__(self, workers: int = 1):
        self.workers = max(1, workers)
        self._pool: Optional[ProcessPoolExecutor] = None
        self._queue: Optional[asyncio.PriorityQueue] = None
        self._loops: list[asyncio.Task] = []
        self._seq = itertools.count()
        self._breaks = 0  # after two broken pools, solve in threads instead
        self._busy = 0

    def start(self) -> None:
        self._queue = asyncio.PriorityQueue()
        self._loops = [asyncio.create_task(self._run()) for _ in range(self.workers)]

    def _get_pool(self) -> ProcessPoolExecutor:
        # Called on the event loop's thread only, and the pool spawns its processes in
        # submit(), i.e. in run_in_executor on that same thread (the manager thread would
        # spawn only with max_tasks_per_child, not used here). That thread runs until the
        # service stops, after stop() has shut the pool down, so the children's death
        # signal (_child_init) fires when the service dies, not before.
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, initializer=_child_init,
                                             mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    async def solve(self, priority: int, spec_json: str, failed: list, solver: str,
                    canonical: bool, time_limit: float) -> tuple[Plan, float]:
        text, wall = await self.call(priority, _solve_child, spec_json, failed, solver,
                                     canonical, time_limit)
        return Plan.from_json(text), wall

    async def call(self, priority: int, fn, *args):
        """fn(*args) in a child process (a module-level function: spawn pickles it)."""
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put((priority, next(self._seq), (fn, args), fut))
        return await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            _, _, (fn, args), fut = await self._queue.get()
            if fut.done():
                continue
            self._busy += 1
            try:
                try:
                    pool = self._get_pool() if self._breaks < 2 else None
                    res = await loop.run_in_executor(pool, fn, *args)
                except BrokenProcessPool:
                    # e.g. a __main__ that cannot be re-imported by spawn: fall back to a
                    # thread (holds the GIL longer, but the solve still happens)
                    self._pool, self._breaks = None, self._breaks + 1
                    log.warning("solver process pool broke; retrying in a thread")
                    res = await loop.run_in_executor(None, fn, *args)
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                if not fut.done():
                    fut.set_exception(e)
            else:
                if not fut.done():
                    fut.set_result(res)
            finally:
                self._busy -= 1

    async def stop(self) -> None:
        for t in self._loops:
            t.cancel()
        if self._pool is not None:
            if not self._busy:
                self._pool.shutdown(wait=True, cancel_futures=True)
            else:  # a CP-SAT run may have seconds left: do not wait for it
                procs = list(getattr(self._pool, "_processes", {}).values())
                self._pool.shutdown(wait=False, cancel_futures=True)
                for p in procs:
                    p.kill()
            self._pool = None


class Precomputer:
    """Fills the plan cache for every job's likely failed sets, and improves plans in force."""

    def __init__(self, service, bg: BackgroundSolver):
        self.service, self.bg = service, bg
        self.cfg = service.config
        self._tasks: set[asyncio.Task] = set()

    def solvers(self) -> list[str]:
        return [s for s in self.cfg.solvers if s != "cpsat" or cpsat_available()]

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start(self, job) -> None:
        self._spawn(self._precompute(job))

    def improve(self, job, failed: list[Worker], spec=None) -> None:
        """CP-SAT for (`spec`, `failed`) (default: the spec of the plan in force, i.e. the
        job with its speeds); published only if both are still those in force."""
        if "cpsat" in self.solvers():
            self._spawn(self._improve(job, list(failed), spec or job.plan.job))

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _improve(self, job, failed: list[Worker], spec) -> None:
        try:
            plan, wall = await self.bg.solve(IMPROVE, spec.model_dump_json(), failed,
                                             "cpsat", True, self.cfg.cpsat_time_limit_s)
        except Exception as e:  # noqa: BLE001 - the greedy plan stays in force
            log.warning("job %s: cpsat improvement failed: %s", job.id, e)
            return
        self.service.metrics.solve_seconds.labels("cpsat", "improve").observe(wall)
        await asyncio.to_thread(self.service.cache.put, plan)
        await self.service.offer(job, failed, "improved:cpsat", spec)

    async def _warm(self, job) -> None:
        """Service.warm for every single-failure set of the job (the likeliest events)."""
        sets = await asyncio.to_thread(lambda: [
            c for c in itertools.islice(canonical_sets(job.spec, WARM_FAILURES),
                                        self.cfg.max_precompute_sets)
            if len(c.failed) == WARM_FAILURES])
        for canon in sets:
            if job.state != "running":
                return
            await self._warm_set(job, canon)
        settle()

    async def _warm_set(self, job, canon) -> None:
        try:
            await asyncio.to_thread(self.service.warm, job.spec, canon)
        except Exception as e:  # noqa: BLE001 - only the event path's speed is at stake
            log.warning("job %s: warming the plan of %s failed: %s", job.id, canon.key, e)

    async def _precompute(self, job) -> None:
        store, m = self.service.store, self.service.metrics
        row = store.precompute(job.id)
        if row is not None and row["state"] == "done" and job.state == "running":
            return await self._warm(job)  # after a restart: the likeliest sets in memory
        if row is None or row["state"] in ("done", "failed"):
            return
        solvers = self.solvers()
        try:
            sets = await asyncio.to_thread(
                lambda: list(itertools.islice(canonical_sets(job.spec, job.max_failures),
                                              self.cfg.max_precompute_sets + 1)))
        except Exception as e:  # noqa: BLE001
            store.set_precompute(job.id, state="failed", error=str(e)[:300])
            return
        note = None
        if len(sets) > self.cfg.max_precompute_sets:
            sets = sets[:self.cfg.max_precompute_sets]
            note = f"truncated to the first {len(sets)} failed sets"
        work = [(s, c) for s in solvers for c in sets]
        start = row["done"] if json.loads(row["solvers"]) == solvers else 0
        store.set_precompute(job.id, state="running", total=len(work), sets=len(sets),
                             solvers=json.dumps(solvers), done=start, error=note)
        m.precompute_total.labels(job.id).set(len(work))
        spec_json, spec_hash, mode = job.spec.model_dump_json(), job.spec.spec_hash(), \
            mode_key(Mode())
        last_write, errors = time.monotonic(), 0
        for i in range(start, len(work)):
            if job.state != "running":
                store.set_precompute(job.id, state="stopped", done=i,
                                     error=f"job {job.state}; precompute stopped")
                return
            solver, canon = work[i]
            have = store.cached_solver(spec_hash, canon.key, mode)
            if not (have is not None and (solver == "greedy" or have == solver)):
                try:
                    plan, wall = await self.bg.solve(GREEDY if solver == "greedy" else CPSAT,
                                                     spec_json, list(canon.failed), solver,
                                                     False, self.cfg.cpsat_time_limit_s)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - one bad set must not stop the rest
                    errors += 1
                    note = f"{errors} solve(s) failed, last: {solver} {canon.key}: {e}"[:300]
                    log.warning("job %s: precompute %s", job.id, note)
                else:
                    m.solve_seconds.labels(solver, "precompute").observe(wall)
                    await asyncio.to_thread(self.service.cache.put, plan)
                    if len(canon.failed) == WARM_FAILURES:
                        await self._warm_set(job, canon)
                    if canon.key == self.service.current_canonical_key(job):
                        # only while the job runs at its spec's own speeds
                        await self.service.offer(job, job.empty, f"precomputed:{solver}",
                                                 job.spec)
            m.precompute_done.labels(job.id).set(i + 1)
            if time.monotonic() - last_write > 0.5 or i + 1 == len(work):
                store.set_precompute(job.id, done=i + 1, error=note)
                last_write = time.monotonic()
        settle()
        store.set_precompute(job.id, state="done", done=len(work), error=note)
