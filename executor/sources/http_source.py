"""PlanSource over HTTP: long-polls `recycle serve` for plans (see docs/api.md).

Uses only httpx and planner types (never api/). Network errors while the service restarts
are retried until the caller's timeout; a halted job raises TrainingHalted; a bad token or
unknown job raises PermissionError / LookupError at once (retrying cannot fix those).
Thread-safe: heartbeats may go from a background thread while another thread long-polls.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import httpx

from executor.runtime.transport.waiting import first
from executor.sources.plan_source import TrainingHalted
from planner.control import routes as R
from planner.control.routes import Route
from planner.plan import Plan

log = logging.getLogger("recycle.executor")
POLL_S = 30.0  # longest single long-poll request; the server may cap it lower


class HttpPlanSource:
    def __init__(self, base_url: str, job_id: str, token: str, *,
                 reporter: Optional[tuple[int, int]] = None, request_timeout_s: float = 10.0,
                 transport: Optional[httpx.BaseTransport] = None,
                 headers: Optional[dict] = None):
        self.job_id = job_id
        self.reporter = reporter  # this worker's (replica, stage), sent with suspect reports
        self.halted_reason: Optional[str] = None
        self._timeout = request_timeout_s
        self._client = httpx.Client(base_url=base_url.rstrip("/"), transport=transport,
                                    headers={"Authorization": f"Bearer {token}",
                                             **(headers or {})},
                                    timeout=request_timeout_s)
        self._down = False  # warn once per outage, not on every retry
        self._pause = 0.05  # the back-off while the service is unreachable

    def _unreachable(self, what: str, e: Exception) -> None:
        if not self._down:
            log.warning("%s: plan service unreachable (%s); retrying", what, e)
        self._down = True

    def _call(self, route: Route, **kw) -> httpx.Response:
        """One request of a declared route (planner/control/routes.py) of this job."""
        return self._client.request(route.method, route.url(job_id=self.job_id), **kw)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "HttpPlanSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _raise_for(self, r: httpx.Response) -> None:
        if r.status_code < 400:
            return
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        if r.status_code == 410:
            self.halted_reason = detail
            raise TrainingHalted(detail)
        if r.status_code in (401, 403):
            raise PermissionError(f"plan service refused the token: {detail}")
        if r.status_code == 404:
            raise LookupError(f"plan service: {detail}")
        raise RuntimeError(f"plan service answered {r.status_code}: {detail}")

    # ---- PlanSource ----------------------------------------------------------------------
    def wait_for_plan(self, after_version: int, timeout_s: float) -> Optional[Plan]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        return first(lambda: self._poll_plan(after_version, deadline), "a newer plan",
                     limit_s=max(0.0, timeout_s), poll_s=0.0, max_poll_s=0.0)

    def _poll_plan(self, after_version: int, deadline: float) -> Optional[Plan]:
        """One long-poll until `deadline` (at most POLL_S): a newer plan, or None."""
        wait = max(0.0, min(deadline - time.monotonic(), POLL_S))
        try:
            r = self._call(R.JOB_PLAN, params={"after": after_version, "wait": round(wait, 3)},
                           timeout=httpx.Timeout(self._timeout, read=wait + self._timeout))
        except httpx.TransportError as e:  # service down or restarting: retried, backing off
            left = deadline - time.monotonic()
            if self._pause >= left:
                self._unreachable("plan", e)
            time.sleep(max(0.0, min(self._pause, left)))
            self._pause = min(2 * self._pause, 1.0)
            return None
        self._pause, self._down = 0.05, False
        if r.status_code == 200:
            plan = Plan.from_json(r.content)
            return plan if plan.version > after_version else None
        if r.status_code != 204:
            self._raise_for(r)
        return None

    def heartbeat(self, replica: int, stage: int, iteration: int,
                  incarnation: Optional[int] = None, compute=None,
                  entered: Optional[int] = None) -> None:
        """Best effort: a missed heartbeat is what the timeout is for. A halted job is
        remembered (the next wait_for_plan raises TrainingHalted); a worker marked failed
        learns it from the plan (it is not in it)."""
        try:
            body = {"replica": replica, "stage": stage, "iteration": iteration}
            if incarnation is not None:
                body["incarnation"] = incarnation
            if compute is not None:  # (iteration, seconds per micro-batch): the detector's input
                body["compute_iteration"], body["compute_s_per_mb"] = compute[0], round(compute[1], 7)
            if entered is not None:  # the service counts a version's moves done by it
                body["entered_version"] = entered
            r = self._call(R.WORKER_BEAT, json=body)
        except httpx.TransportError as e:
            self._unreachable("heartbeat", e)
            return
        if r.status_code == 409:  # failed, or an incarnation the plan does not name yet
            log.info("heartbeat refused: %s", r.json().get("detail"))
            return
        try:
            self._raise_for(r)
        except TrainingHalted:
            return

    def report_suspect(self, replica: int, stage: int, reason: str) -> None:
        body = {"replica": replica, "stage": stage, "reason": (reason or "")[:500]}
        if self.reporter is not None:
            body["reporter"] = {"replica": self.reporter[0], "stage": self.reporter[1]}
        try:
            r = self._call(R.SUSPECTS, json=body)
        except httpx.TransportError as e:
            self._unreachable("suspect report", e)
            return
        if r.status_code != 410:
            self._raise_for(r)

    # ---- extras --------------------------------------------------------------------------
    def job(self) -> dict:
        """The job as the service holds it (GET /v1/jobs/{id}: state, spec, shape, ...)."""
        r = self._call(R.JOB)
        self._raise_for(r)
        return r.json()

    def finish(self) -> None:
        """Training completed: the service stops watching the job's workers."""
        self._raise_for(self._call(R.FINISH))

    def report_progress(self, body: dict) -> None:
        """The coordinator's training progress (iteration, iterations, loss, tokens_per_s)."""
        self._raise_for(self._call(R.PROGRESS, json=body))

    def report_event(self, event_id: str, kind: str, replica: int, stage: int,
                     reason: Optional[str] = None, incarnation: Optional[int] = None) -> dict:
        """Post a failure/recovery event (e.g. a rejoining worker's recovery)."""
        body = {"event_id": event_id, "kind": kind, "replica": replica, "stage": stage}
        if reason:
            body["reason"] = reason[:500]
        if incarnation is not None:
            body["incarnation"] = incarnation
        r = self._call(R.EVENTS, json=body)
        self._raise_for(r)
        return r.json()
