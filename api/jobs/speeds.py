"""Speed events: an operator's speed for a worker, and the straggler detector's levels
from the workers' compute times (api/stragglers.py). A changed speed grid is a membership
transition (planner/control/membership.py `measured`): one plan version for the speeds in force."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Optional

from api import stragglers
from api.jobs.runtime import ApiError, JobRuntime, _plan_record, _speed_answer
from planner.control.decision_plan import stamp
from api.models import SpeedIn
from api.stragglers import SpeedError, quantize_speed
from planner.job import JobSpec
from planner.control.membership import Publish
from planner.speeds import SpeedDetector

log = logging.getLogger("recycle.api")


class SpeedEvents:
    """Mixed into api.service.Service (uses its store, config, metrics and planning)."""

    async def apply_speed(self, job: JobRuntime, ev: SpeedIn, source: str) -> tuple[dict, bool]:
        """An operator's (or a worker's) speed for one worker, or null to clear it; returns
        (answer, replayed). Idempotent by event_id like failures and recoveries."""
        body_json = ev.model_dump_json()
        async with job.lock:
            old = self._replayed(job, ev, body_json)
            if old is not None:
                return old, True
            w = (ev.replica, ev.stage)
            operator = dict(job.operator)
            if ev.speed is None:
                operator.pop(w, None)
            else:
                operator[w] = quantize_speed(ev.speed)
            event = {"event_id": ev.event_id, "replica": w[0], "stage": w[1],
                     "body_json": body_json}
            answers, fresh, plan_source, spec = await self._publish_speeds(
                job, operator, job.measured, [event], source)
        self._after_speeds(job, source, 1, fresh, plan_source, spec)
        return answers[0], False

    async def _publish_speeds(self, job: JobRuntime, operator: dict, measured: dict,
                              events: list[dict], source: str):
        """Under job.lock: record speed `events` and publish one plan version for the
        speeds they leave in force (none if those are the speeds in force already)."""
        t0 = time.perf_counter()
        try:
            spec = stragglers.spec_for(job.spec, operator, measured)
        except SpeedError as e:
            raise ApiError(422, f"speed: {e}") from None
        fresh, plan, plan_source, record = None, None, None, None
        members, decision = job.members.measured(spec.speed, f"speed:{source}")
        if isinstance(decision, Publish):  # for the empty slots, the roles unchanged
            fresh, plan_source = await asyncio.to_thread(self._plan_now, spec,
                                                         list(decision.failed))
            plan = stamp(fresh, decision)
            record = _plan_record(plan, decision.cause)
        version = plan.version if plan else job.version
        rows = []
        for ev in events:
            answer = _speed_answer(job, ev, source, version, plan_source, spec)
            rows.append(({**ev, "kind": "speed", "source": source}, answer))
        await asyncio.to_thread(self.store.apply_events, job.id, rows, job.state, job.reason,
                                job.failed, record)
        job.operator, job.measured, job.members = operator, measured, members
        if plan is not None:
            self._install(job, plan, record["json"], f"speed:{source}")
            self.metrics.event_to_plan_seconds.observe(time.perf_counter() - t0)
            log.info("job %s: speeds changed (%s): published v%d", job.id, source, plan.version)
        return [a for _, a in rows], fresh, plan_source, spec

    def _after_speeds(self, job: JobRuntime, source: str, n: int, fresh, plan_source, spec):
        self.metrics.events.labels("speed", source, "accepted").inc(n)
        if plan_source == "greedy":
            self._background(asyncio.to_thread(self.cache.put, fresh))
            if self.precomputer:
                self.precomputer.improve(job, job.empty, spec)
        elif plan_source == "cache":
            self.verify_later(job, job.empty, spec, fresh.metrics.period)

    async def observe_compute(self, job: JobRuntime, w, incarnation: int, iteration: int,
                              seconds_per_mb: float) -> None:
        """A heartbeat's compute time per micro-batch: fed to the job's detector once per
        (worker process, iteration), as the time of the slot the worker fills (speeds are
        per slot); a changed speed grid is applied like a speed event (source
        `detector`), so the plan follows."""
        det = job.detector
        if det is None or job.state != "running" or w in job.members.failed:
            return
        if job.plan.partition is not None:  # slots of another shape: not the detector's grid
            return
        slot = job.slot_of(w)
        if slot is None:
            return
        last = job.fed.get(w)
        if last is not None and last[0] == incarnation and iteration <= last[1]:
            return
        job.fed[w] = (incarnation, iteration)
        if seconds_per_mb <= 0:
            return
        det.observe(slot[0], slot[1], seconds_per_mb)
        if det.update() is not None:
            await self.apply_measured(job)

    async def apply_measured(self, job: JobRuntime) -> None:
        """Publish the detector's levels if they differ from those in force."""
        det = job.detector
        async with job.lock:
            if det is None or job.state != "running":
                return
            empty = set(job.empty)
            levels = {(d, s): v for d, row in enumerate(det.grid) for s, v in enumerate(row)
                      if v != 1.0 and (d, s) not in empty}
            changed = sorted(k for k in set(levels) | set(job.measured)
                             if levels.get(k, 1.0) != job.measured.get(k, 1.0))
            if not changed:
                return
            est = det.estimates()
            events = []
            for d, s in changed:
                eid = f"detector-{d}-{s}-{uuid.uuid4().hex[:8]}"
                body = {"event_id": eid, "replica": d, "stage": s,
                        "speed": levels.get((d, s), 1.0),
                        "reason": stragglers.measured_reason(est.get((d, s)),
                                                             self.config.speed_window)}
                events.append({"event_id": eid, "replica": d, "stage": s,
                               "body_json": json.dumps(body)})
            try:
                _, fresh, plan_source, spec = await self._publish_speeds(
                    job, job.operator, levels, events, "detector")
            except ApiError as e:  # speeds the spec cannot take: keep those in force
                log.warning("job %s: measured speeds not applied: %s", job.id, e.detail)
                return
        self._after_speeds(job, "detector", len(events), fresh, plan_source, spec)

    def _detector(self, spec: JobSpec, measured: dict) -> Optional[SpeedDetector]:
        cfg = self.config
        if cfg.speed_window <= 0:
            return None
        det = SpeedDetector(spec.replicas, spec.stages, window=cfg.speed_window,
                            enter=cfg.speed_enter, leave=cfg.speed_leave)
        for (d, s), v in measured.items():  # after a restart: the levels in force
            det.grid[d][s] = v
        return det
