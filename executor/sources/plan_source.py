"""Where a worker gets its plans: one interface, used whole, two implementations.

In-process (`recycle train` without a service) the launcher plans with the planner and
publishes through the rendezvous store (rendezvous.StorePlanSource); with a service
(`recycle train --service`) each worker long-polls `recycle serve` itself
(service_source.ServiceWorkerSource, which keeps the store for holds, faults and the
coordinator's messages). The agent sees only this interface, so it runs the same either way.
"""
from __future__ import annotations

from typing import Optional, Protocol

from planner.plan import Plan


class TrainingHalted(RuntimeError):
    """No plan can exist (every replica of some stage is gone): restore from checkpoint."""


class PlanSource(Protocol):
    version: int  # the plan version the worker acts on, stamped on what it sends

    def wait_for_plan(self, after_version: int, timeout_s: float) -> Optional[Plan]:
        """The newest plan with version > after_version, waiting up to timeout_s for one;
        None if none came. Raises TrainingHalted when training cannot go on."""

    def gate(self, after_version: int, iteration: int) -> tuple[Optional[Plan], bool, int]:
        """Before `iteration`, in one round trip: a newer plan or None, whether iteration
        is held (a rejoin is due, or the run halted), and the committed iteration."""

    def held(self, iteration: int) -> bool:
        """Is `iteration` still held?"""

    def heartbeat(self, replica: int, stage: int, iteration: int, incarnation: int = 1,
                  compute: Optional[tuple[int, float]] = None,
                  entered: Optional[int] = None) -> None:
        """This worker is alive, how far it got, (iteration, seconds per micro-batch), and
        the newest plan version it entered with its state in place."""

    def report_suspect(self, replica: int, stage: int, reason: str) -> None:
        """A peer stopped answering; the source decides whether it failed."""

    def rejoin(self, version: int) -> None:
        """A restarted worker, seen as failed in plan `version`, asks to be planned in again."""

    def await_go(self, iteration: int, timeout_s: float) -> None:
        """At an injection point: wait for the coordinator's go-ahead (its fault landed)."""

    def send(self, msg) -> None:
        """A message to the coordinator (executor/protocol.py: Done, Mid, Fatal, ...)."""
