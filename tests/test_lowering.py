"""Plans lowered to steps (planner/lowering.py): every message a plan implies is one SEND
on one worker and one RECV on another, each compute action keeps its order, and every
stage's workers all-reduce before their step."""
from collections import Counter

from hypothesis import given, settings

from planner.lowering import COMPUTE, FWD, Op, Step, lower
from planner.plan import Plan
from planner.solvers.backends import solve
from planner.job import JobSpec
from executor.runtime.steps.interpreter import FAULT, with_fault_point
from tests.strategies import small_jobs


def test_a_middle_stage_receives_before_and_sends_after_each_compute():
    plan = solve(JobSpec.uniform(2, 3, 2), [])
    steps = lower(plan, (0, 1))
    f = next(k for k, st in enumerate(steps) if st.op is Op.F)
    recv, send = steps[f - 1], steps[f + 1]
    g = steps[f].microbatch
    assert recv == Step(Op.RECV, g, (plan.routes[g][0], 0), FWD, 0, index=steps[f].index)
    assert send.op is Op.SEND and send.peer == (plan.routes[g][2], 2) and send.boundary == 1
    assert [st.op for st in steps[-2:]] == [Op.ALLREDUCE, Op.OPT]
    assert steps[-2].peers == ((0, 1), (1, 1))
    assert steps[f - 1].label(1) == f"1RECV_F{g}" and send.label(1) == f"1SEND_F{g}"


def test_re_routed_messages_follow_the_routes_of_the_failure_plan():
    plan = solve(JobSpec.uniform(2, 2, 2), [(1, 0)])  # replica 1's stage 1 takes from 0:0
    steps = lower(plan, (1, 1))
    assert {st.peer for st in steps if st.op in (Op.RECV, Op.SEND)} == {(0, 0)}
    assert next(st for st in steps if st.op is Op.ALLREDUCE).peers == ((0, 1), (1, 1))


def _check_matched(plan: Plan) -> None:
    sends, recvs = Counter(), Counter()
    for w in plan.workers:
        steps = lower(plan, w.key)
        assert [(st.op.value, st.microbatch) for st in steps if st.op in COMPUTE] == \
            [(a.op, a.microbatch) for a in w.actions]  # the plan's order, untouched
        for st in steps:
            if st.op is Op.SEND:
                sends[(w.key, st.peer, st.direction, st.boundary, st.microbatch)] += 1
            elif st.op is Op.RECV:
                recvs[(st.peer, w.key, st.direction, st.boundary, st.microbatch)] += 1
    assert sends == recvs and all(n == 1 for n in sends.values())
    S, n = plan.job.stages, plan.job.num_microbatches
    assert len(sends) == 2 * (S - 1) * n  # one activation and one gradient per boundary


@settings(max_examples=40, deadline=None)
@given(small_jobs())
def test_every_send_has_its_receive(case):
    job, failed, mode = case
    _check_matched(solve(job, failed, mode=mode))


def test_the_fault_point_sits_before_the_middle_action():
    plan = solve(JobSpec.uniform(2, 2, 4), [])
    steps = lower(plan, (0, 1))
    marked = with_fault_point(steps)
    k = next(i for i, st in enumerate(marked) if st.op == FAULT)
    actions = len(plan.worker(0, 1).actions)
    assert marked[k + 1].index == actions // 2 and len(marked) == len(steps) + 1
    assert all(st.index < actions // 2 for st in marked[:k])


def test_a_replay_lowers_to_f_and_fused_b_per_micro_batch_then_allreduce_and_step():
    from planner.lowering import lower_replay
    steps = lower_replay(1, 3, [2, 5], ((1, 1), (0, 1)))
    assert [st.label(1) for st in steps] == [
        "1RECV_F2", "1F2", "1SEND_F2", "1RECV_B2", "1B2", "1SEND_B2",
        "1RECV_F5", "1F5", "1SEND_F5", "1RECV_B5", "1B5", "1SEND_B5", "1ALLREDUCE", "1OPT"]
    assert {st.boundary for st in steps if st.direction == FWD} == {0, 1}
    assert steps[-2].peers == ((0, 1), (1, 1)) and all(st.peer is None for st in steps)
    first, last = lower_replay(0, 2, [0], ((0, 0),)), lower_replay(1, 2, [0], ((0, 1),))
    assert [st.label(0) for st in first] == ["0F0", "0SEND_F0", "0RECV_B0", "0B0",
                                             "0ALLREDUCE", "0OPT"]
    assert [st.label(1) for st in last] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0",
                                            "1ALLREDUCE", "1OPT"]


def test_the_replayer_steps_through_the_stepper_not_a_step_of_its_own():
    """A replay once re-implemented the optimizer step (tied shares, learning rate, clip,
    step): a change to StageStepper had to be made twice or replays stopped being exact."""
    import inspect

    from executor.runtime.replay import replayer
    src = inspect.getsource(replayer)
    for own in ("opt.step(", "lr.at(", "coefficient(", "scale_(", "backward_full(",
                "compute.forward("):
        assert own not in src, own
