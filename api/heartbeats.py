"""Failure detection by heartbeat, sped up by suspect reports.

A worker is watched from its first heartbeat on (it is "armed"; the arming is persisted,
so after a restart every armed live worker gets a fresh full timeout). A worker silent for
`heartbeat_timeout_s` is declared failed: the monitor posts a failure event itself, like
an operator would. A suspect report cuts the suspected worker's deadline to its last
heartbeat plus `suspect_grace_s` and wakes the monitor at once, so a worker already
silent that long is declared failed immediately; a heartbeat clears the suspicion.
The monitor sleeps until the next deadline or a wake-up: no polling loop.

A cut link (two live workers that cannot reach each other, both still heartbeating) kills
no heartbeat, so no deadline ever expires: every plan of the same members failed its
rendezvous and the job went round for ever. Suspect reports that say LINK_DOWN are kept
per job (planner/control/cut_links.py, as the local coordinator keeps them); once both
ends of a link said so, one end is declared failed (the plan version fences it).

Incarnations: a heartbeat names the sender's process incarnation (optional). Only the one
the plan admits keeps the worker alive: an older one is superseded (409), a newer one must
first post its recovery event (409: its heartbeats must not mask its predecessor's death).
The monitor remembers which incarnation it watched, and its failure event names it, so
a deadline that expires just as a newer incarnation replaced the worker fails nobody.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Optional

from api.models import EventIn
from api.jobs.runtime import ApiError, JobRuntime
from api.service import Service
from planner.control.cut_links import LINK_DOWN, LinkReports
from planner.control.timing import dead_at

log = logging.getLogger("recycle.api")


class Monitor:
    def __init__(self, service: Service):
        self.service = service
        self.patience = service.config.patience  # planner/control/timing.py
        self.last: dict[str, dict[tuple[int, int], float]] = {}
        self.deadline: dict[str, dict[tuple[int, int], float]] = {}
        self.watched: dict[str, dict[tuple[int, int], int]] = {}  # incarnation watched
        self._wake = asyncio.Event()
        self._to_arm: list[tuple[str, int, int]] = []
        self._arming: Optional[asyncio.Future] = None
        self._task: Optional[asyncio.Task] = None
        self.links: dict[str, LinkReports] = {}  # per job: cut links reported

    def start(self) -> None:
        now = time.monotonic()
        for job in self.service.jobs.values():
            if job.state not in ("running", "paused"):  # a paused job's deaths still count
                continue
            for w in self.service.store.armed(job.id):
                if w not in job.failed:
                    self.last.setdefault(job.id, {})[w] = now
                    self.deadline.setdefault(job.id, {})[w] = dead_at(now, self.patience,
                                                                      suspected=False)
                    self.watched.setdefault(job.id, {})[w] = job.incarnation(*w)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ---- inputs ------------------------------------------------------------------------
    def beat(self, job: JobRuntime, replica: int, stage: int,
             incarnation: Optional[int] = None) -> Optional[asyncio.Future]:
        """Record a heartbeat; returns an awaitable while its first arming is being saved."""
        w = (replica, stage)
        if job.state == "halted":
            raise job.halted_error()
        if job.state == "finished":  # workers are exiting: nothing to watch
            return
        if w in job.failed:
            raise ApiError(409, f"worker {replica}:{stage} is marked failed and is not in the "
                                "plan; post a recovery event to rejoin")
        have = job.incarnation(replica, stage)
        if incarnation is not None and incarnation < have:
            raise ApiError(409, f"worker {replica}:{stage} incarnation {incarnation} is "
                                f"superseded by incarnation {have}; it must stop")
        if incarnation is not None and incarnation > have:
            raise ApiError(409, f"worker {replica}:{stage} incarnation {incarnation} is not in "
                                f"the plan (it admits {have}); post a recovery event first")
        now = time.monotonic()
        last = self.last.setdefault(job.id, {})
        arming = None
        if w not in last:
            arming = self._arm((job.id, replica, stage))
            self._wake.set()  # the monitor may be asleep with nothing to watch
        last[w] = now
        self.deadline.setdefault(job.id, {})[w] = dead_at(now, self.patience, suspected=False)
        self.watched.setdefault(job.id, {})[w] = have
        self.service.metrics.heartbeats.inc()
        return arming

    def _arm(self, row: tuple[str, int, int]) -> asyncio.Future:
        """Persist an arming off the event loop; the arms of a fleet that starts together
        share a transaction (one fsync, not hundreds on the loop). The heartbeat answers
        once its arming is on disk."""
        self._to_arm.append(row)
        if self._arming is None:
            self._arming = asyncio.ensure_future(self._flush_arms())
        return asyncio.shield(self._arming)

    async def _flush_arms(self) -> None:
        await asyncio.sleep(0)  # collect the arms of this loop iteration
        rows, self._to_arm, self._arming = self._to_arm, [], None
        await asyncio.to_thread(self.service.store.arm_many, rows)

    def suspect(self, job: JobRuntime, replica: int, stage: int) -> Optional[float]:
        """Shorten the suspected worker's deadline; seconds left (None: already failed)."""
        w = (replica, stage)
        if job.state == "halted":
            raise job.halted_error()
        if w in job.failed or job.state == "finished":
            return None
        self.service.metrics.suspects.inc()
        now = time.monotonic()
        last = self.last.get(job.id, {}).get(w, now)
        dl = self.deadline.setdefault(job.id, {})
        dl[w] = min(dl.get(w, dead_at(now, self.patience, suspected=False)),
                    dead_at(last, self.patience, suspected=True))
        self._wake.set()
        return max(0.0, dl[w] - now)

    def link_down(self, job: JobRuntime, reporter: tuple[int, int], reason: str) -> None:
        """A suspect report from `reporter` whose reason says LINK_DOWN: kept, and the
        verdict looked at once the gathering time is over."""
        if LINK_DOWN not in reason:
            return
        reports = self.links.setdefault(job.id, LinkReports())
        fresh = reports.first is None
        reports.suspect(reporter, reason, time.monotonic())
        if fresh and reports.pending:
            asyncio.get_running_loop().call_later(
                reports.gather_s, lambda: asyncio.ensure_future(self._cut(job.id)))

    async def _cut(self, job_id: str) -> None:
        reports, job = self.links.get(job_id), self.service.jobs.get(job_id)
        if reports is None or job is None or job.state not in ("running", "paused"):
            self.links.pop(job_id, None)
            return
        D, S = job.spec.replicas, job.spec.stages
        live = [(r, s) for r in range(D) for s in range(S) if (r, s) not in job.failed]
        verdict = reports.verdict(time.monotonic(), live)
        if verdict is not None:
            await self._fail(job, verdict[0], verdict[1], "cut", job.incarnation(*verdict[0]))
        elif reports.pending:  # the other end's report may still come (its patience)
            asyncio.get_running_loop().call_later(
                reports.gather_s, lambda: asyncio.ensure_future(self._cut(job_id)))

    def forget(self, job_id: str, w: tuple[int, int]) -> None:
        """After a failure or recovery event: unwatched until its next heartbeat."""
        self.last.get(job_id, {}).pop(w, None)
        self.deadline.get(job_id, {}).pop(w, None)
        self.watched.get(job_id, {}).pop(w, None)

    def forget_job(self, job_id: str) -> None:
        self.last.pop(job_id, None)
        self.deadline.pop(job_id, None)
        self.watched.pop(job_id, None)
        self.links.pop(job_id, None)

    # ---- the loop ----------------------------------------------------------------------
    def _expired(self, now: float) -> list[tuple[str, tuple[int, int]]]:
        out = []
        for job_id, dl in self.deadline.items():
            out.extend((job_id, w) for w, t in dl.items() if t <= now)
        return out

    def _next_deadline(self) -> Optional[float]:
        return min((t for dl in self.deadline.values() for t in dl.values()), default=None)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            nxt = self._next_deadline()
            wait = None if nxt is None else max(0.0, nxt - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
            for job_id, w in self._expired(time.monotonic()):
                await self._declare(job_id, w)

    async def _declare(self, job_id: str, w: tuple[int, int]) -> None:
        job = self.service.jobs.get(job_id)
        silent = time.monotonic() - self.last.get(job_id, {}).get(w, time.monotonic())
        watched = self.watched.get(job_id, {}).get(w)
        self.forget(job_id, w)
        if job is None or job.state not in ("running", "paused") or w in job.failed:
            return
        answer = await self._fail(job, w, f"no heartbeat for {silent:.2f} s", "heartbeat",
                                  watched)
        if answer is not None:
            self.service.metrics.heartbeats_missed.inc()
            log.warning("job %s: worker %s:%s missed heartbeats (%.2f s): plan v%s, state %s",
                        job_id, w[0], w[1], silent, answer["plan_version"], answer["state"])

    async def _fail(self, job: JobRuntime, w: tuple[int, int], reason: str, source: str,
                    incarnation: Optional[int]) -> Optional[dict]:
        """Post the failure event of `w` as an operator would; its answer, or None."""
        if w in job.failed:
            return None
        ev = EventIn(event_id=f"{source}-{w[0]}-{w[1]}-{uuid.uuid4().hex[:8]}",
                     kind="failure", replica=w[0], stage=w[1], incarnation=incarnation,
                     reason=reason[:500])
        try:
            answer, _ = await self.service.apply_event(job, ev, source)
        except ApiError as e:  # raced with an operator's event: nothing to do
            log.info("job %s: %s failure of %s:%s not applied: %s", job.id, source, *w, e.detail)
            return None
        except Exception:  # noqa: BLE001 - the monitor must keep running
            log.exception("job %s: could not declare %s:%s failed", job.id, *w)
            return None
        return answer
