"""`recycle train --service URL --job-id ID --token T`: plans come from `recycle serve`.

The coordinator keeps detecting failures (process exits, suspects, heartbeats) and keeps
publishing into its store, so the workers run unchanged; but instead of solving, it
reports every change of its failed set to the service as failure/recovery events and
relays the plan the service answers with (from its cache, or greedy then CP-SAT). The
service stays the one place that decides plans, and other tools watching the job there
see the same failures and versions. Plans are fetched with HttpPlanSource.
"""
from __future__ import annotations

import uuid
from typing import Iterable

from executor.http_source import HttpPlanSource
from executor.plan_source import TrainingHalted
from planner.failures import NoPlanError, dead_stage
from planner.job import JobSpec
from planner.plan import Plan

Worker = tuple[int, int]


class ServicePlanner:
    def __init__(self, base_url: str, job_id: str, token: str, timeout_s: float = 30.0):
        self.source = HttpPlanSource(base_url, job_id, token)
        self.timeout_s = timeout_s
        self._run = uuid.uuid4().hex[:8]  # event ids: unique per run, stable on retry
        self._n = 0
        try:
            first = self.source.wait_for_plan(-1, timeout_s)
        except (LookupError, TrainingHalted) as e:
            raise ValueError(f"plan service job {job_id}: {e}") from None
        if first is None:
            raise ConnectionError(f"no plan from {base_url} for job {job_id}")
        self.job: JobSpec = first.job
        self.known: set[Worker] = {tuple(w) for w in first.failed}
        self.version = first.version

    def check_grid(self, job: JobSpec) -> None:
        mine = (job.replicas, job.stages, job.microbatches)
        theirs = (self.job.replicas, self.job.stages, self.job.microbatches)
        if mine != theirs:
            raise ValueError(f"the service's job is a {theirs[0]}x{theirs[1]}x{theirs[2]} grid, "
                             f"this run is {mine[0]}x{mine[1]}x{mine[2]}")

    def _post(self, kind: str, w: Worker) -> dict:
        self._n += 1
        answer = self.source.report_event(f"train-{self._run}-{self._n}", kind, w[0], w[1],
                                          reason="reported by recycle train")
        self.version = max(self.version, answer["plan_version"])
        return answer

    def plan(self, failed: Iterable[Worker]) -> Plan:
        """Bring the service's failed set to `failed`, then return its plan for it.
        Raises NoPlanError when the service halted the job (a stage has no replica)."""
        failed = {tuple(w) for w in failed}
        for w in sorted(self.known - failed):
            self._post("recovery", w)
        for w in sorted(failed - self.known):
            answer = self._post("failure", w)
            if answer["state"] == "halted":
                self.known = failed
                raise NoPlanError(dead_stage(self.job, failed) or 0)
        self.known = failed
        try:
            plan = self.source.wait_for_plan(self.version - 1, self.timeout_s)
        except TrainingHalted:
            raise NoPlanError(dead_stage(self.job, failed) or 0) from None
        if plan is None:
            raise ConnectionError("the plan service did not answer in time")
        if {tuple(w) for w in plan.failed} != failed:
            raise RuntimeError(f"the service's failed set {plan.failed} is not ours "
                               f"{sorted(failed)}: is another coordinator using job "
                               f"{self.source.job_id}?")
        self.version = plan.version
        return plan

    def close(self) -> None:
        self.source.close()
