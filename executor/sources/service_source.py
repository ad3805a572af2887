"""`recycle train --service URL --job-id ID --token T`: the service drives the cluster.

Each worker talks to `recycle serve` itself over HTTP (docs/design.md section 3): it long-polls the
job's plan, heartbeats, reports suspects, and a restarted worker posts its own recovery
event. The service's heartbeat monitor and suspect handling declare failures and publish
every plan; the coordinator publishes none, it only follows the service (ServiceWatch).
What stays on the coordinator's store is the run's own bookkeeping: the config, the
worker -> coordinator mailbox (losses, checksums), the committed counter, the gloo
rendezvous, and two end markers: `finished` (training done: workers get an empty plan and
exit) and `halted`.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Optional

import httpx
import torch.distributed as dist

from executor import protocol as P
from executor.sources.http_source import HttpPlanSource
from executor.sources.plan_source import TrainingHalted
from executor.runtime.transport.rendezvous import StorePlanSource, Worker
from executor.runtime.transport.waiting import first, retried
from executor.timeouts import Timeouts
from planner.plan import Plan

UNREACHABLE = (httpx.TransportError,)  # the service down or restarting: retried

log = logging.getLogger("recycle.executor")


class ServiceWorkerSource(StorePlanSource):
    """A worker's PlanSource: plans, heartbeats, suspects and rejoins over HTTP; messages to
    the coordinator through the store (inherited)."""

    def __init__(self, store: dist.Store, me: Worker, incarnation: int, service: dict,
                 run_id: str, slice_s: float = 0.5,
                 patience_s: float = Timeouts().service_outage):
        super().__init__(store, me, incarnation)
        # Started by a node agent (executor/node/): talk to it instead; it speaks the same
        # API and learns this process's pid to watch from the header.
        agent = os.environ.get("RECYCLE_AGENT")
        self.http = HttpPlanSource(agent or service["url"], service["job_id"], service["token"],
                                   reporter=me, request_timeout_s=5.0,
                                   headers={"X-Recycle-Pid": str(os.getpid())} if agent else None)
        self.run_id, self.slice_s = run_id, slice_s
        self.patience_s = patience_s
        self._last: Optional[Plan] = None
        self._lost = False

    def _end_marker(self, after_version: int) -> Optional[Plan]:
        with self._lock:
            if self.store.check([P.HALTED]):
                raise TrainingHalted(self.store.get(P.HALTED).decode())
            if not self.store.check([P.FINISHED]):
                return None
        plan = self._last or self.http.wait_for_plan(-1, 30.0)
        return plan.model_copy(update={"version": max(after_version, plan.version) + 1,
                                       "workers": []})

    def gate(self, after_version: int, iteration: int) -> tuple[Optional[Plan], bool, int]:
        """Plans come from the service, not the store: ask it each time."""
        return self.wait_for_plan(after_version, 0), self.held(iteration), self.committed()

    def wait_for_plan(self, after_version: int, timeout_s: float) -> Optional[Plan]:
        """Long-polls in short slices so the coordinator's end marker is seen quickly."""
        deadline = time.monotonic() + timeout_s
        return first(lambda: self._end_marker(after_version) or self._slice(
            after_version, max(0.0, min(deadline - time.monotonic(), self.slice_s))),
            "a newer plan", limit_s=timeout_s, poll_s=0.0, max_poll_s=0.0)

    def _slice(self, after_version: int, wait_s: float) -> Optional[Plan]:
        """One long-poll of at most `wait_s`: a newer plan, or None."""
        try:
            plan = self.http.wait_for_plan(after_version, wait_s)
        except LookupError as e:  # the service lost the job: train on under the plan in
            if not self._lost:    # force; the coordinator halts if anything fails now
                log.warning("%s; going on under the plan in force", e)
            self._lost = True
            time.sleep(wait_s)
            return None
        if plan is not None:
            self._last = plan
        return plan

    def heartbeat(self, replica: int, stage: int, iteration: int, incarnation: int = 1,
                  compute=None, entered=None) -> None:
        try:  # best effort: a heartbeat the service refuses must not end the worker
            self.http.heartbeat(replica, stage, iteration, incarnation, compute, entered)
        except (LookupError, PermissionError, RuntimeError) as e:
            log.info("heartbeat not taken: %s", e)
        with self._lock:  # raises once the coordinator is gone: the worker exits
            self.store.check([P.CONFIG])

    def report_suspect(self, replica: int, stage: int, reason: str) -> None:
        try:
            self.http.report_suspect(replica, stage, reason)
        except (RuntimeError, LookupError, PermissionError) as e:  # the plan will tell
            log.warning("suspect report refused: %s", e)

    def rejoin(self, version: int) -> None:
        """Post the recovery event with our incarnation (stable id: a retry is idempotent);
        retried while the service is unreachable. For a worker the service still has live
        (our predecessor's death is not declared yet), a newer incarnation is the proof of
        that death: the service replaces it in one new version, no heartbeat timeout."""
        event_id = f"rejoin-{self.run_id}-{self.me[0]}.{self.me[1]}-{self.inc}-v{version}"
        try:
            retried(lambda: self.http.report_event(
                event_id, "recovery", *self.me, incarnation=self.inc,
                reason=f"worker restarted (incarnation {self.inc})"),
                "the recovery event", patience_s=self.patience_s, retry_on=UNREACHABLE,
                first_s=0.2)
        except RuntimeError as e:  # 409: recovered already (e.g. by an operator)
            log.warning("recovery event not applied: %s", e)


