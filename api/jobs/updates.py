"""Plan versions after the event's answer: better plans offered by the solvers and the
cache's checks, resyncs after a suspect, publishing a version, and the long-polls that
wait for one."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from api import stragglers
from api.hotpath.encode import PARTS
from api.jobs.runtime import JobRuntime, _plan_record, _wait_event
from planner.control.decision_plan import stamp
from planner.failures import Worker, canonicalize
from planner.job import JobSpec
from planner.control.membership import Publish
from planner.plan import Plan
from planner.solvers.backends import solve

log = logging.getLogger("recycle.api")


class PlanUpdates:
    """Mixed into api.service.Service (uses its store, cache, config and metrics)."""

    def _plan_now(self, spec: JobSpec, failed: list[Worker]) -> tuple[Plan, str]:
        """Cached plan if there is one, else greedy (milliseconds). Runs in a thread."""
        t0 = time.perf_counter()
        plan = self.cache.get(spec, failed, verify=False)  # the greedy check: verify_later
        if plan is not None:
            self.metrics.cache_hits.inc()
            return plan, "cache"
        self.metrics.cache_misses.inc()
        plan = solve(spec, failed, "greedy")
        self.metrics.solve_seconds.labels("greedy", "event").observe(time.perf_counter() - t0)
        return plan, "greedy"

    def warm(self, spec: JobSpec, canon) -> None:
        """Ready the event path for canonical failed set `canon` of `spec` (runs in a
        thread): its plan parsed in the cache's memory, and mapped as if its failed
        replicas were the last ones, which moves every replica, so the mapper's memo holds
        the blocks most renumberings of this set need (api/hotpath/mapping.py), and the
        JSON of every action list of both (api/hotpath/encode.py)."""
        if spec.speed is not None:  # renumbered by map_plan itself, after a greedy check
            return
        D = spec.replicas
        mapped = self.cache.get(spec, [(D - 1 - c, s) for c, s in canon.failed], verify=False)
        if mapped is not None:  # and the JSON of its workers' action lists, both numberings
            PARTS.plan(mapped)
            PARTS.plan(self.cache.get(spec, list(canon.failed), verify=False))

    def verify_later(self, job: JobRuntime, failed: list[Worker], spec: JobSpec,
                     served: int) -> None:
        """After the answer: the cache's check of a served plan against greedy of the
        job's own replica numbering (planner/cache.py), left off the event's path; a
        better greedy plan is published as the next version."""
        if not self.cache.unverified(spec, failed):
            return

        async def check():
            from api.precompute import IMPROVE, greedy_if_better
            greedy = None
            if self.precomputer is not None:  # solved in a child process: the GIL stays
                try:                          # with the plan's fan-out
                    text = await self.precomputer.bg.call(
                        IMPROVE, greedy_if_better, spec.model_dump_json(),
                        [list(w) for w in failed], served)
                except Exception as e:  # noqa: BLE001 - then solve it here
                    log.warning("job %s: greedy check in a child failed: %s", job.id, e)
                else:
                    if text is None:  # not better: nothing to parse or store
                        return await asyncio.to_thread(self.cache.verify, spec, failed,
                                                       greedy=False)
                    greedy = await asyncio.to_thread(Plan.from_json, text)
            if await asyncio.to_thread(self.cache.verify, spec, failed, greedy=greedy):
                await self.offer(job, failed, "greedy:renumbered", spec)
        self._background(check())

    async def offer(self, job: JobRuntime, failed: list[Worker], cause: str,
                    spec: Optional[JobSpec] = None) -> bool:
        """A better plan for (`spec`, `failed`) may be in the cache now: publish it if it is
        for the job's current failed set and speeds (those of the plan in force; `spec`
        None: whatever they are) and beats the plan in force."""
        async with job.lock:
            if job.state != "running" or [tuple(x) for x in failed] != job.empty:
                return False
            current = job.plan.job
            if spec is not None and spec.spec_hash() != current.spec_hash():
                return False
            plan = await asyncio.to_thread(self.cache.get, current, job.empty)
            if plan is None or plan.metrics.period >= job.plan.metrics.period:
                return False
            job.members, decision = job.members.improved(cause)
            plan = stamp(plan, decision)  # the roles in force, nobody moves
            record = _plan_record(plan, cause)
            self.store.add_plan(job.id, record)
            self._install(job, plan, record["json"], cause)
            log.info("job %s: %s published v%d (period %d)", job.id, cause, plan.version,
                     plan.metrics.period)
            return True

    def resync_later(self, job: JobRuntime, version: int) -> None:
        self._background(self._resync_if_stuck(job, version, self.config.patience.resync_after))

    async def _resync_if_stuck(self, job: JobRuntime, version: int, delay: float) -> None:
        """After a suspect report, some workers have aborted their iteration and wait for a
        newer plan. If no failure followed (the suspect kept heartbeating), publish the same
        failed set again as a new version, so every worker rebuilds its communicators."""
        await asyncio.sleep(delay)
        async with job.lock:
            members, decision = job.members.resync(version)
            if not isinstance(decision, Publish):
                return
            job.members = members
            plan = stamp(job.plan, decision)  # the roles in force, no moves again
            record = _plan_record(plan, "resync")
            self.store.add_plan(job.id, record)
            self._install(job, plan, record["json"], "resync")
            log.info("job %s: suspect alive after %.2f s: re-published v%d", job.id, delay,
                     plan.version)

    async def wait_newer(self, job: JobRuntime, after: Optional[int], wait: float) -> bool:
        """True once the job has a plan newer than `after` (or halts); False on timeout."""
        if after is None or job.version > after or job.state == "halted":
            return True
        deadline = time.monotonic() + min(max(wait, 0.0), self.config.max_wait_s)
        self.metrics.waiters.inc()
        try:
            while job.version <= after and job.state != "halted":
                left = deadline - time.monotonic()
                if left <= 0 or self.closing:
                    return False
                try:
                    await _wait_event(job.changed, left)
                except asyncio.TimeoutError:
                    return False
            return True
        finally:
            self.metrics.waiters.dec()

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _prebuild(self, job: JobRuntime, plan: Plan) -> dict:
        """`plan`'s shares (job.views) for the nodes whose agents long-poll, built before it
        is published (api/hotpath/views.py prebuilt_views, set by the app); {} on any error:
        they are then built on demand, as without this."""
        if self.prebuild is None:
            return {}
        try:
            return self.prebuild(job, plan)
        except Exception as e:  # noqa: BLE001 - only speed is at stake
            log.warning("job %s: prebuilding shares failed: %s", job.id, e)
            return {}

    def _install(self, job: JobRuntime, plan: Plan, plan_json: str, cause: str,
                 views: Optional[dict] = None) -> None:
        job.plan, job.plan_bytes, job.views = plan, plan_json.encode(), views or {}
        # the version's pages into the database file, after the answers (a thread)
        self._background(asyncio.to_thread(self.store.checkpoint))
        job.remember()
        self.metrics.plan_version.labels(job.id).set(plan.version)
        self.metrics.slow_workers.labels(job.id).set(stragglers.slow_count(plan.job))
        self.metrics.plans_published.labels(cause.split(":")[0]).inc()
        job.notify()

    def current_canonical_key(self, job: JobRuntime) -> str:
        """The canonical failed set in force, of the job's own grid (precomputed plans are
        of it; a plan of another shape has slots of its own grid, which none matches)."""
        if job.plan.partition is not None:
            return f"shape:{job.plan.partition.key()}"
        return canonicalize(job.spec, job.empty).key
