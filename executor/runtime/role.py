"""What a worker process does with a plan it receives: enter it, wait to be admitted, or
stop (docs/executor.md, "Who is in which plan version"). Pure: the agent carries it out."""
from __future__ import annotations

from enum import Enum

from planner.plan import Plan, home_id


class Role(Enum):
    ENTER = "enter"  # the plan admits this very process: train under it
    WAIT = "wait"    # it predates us (lists our predecessor, or has us failed): ask in
    STOP = "stop"    # training is done, or we are fenced out (replaced, declared failed)


def next_role(plan: Plan, me: tuple[int, int], incarnation: int,
              entered: bool) -> tuple[Role, str]:
    """What process `incarnation` of worker `me` (its home slot: the worker's identity,
    whichever slot the plan's roles give it) does with `plan`, and why. Pure."""
    if not plan.workers:
        return Role.STOP, "training complete"
    named = plan.incarnation(*me)
    listed = plan.slot_of(home_id(*me)) is not None
    if listed and named == incarnation:
        return Role.ENTER, "admitted"
    if listed and named > incarnation:
        return Role.STOP, f"incarnation {named} replaced us"
    if entered and not listed:
        return Role.STOP, f"declared failed (failed {plan.failed})"
    return Role.WAIT, f"names incarnation {named if listed else '-'}"