class ServiceWatch:
    """Coordinator side: follows the job's newest plan at the service in a thread."""

    def __init__(self, url: str, job_id: str, token: str, timeout_s: float = 30.0,
                 patience_s: float = Timeouts().service_outage):
        self.url, self.job_id, self.token = url, job_id, token
        self.patience_s = patience_s
        self.http = HttpPlanSource(url, job_id, token)
        try:
            first = self.http.wait_for_plan(-1, timeout_s)
        except (LookupError, PermissionError, TrainingHalted) as e:
            raise ValueError(f"plan service job {job_id}: {e}") from None
        if first is None:
            raise ConnectionError(f"no plan from {url} for job {job_id}")
        self.plan: Plan = first
        # `auto`: the service may cut the pipeline into fewer stages (a job registered
        # before shapes has none: fixed)
        self.shape: str = self.http.job().get("shape") or "fixed"
        self.halted: Optional[str] = None
        self.lost: Optional[str] = None  # the service no longer knows the job
        # the plan version a failure event's answer found the job paused under (too few
        # live workers); the pause lasts until a newer version is published
        self._paused_under: Optional[int] = None
        self._stop = threading.Event()
        self._reports: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def worker_config(self) -> dict:
        """What workers read from the coordinator's store: no token (the store has no
        authentication); local workers get it from the launcher, torchrun'd ones from
        RECYCLE_TOKEN."""
        return {"url": self.url, "job_id": self.job_id}

    # ---- training progress (POST /v1/jobs/{id}/progress, shown on the live page) -------------
    PROGRESS_EVERY_S = 1.0

    def report_progress(self, iteration: int, loss: float, tokens_per_iteration: int,
                        iterations: int, now: Optional[float] = None,
                        snapshots: Optional[dict] = None) -> None:
        """Called for every completed iteration; sends at most one report per
        PROGRESS_EVERY_S (always the last iteration), from a thread of its own so the
        coordinator never waits on the network. tokens/s: over the iterations since the
        report before (none for the first report)."""
        now = time.monotonic() if now is None else now
        prev = getattr(self, "_sent", None)  # (iteration, time) of the last report queued
        if prev is not None and (iteration <= prev[0] or (
                now - prev[1] < self.PROGRESS_EVERY_S and iteration < iterations - 1)):
            return
        tok = (None if prev is None else
               tokens_per_iteration * (iteration - prev[0]) / max(now - prev[1], 1e-9))
        self._sent = (iteration, now)
        body = {"iteration": iteration, "iterations": iterations, "loss": float(loss),
                "tokens_per_s": tok, **(snapshots or {})}
        self._last_body = body
        if not math.isfinite(body["loss"]):  # a diverged run: the iteration still counts
            body["loss"] = None
        if getattr(self, "_reporter", None) is None:
            self._report_slot: list = []
            self._report_wake = threading.Event()
            self._reporter = threading.Thread(target=self._report_loop, daemon=True,
                                              name="recycle-progress")
            self._reporter.start()
        self._report_slot[:] = [body]  # only the newest report matters
        self._report_wake.set()

    def amend_progress(self, fields: dict) -> None:
        """The last report again with `fields` (at the run's end: what every worker's last
        message said, some of which came after the last iteration's losses)."""
        body = getattr(self, "_last_body", None)
        if body is not None and fields:
            self._report_slot[:] = [{**body, **fields}]
            self._report_wake.set()

    def _report_loop(self) -> None:
        while not (self._stop.is_set() and not self._report_slot):  # the last one goes out
            if not self._report_wake.wait(0.5) and not self._report_slot:
                continue
            self._report_wake.clear()
            while self._report_slot:
                body = self._report_slot.pop()
                try:  # best effort: the page shows the next one
                    self.http.report_progress(body)
                except Exception as e:  # noqa: BLE001 - never ends the run
                    log.info("progress report not taken: %s", e)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                plan = self.http.wait_for_plan(self.plan.version, 1.0)
            except TrainingHalted as e:
                self.halted = str(e)
                return
            except LookupError as e:
                self.lost = str(e)
                self._stop.wait(1.0)
                continue
            except Exception as e:  # noqa: BLE001 - keep following; the run has a deadline
                log.warning("following the plan service: %s", e)
                self._stop.wait(0.5)
                continue
            if plan is not None:
                self.plan = plan

    @property
    def paused(self) -> bool:
        """The service holds the job paused (a failure's answer said so, and no version
        came since): nobody trains until workers are back."""
        under = self._paused_under
        return under is not None and self.plan.version <= under

    def finish(self, console=None) -> Optional[str]:
        """Tell the service training completed, retried while it is unreachable: a service
        that comes back without hearing it would take the workers' exit for failures and
        halt a finished job. The workers keep heartbeating until then. Returns a warning
        when the service could not be told (training itself is complete either way)."""
        told: list = []

        def waiting(e: BaseException) -> None:
            if not told and console is not None:
                console.print(f"[yellow]plan service unreachable; waiting up to "
                              f"{self.patience_s:g} s to report the end of training[/]")
            told.append(e)
        try:
            retried(self.http.finish, "the end of training", patience_s=self.patience_s,
                    retry_on=UNREACHABLE, first_s=0.5, on_retry=waiting)
            return None
        except UNREACHABLE as e:
            why = f"could not tell the plan service that training finished: {e}"
        except (LookupError, PermissionError, TrainingHalted, RuntimeError) as e:
            why = f"the plan service did not record the end of training: {e}"
        log.warning("%s", why)
        if console is not None:
            console.print(f"[yellow]warning:[/] {why}")
        return why

    def report_failure(self, worker, incarnation: int, run_id: str,
                       why: str) -> threading.Thread:
        """Post a dead process's failure event (its incarnation: idempotent, and a stale
        one is refused) on a thread, retried while the service is unreachable: the
        coordinator's loop must not wait on it. A 409 (declared failed already, by a
        heartbeat or a node agent) is the same outcome."""
        r, s = worker
        event_id = f"death-{run_id}-{r}.{s}-{incarnation}"

        def post() -> None:
            try:
                answer = retried(lambda: self.http.report_event(
                    event_id, "failure", r, s, reason=why, incarnation=incarnation),
                    f"the failure of {r}:{s}", patience_s=self.patience_s,
                    retry_on=UNREACHABLE, first_s=0.2, stop=self._stop.is_set)
            except UNREACHABLE:
                log.warning("could not report the failure of worker %s:%s to the service",
                            r, s)
                return
            except (RuntimeError, LookupError, PermissionError, TrainingHalted) as e:
                log.info("failure of %s:%s not applied: %s", r, s, e)
                return
            if answer.get("state") == "paused":
                self._paused_under = answer.get("plan_version", self.plan.version)

        t = threading.Thread(target=post, name=f"report-{r}.{s}", daemon=True)
        t.start()
        self._reports.append(t)
        return t

    def close(self) -> None:
        self._stop.set()
        self._thread.join(3)
        for t in self._reports:
            t.join(3)
        self.http.close()
