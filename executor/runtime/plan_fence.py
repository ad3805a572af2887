"""The plan-version fence (docs/design.md section 6): a worker never acts on a plan older
than one it has seen, nor on another job's. Every plan the worker takes passes here."""
from __future__ import annotations

from typing import Callable, Optional

from planner.plan import Plan
from executor.runtime.transport.waiting import first
from executor.runtime.worker_state import WorkerState

_RELEASED = object()  # the coordinator released a hold without a newer plan


class PlanFence:
    def __init__(self, state: WorkerState, source, job_hash: str,
                 log: Callable[[str], None]):
        self.state, self.source, self.job_hash, self.log = state, source, job_hash, log

    def admit(self, plan: Plan) -> bool:
        """Is `plan` one to act on: this job's, and newer than any seen?"""
        st = self.state
        # a plan of another shape runs a job cut from this one (planner/shapes/)
        got = plan.partition.base if plan.partition is not None else plan.job.identity_hash()
        if got != self.job_hash:
            self.log(f"refusing plan v{plan.version}: it is for job {got}, "
                     f"this worker runs job {self.job_hash}")
            st.refused = max(st.refused, plan.version)
            return False
        if plan.version < st.version:
            self.log(f"refusing plan v{plan.version}: older than v{st.version} already seen")
            return False
        return plan.version > st.version

    def next_plan(self, timeout_s: float) -> Optional[Plan]:
        """A newer plan of this job within `timeout_s`, or None (0: only if one is out)."""
        plan = self.source.wait_for_plan(max(self.state.version, self.state.refused), timeout_s)
        return plan if plan is not None and self.admit(plan) else None

    def await_plan(self) -> Plan:
        """The next plan of this job, however long it takes: the one wait of a worker with
        no deadline (docs/executor.md, "Waiting"). It ends with a plan, a halt
        (TrainingHalted), or the process: the heartbeat thread exits it once the
        coordinator is gone."""
        return first(lambda: self.next_plan(1.0), "a plan of this job", limit_s=None,
                     poll_s=0.0, max_poll_s=0.0)

    def seen(self, plan: Plan) -> None:
        """`plan` is the one in force for us now."""
        self.state.version = self.source.version = plan.version

    def gate(self, it: int) -> tuple[Optional[Plan], int]:
        """Before iteration `it`: a newer plan, if one is out, and the committed iteration.
        While the coordinator holds `it` (a scheduled rejoin must be in the plan first, or
        the run halted), wait for the newer plan. Only the coordinator arms and releases
        holds (also on a deadline), so a worker can never wait on a gate nobody opens."""
        st = self.state
        newer, held, committed = self.source.gate(max(st.version, st.refused), it)
        if newer is not None and not self.admit(newer):
            newer = None
        if newer is None and held:  # the coordinator releases every hold, also on a deadline
            newer = first(lambda: self.next_plan(0.05) or (
                None if self.source.held(it) else _RELEASED), f"the hold on iteration {it}",
                limit_s=None, poll_s=0.0, max_poll_s=0.0)
        return (None if newer is _RELEASED else newer), committed
