"""Membership as a value (planner/control/membership.py): every case the chaos harness produces,
driven in milliseconds, and hypothesis over arbitrary sequences of observations."""
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.control.membership import Halt, Membership, Publish, Reject, Unchanged


def started(D=2, S=2):
    m, d = Membership.start(D, S).first()
    assert isinstance(d, Publish) and d.version == 0 and d.failed == () and d.cause == "start"
    return m


def test_kill_then_rejoin_publishes_failure_first_then_the_next_incarnation():
    m = started()
    m, d = m.fail((1, 0))
    assert isinstance(d, Publish) and d.version == 1 and d.failed == ((1, 0),)
    assert not d.same_plan and m.live() == [(0, 0), (0, 1), (1, 1)]
    m, d = m.recover((1, 0), 2)
    assert isinstance(d, Publish) and d.version == 2 and d.failed == ()
    assert d.incarnations == ((1, 1), (2, 1)) and m.incarnation((1, 0)) == 2


def test_recovery_without_incarnation_takes_the_next_one():
    m, _ = started().fail((0, 1))
    m, d = m.recover((0, 1))
    assert d.incarnations[0][1] == 2


def test_a_newer_process_of_a_live_worker_replaces_it_on_the_plan_in_force():
    m, d = started().recover((0, 0), 3)
    assert isinstance(d, Publish) and d.cause == "replacement" and d.same_plan
    assert d.failed == () and m.incarnation((0, 0)) == 3


def test_losing_every_worker_of_a_stage_halts_with_a_reason():
    m, _ = started().fail((0, 1))
    m, d = m.fail((1, 1))
    assert isinstance(d, Halt) and "stage 1 has no live replica" in d.reason
    assert m.state == "halted" and m.reason == d.reason and (1, 1) in m.failed
    m2, d2 = m.recover((1, 1), 2)  # nothing moves a halted run
    assert isinstance(d2, Reject) and m2 is m and "halted" in d2.reason


def test_stale_and_repeated_reports_are_rejected_without_change():
    m, _ = started().fail((1, 0))
    m, _ = m.recover((1, 0), 2)
    for again, why in [(m.fail((1, 0), 1), "superseded"), (m.recover((1, 0), 2), "not newer"),
                       (m.recover((0, 0)), "nothing to recover"), (m.fail((5, 0)), "outside")]:
        (m2, d) = again
        assert isinstance(d, Reject) and why in d.reason and m2 is m
    m3, _ = m.fail((0, 0))
    m4, d = m3.fail((0, 0))
    assert isinstance(d, Reject) and "already failed" in d.reason and m4 is m3
    _, d = m3.recover((0, 0), 0)  # older than the incarnation the plan admits
    assert isinstance(d, Reject) and "older" in d.reason


def test_a_suspect_with_nobody_dead_republishes_only_for_the_version_it_names():
    m = started()
    m, d = m.resync(0)
    assert isinstance(d, Publish) and d.same_plan and d.version == 1 and d.cause == "resync"
    m2, d = m.resync(0)  # reported under v0, but v1 is out already: nothing to do
    assert isinstance(d, Unchanged) and m2 is m


def test_measured_speeds_replan_once_and_nominal_again_replans_back():
    m = started()
    slow = ((1.0, 0.5), (1.0, 1.0))
    m, d = m.measured(slow)
    assert isinstance(d, Publish) and m.speeds == slow and not d.same_plan
    m2, d = m.measured([[1.0, 0.5], [1.0, 1.0]])  # the same grid as lists: in force already
    assert isinstance(d, Unchanged) and m2 is m
    m, d = m.measured(None)
    assert isinstance(d, Publish) and m.speeds is None and d.version == 2


def test_finish_and_improved_plans():
    m = started()
    m, d = m.improved("precomputed:cpsat")
    assert isinstance(d, Publish) and d.version == 1 and d.cause == "precomputed:cpsat"
    m, d = m.finish()
    assert m.state == "finished" and isinstance(d, Unchanged)
    for _, d in (m.fail((0, 0)), m.recover((0, 0), 2)):
        assert isinstance(d, Reject) and "finished" in d.reason
    assert isinstance(m.improved()[1], Unchanged) and isinstance(m.resync(1)[1], Unchanged)


# ---- arbitrary sequences ---------------------------------------------------------------
D, S = 3, 2
worker = st.tuples(st.integers(0, D - 1), st.integers(0, S - 1))
observation = st.one_of(
    st.tuples(st.just("fail"), worker, st.one_of(st.none(), st.integers(1, 4))),
    st.tuples(st.just("recover"), worker, st.one_of(st.none(), st.integers(1, 4))),
    st.tuples(st.just("resync"), st.integers(-1, 12)),
    st.tuples(st.just("measured"), st.sampled_from([None, ((1.0, 0.5),) * 3, ((0.5, 1.0),) * 3])),
    st.tuples(st.just("improved")),
)


def apply(m, obs):
    kind, *args = obs
    return getattr(m, kind)(*args)


@settings(max_examples=300, deadline=None)
@given(st.lists(observation, max_size=30))
def test_any_sequence_keeps_the_invariants(seq):
    m = started(D, S)
    for obs in seq:
        new, d = apply(m, obs)
        if isinstance(d, (Reject, Unchanged)):
            assert new is m or (obs[0] == "finish")  # nothing changes
        elif isinstance(d, Publish):
            assert m.state == "running" and new.state == "running"
            assert d.version == m.version + 1 == new.version  # versions count up by one
            assert d.failed == tuple(sorted(new.failed)) and d.incarnations == new.incarnations
            assert new.dead_stage(new.failed) is None  # every stage keeps a live worker
            assert d.same_plan <= (new.failed == m.failed and new.speeds == m.speeds)
        else:
            assert isinstance(d, Halt) and new.state == "halted" and m.state == "running"
            assert new.dead_stage(new.failed) is not None and new.version == m.version
        for r in range(D):  # incarnations never go back
            for s in range(S):
                assert new.incarnation((r, s)) >= m.incarnation((r, s))
        m = new


# ---- the worker's side: what a process does with a plan (executor/runtime/role.py) ------
def test_next_role_enters_waits_or_stops():
    from executor.runtime.role import Role, next_role
    from planner.job import JobSpec
    from planner.solvers.backends import solve
    plan = solve(JobSpec.uniform(2, 2, 2), [(1, 0)]).stamped(3, [[1, 1], [2, 1]])
    assert next_role(plan, (0, 0), 1, False)[0] is Role.ENTER
    assert next_role(plan, (1, 0), 2, False) == (Role.WAIT, "names incarnation -")  # failed: ask in
    assert next_role(plan, (1, 0), 2, True)[0] is Role.STOP  # was in, now declared failed
    assert next_role(plan, (1, 1), 2, False) == (Role.WAIT, "names incarnation 1")  # predecessor
    assert next_role(plan, (0, 1), 1, True)[0] is Role.ENTER
    newer = plan.stamped(4, [[3, 1], [2, 1]])
    assert next_role(newer, (0, 0), 1, True) == (Role.STOP, "incarnation 3 replaced us")
    done = plan.model_copy(update={"workers": []})
    assert next_role(done, (0, 0), 1, True)[0] is Role.STOP
