"""planner/control/decision_plan.py: one rule for turning a membership decision into its
plan, used by the local coordinator and the service alike."""
from planner.control.decision_plan import plan_for, reusable, stamp
from planner.control.membership import Membership, Publish
from planner.job import JobSpec
from planner.plan import Role
from planner.solvers.backends import solve


def test_a_replacement_reuses_the_plan_in_force_and_a_failure_plans_anew():
    job = JobSpec.uniform(2, 2, 2)
    m, first = Membership.start(2, 2).first()
    in_force = stamp(solve(job, []), first)
    solved = []

    def solver(failed):
        solved.append(failed)
        return solve(job, failed)
    m2, repl = m.recover((1, 0), 2)  # a newer process of a live worker: same failed set
    assert isinstance(repl, Publish) and repl.same_plan
    assert reusable(repl, in_force, job.spec_hash())
    plan = plan_for(repl, in_force, job.spec_hash(), solver)
    assert solved == [] and plan.version == 1 and plan.incarnation(1, 0) == 2
    slow = JobSpec.uniform(2, 2, 2).model_copy(update={"speed": [[1.0, 1.0], [0.5, 1.0]]})
    assert not reusable(repl, in_force, slow.spec_hash())  # other speeds: planned anew
    _, fail = m2.fail((0, 1))
    plan = plan_for(fail, in_force, job.spec_hash(), solver)
    assert solved == [[(0, 1)]] and plan.failed == [(0, 1)] and plan.version == 2


def test_stamp_drops_a_reused_plans_roles_when_the_decision_has_none():
    job = JobSpec.uniform(2, 2, 2)
    _, first = Membership.start(2, 2).first()
    roles = [Role(worker=f"{d}.{s}", replica=d, stage=s) for d in range(2) for s in range(2)]
    with_roles = solve(job, []).with_roles(roles, [])
    assert stamp(with_roles, first).roles is None and stamp(with_roles, first).moves is None
