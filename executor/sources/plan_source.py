"""Where a worker gets its plans: one small interface, two implementations.

In-process (`recycle train` without a service) the launcher plans with the planner and
publishes through the rendezvous store (rendezvous.StorePlanSource); with a service
(`recycle train --service`) each worker long-polls `recycle serve` itself
(service_source.ServiceWorkerSource). Workers see only this interface, so they run the same either way.
"""
from __future__ import annotations

from typing import Optional, Protocol

from planner.plan import Plan


class TrainingHalted(RuntimeError):
    """No plan can exist (every replica of some stage is gone): restore from checkpoint."""


class PlanSource(Protocol):
    def wait_for_plan(self, after_version: int, timeout_s: float) -> Optional[Plan]:
        """The newest plan with version > after_version, waiting up to timeout_s for one;
        None if none came. Raises TrainingHalted when training cannot go on."""

    def heartbeat(self, replica: int, stage: int, iteration: int) -> None:
        """Tell the source this worker is alive (and how far it got)."""

    def report_suspect(self, replica: int, stage: int, reason: str) -> None:
        """A peer stopped answering; the source decides whether it failed."""

    def rejoin(self, version: int) -> None:
        """A restarted worker, seen as failed in plan `version`, asks to be planned in again."""
