"""A membership decision (membership.py `Publish`) as the plan that carries it out: one rule,
used by the local coordinator (executor/launch/coordinator/publishing.py) and the plan service
(api/service.py, api/jobs/) alike."""
from __future__ import annotations

from typing import Callable, Optional

from planner.plan import Plan


def reusable(decision, in_force: Optional[Plan], spec_hash: str) -> bool:
    """May the plan in force carry `decision` (re-stamped)? Only for the same failed set
    (`same_plan`: a replacement or a resync) planned for the same speeds."""
    return (decision.same_plan and in_force is not None
            and in_force.job.spec_hash() == spec_hash)


def planned_on(decision, spec):
    """The job a decision's plan is made for: the job its shape cuts when it has one (made
    for nominal speeds: measured ones are of the user's grid), else `spec`."""
    return decision.shape_job if getattr(decision, "shape_job", None) is not None else spec


def stamp(plan: Plan, decision) -> Plan:
    """`plan` (made for decision.failed) as the decision's version: its incarnations, its
    roles and moves (none: identity, as every plan before roles; a reused plan's earlier
    roles and moves go), and its shape's partition (none: the job's own)."""
    out = plan.stamped(decision.version, decision.incarnation_rows())
    if decision.roles is not None:
        out = out.with_roles(list(decision.roles), list(decision.moves))
    elif out.roles is not None or out.moves is not None:
        out = out.model_copy(update={"roles": None, "moves": None})
    partition = getattr(decision, "partition", None)
    if out.partition != partition:
        out = out.model_copy(update={"partition": partition})
    return out


def plan_for(decision, in_force: Optional[Plan], spec_hash: str,
             solve: Callable[[list], Plan]) -> Plan:
    """The plan of `decision`: the plan in force when reusable, else solve(failed)."""
    fresh = in_force if reusable(decision, in_force, spec_hash) else solve(list(decision.failed))
    return stamp(fresh, decision)
