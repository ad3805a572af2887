"""Elastic membership (planner/control/elastic.py through membership.py): a stage left
short takes a worker, a stage left empty needs a snapshot, and every published version is
a valid assignment of the live workers. Pure and fast."""
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.control.membership import Halt, Membership, Pause, Publish, Reject, Unchanged
from planner.job import JobSpec
from planner.shapes.planning import chooser_for
from planner.plan import home_of


def elastic(D, S, snapshots=False, pause=False):
    job = JobSpec.uniform(D, S, 2 * D)
    m, d = Membership.start(D, S, job=job, snapshots=snapshots, horizon=1e9,
                            pause=pause).first()
    assert isinstance(d, Publish) and d.roles is None
    return m


def test_a_single_failure_is_plain_rerouting_with_no_roles():
    m, d = elastic(3, 3).fail((1, 1))
    assert d.roles is None and d.moves == () and d.failed == ((1, 1),)


def test_a_short_stage_takes_a_worker_from_the_fullest_stage():
    m = elastic(3, 3)
    for w in [(0, 1), (0, 2)]:
        m, d = m.fail(w)
        assert d.roles is None
    m, d = m.fail((1, 2))
    assert [(x.from_stage, x.to_stage, x.source) for x in d.moves] == [(0, 2, "peer")]
    assert sorted(sum(1 for r in d.roles if r.stage == s) for s in range(3)) == [2, 2, 2]
    assert len(d.failed) == 3 and m.failed == {(0, 1), (0, 2), (1, 2)}


def test_an_empty_stage_is_restored_from_a_snapshot_or_halts_without_one():
    m = elastic(2, 2, snapshots=True)
    m, _ = m.fail((0, 1))
    m, d = m.fail((1, 1))
    assert isinstance(d, Publish) and [(x.source, x.to_stage) for x in d.moves] == [("snapshot", 1)]
    m = elastic(2, 2)
    m, _ = m.fail((0, 1))
    m, d = m.fail((1, 1))
    assert isinstance(d, Halt) and "stage 1 has no live replica" in d.reason
    assert m.state == "halted"


def test_fewer_live_workers_than_stages_halts():
    m = elastic(1, 3, snapshots=True)
    m, d = m.fail((0, 1))
    assert isinstance(d, Halt) and "cannot serve 3 stages" in d.reason


def test_fewer_live_workers_than_stages_pauses_until_enough_are_back():
    # a run that keeps snapshots loses nothing when 2 of 6 workers live on 3 stages: it
    # pauses (no version), counts the deaths and returns, and resumes once 3 are back
    m = elastic(2, 3, snapshots=True, pause=True)
    m, d = m.fail_many([((0, 0), None), ((1, 0), None), ((0, 1), None)])
    assert isinstance(d, Publish)  # 3 live: stage 0 restored from its snapshot
    m = m.entered(m.version)
    v = m.version
    m, d = m.fail((1, 1))
    assert isinstance(d, Pause) and d.reason == "2 live workers cannot serve 3 stages"
    assert m.state == "paused" and m.version == v and (1, 1) in m.failed
    assert isinstance(m.resync(v)[1], Unchanged) and isinstance(m.improved()[1], Unchanged)
    m, d = m.fail((0, 2))  # a death while paused: still paused, one live worker
    assert isinstance(d, Pause) and d.reason == "1 live worker cannot serve 3 stages"
    m, d = m.recover((0, 0), 2)  # back with no state: 2 live, still paused
    assert isinstance(d, Pause) and m.incarnation((0, 0)) == 2 and m.back == {(0, 0)}
    assert m.entered(m.version).back == {(0, 0)}  # no version admitted it yet
    m, d = m.recover((1, 0), 2)  # 3 live: a version that serves every stage
    assert isinstance(d, Publish) and m.state == "running" and m.reason is None
    assert d.version == v + 1 and d.incarnations[0][0] == d.incarnations[1][0] == 2
    assert {x.stage for x in d.roles} == {0, 1, 2}
    # both returned workers hold nothing: they join (from_stage None), none is a donor
    joins = {x.worker for x in d.moves if x.from_stage is None}
    assert joins == {"0.0", "1.0"}, d.moves
    assert all(x.source != "peer" or x.from_stage is not None for x in d.moves)


def test_too_few_workers_at_the_start_halts_even_with_pause():
    job = JobSpec.uniform(2, 3, 4)
    m = Membership.start(2, 3, failed=[(0, 0), (1, 0), (0, 1), (1, 1)], job=job,
                         snapshots=True, pause=True)
    m, d = m.first()
    assert isinstance(d, Halt) and "cannot serve 3 stages" in d.reason and m.pause


def test_without_snapshots_or_pause_too_few_workers_still_halts():
    _, d = elastic(1, 3, snapshots=False, pause=True).fail((0, 1))
    assert isinstance(d, Halt)
    _, d = elastic(1, 3, snapshots=True, pause=False).fail((0, 1))
    assert isinstance(d, Halt) and "cannot serve 3 stages" in d.reason


def test_a_recovered_worker_takes_a_slot_and_its_incarnation_is_named():
    m = elastic(3, 3)
    for w in [(0, 1), (0, 2), (1, 2)]:
        m, d = m.fail(w)
    m, d = m.recover((0, 2), 2)
    assert isinstance(d, Publish) and d.incarnations[0][2] == 2
    assert "0.2" in {r.worker for r in d.roles}


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 3), st.integers(2, 3),
       st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 2)), max_size=10),
       st.booleans(), st.booleans())
def test_every_version_is_a_valid_assignment_of_the_live_workers(D, S, steps, snapshots, pause):
    m = elastic(D, S, snapshots, pause)
    for kill, r, s in steps:
        w = (r % D, s % S)
        m2, d = m.fail(w) if kill else m.recover(w)
        if isinstance(d, Halt):
            assert m2.state == "halted"
            break
        if isinstance(d, Pause):
            assert pause and snapshots and m2.state == "paused" and len(m2.live()) < S
            m = m2
            continue
        if not isinstance(d, Publish):
            assert m2 is m
            continue
        m = m2
        roles = d.roles if d.roles is not None else [
            type("R", (), {"worker": f"{a}.{b}", "replica": a, "stage": b})()
            for a in range(D) for b in range(S) if (a, b) not in m.failed]
        slots = [(x.replica, x.stage) for x in roles]
        assert len(slots) == len(set(slots))  # one worker per slot
        assert {home_of(x.worker) for x in roles} == set(m.live())  # every live worker, no dead
        assert {x.stage for x in roles} == set(range(S))  # every stage served
        assert set(d.failed) == {(a, b) for a in range(D) for b in range(S)} - set(slots)


def test_a_mover_whose_donors_die_before_it_entered_holds_nothing():
    # chaos seed 2 (2x3): a stage-1 worker moved to stage 0, whose last holder died before
    # the move's world formed; the membership took the mover for a holder of stage 0, the
    # runtime had no copy and the worker crashed. A move counts only once entered.
    m = elastic(3, 3)
    for w in [(0, 1), (0, 2)]:
        m, _ = m.fail(w)
        m = m.entered(m.version)
    m, d = m.fail((1, 2))  # stage 2 keeps one worker: a stage-0 worker moves there
    assert [(x.from_stage, x.to_stage) for x in d.moves] == [(0, 2)] and m.moving
    _, d1 = m.fail((2, 2))  # the donor dies before the mover entered: no copy of stage 2
    assert isinstance(d1, Halt) and "stage 2 has no live replica" in d1.reason
    entered = m.entered(m.version)
    assert not entered.moving
    _, d2 = entered.fail((2, 2))  # once entered, the mover holds stage 2
    assert isinstance(d2, Publish)
    assert d.moves[0].worker in {r.worker for r in d2.roles if r.stage == 2}


# ---- a node removed: several workers at once (fail_many) -----------------------------------
def test_a_node_removed_is_one_version_without_all_its_workers():
    m, d = elastic(3, 3).fail_many([((0, 0), None), ((0, 1), 1)])
    assert isinstance(d, Publish) and d.version == 1 and d.roles is None
    assert d.failed == ((0, 0), (0, 1)) and m.failed == {(0, 0), (0, 1)}


def test_a_node_removal_that_leaves_a_stage_short_moves_a_worker_as_one_by_one_would():
    kills = [(0, 1), (0, 2), (1, 2)]
    m, d = elastic(3, 3).fail_many([(w, None) for w in kills])
    one = elastic(3, 3)
    for w in kills:
        one, last = one.fail(w)
    assert isinstance(d, Publish) and d.version == 1  # one version, not three
    assert (d.roles, d.moves, d.failed) == (last.roles, last.moves, last.failed)
    assert [(x.from_stage, x.to_stage, x.source) for x in d.moves] == [(0, 2, "peer")]


def test_a_node_removal_leaves_out_workers_failed_already_or_stale():
    m = elastic(3, 3)
    m, _ = m.fail((0, 0))
    m, _ = m.recover((1, 1), 3)  # 1:1 is live as incarnation 3 (a replacement)
    m2, d = m.fail_many([((0, 0), None), ((1, 1), 2), ((2, 2), 1)])
    assert isinstance(d, Publish) and m2.failed == {(0, 0), (2, 2)}
    _, d = m.fail_many([((0, 0), None), ((1, 1), 2)])
    assert isinstance(d, Reject) and "nothing to remove" in d.reason
    _, d = m.fail_many([((3, 0), None)])
    assert isinstance(d, Reject) and "outside the 3x3 grid" in d.reason


def test_a_node_removal_that_empties_a_stage_halts_without_snapshots():
    _, d = elastic(2, 2).fail_many([((0, 1), None), ((1, 1), None)])
    assert isinstance(d, Halt) and "stage 1 has no live replica" in d.reason
    plain = Membership.start(2, 2)
    m, d = plain.fail_many([((0, 1), None), ((1, 1), None)])
    assert isinstance(d, Halt) and m.state == "halted" and m.failed == {(0, 1), (1, 1)}
    m, d = plain.fail_many([((0, 1), None), ((1, 0), None)])
    assert isinstance(d, Publish) and d.failed == ((0, 1), (1, 0))


# ---- following a published plan (the service restarted, the coordinator with --service) ----
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 2)), max_size=8))
def test_the_membership_a_plan_says_is_the_one_that_published_it(steps):
    from planner.solvers.backends import solve
    job = JobSpec.uniform(3, 3, 6)
    m = elastic(3, 3)
    for kill, r, s in steps:
        m2, d = m.fail((r, s)) if kill else m.recover((r, s))
        if not isinstance(d, Publish):
            if isinstance(d, Halt):
                break
            continue
        m = m2
        plan = solve(job, list(d.failed), "greedy").stamped(d.version, d.incarnation_rows())
        if d.roles is not None:
            plan = plan.with_roles(list(d.roles), list(d.moves))
        back = Membership.following(plan, job=job, snapshots=m.snapshots, horizon=m.horizon)
        assert (back.failed, back.roles, back.incarnations, back.version) == \
            (m.failed, m.roles, m.incarnations, m.version)
        assert back.empty_slots() == m.empty_slots() == tuple(map(tuple, plan.failed))


# ---- shapes (planner/shapes/ through membership.py's `shapes`) --------------------------

def shaped(D, S, snapshots=True, **kw):
    job = JobSpec.uniform(D, S, 2 * D)
    m, d = Membership.start(D, S, job=job, snapshots=snapshots, horizon=1e9, pause=snapshots,
                            shapes=True, **kw).first()
    assert isinstance(d, Publish) and d.partition is None
    return m


def test_with_speed_cuts_one_failure_cuts_for_speed_and_the_return_goes_back():
    """`--shape speed`: the chooser at every event. One of 2x4 lost leaves one worker to
    carry a stage's two replicas (twice the period); seven workers on two stages train
    faster, so the job is cut with as many live workers as stages. When the worker comes
    back, the shape is chosen again for all eight: the best of the family for eight (here
    four replicas of two stages, fewer bubbles than the user's 2x4), every slot filled.
    Without speed cuts (`auto`) the same failure keeps the four stages (re-routed)."""
    m = shaped(2, 4, speed_cuts=True)
    m, d = m.fail((1, 2))
    assert isinstance(d, Publish) and d.partition is not None
    assert len(d.partition.bounds) - 1 < 4, d.partition
    m = m.entered(d.version)
    m, d = m.recover((1, 2))
    assert isinstance(d, Publish) and d.partition is not None
    best, _ = chooser_for(JobSpec.uniform(2, 4, 4)).best(8)
    assert list(d.partition.bounds) == list(best.bounds) and d.failed == (), d
    _, d = shaped(2, 4).fail((1, 2))
    assert isinstance(d, Publish) and d.partition is None and d.failed == ((1, 2),)


def test_fewer_live_workers_than_stages_cut_the_job_into_fewer_stages_instead_of_pausing():
    m = shaped(2, 4)
    for w in [(0, 0), (0, 1), (1, 2), (0, 3)]:
        m, d = m.fail(w)
        assert isinstance(d, Publish) and d.partition is None  # 4 live serve 4 stages
    m, d = m.fail((1, 3))
    assert isinstance(d, Publish) and d.partition is not None, d
    assert d.shape_job.stages <= 3 and d.partition.bounds[-1] == 4  # the job's 4 stages as units
    filled = {(r.replica, r.stage) for r in d.roles}
    assert {r.worker for r in d.roles} == {"1.0", "1.1", "0.2"}
    assert set(d.failed) == {(r, s) for r in range(d.shape_job.replicas)
                             for s in range(d.shape_job.stages)} - filled
    assert m.partition == d.partition and m.state == "running"


def test_once_cut_every_later_version_carries_a_partition_the_jobs_own_included():
    m = shaped(2, 2)
    m, d = m.fail_many([((0, 0), None), ((0, 1), None), ((1, 1), None)])
    assert d.partition is not None and d.shape_job.stages == 1, d
    for w in [(0, 0), (0, 1), (1, 1)]:  # all back: a later version may go back to 2 stages
        m = m.entered(m.version)
        m, d = m.recover(w)
        assert isinstance(d, Publish) and d.partition is not None, d
        assert len(d.roles) == len({r.worker for r in d.roles})


def test_without_snapshots_a_stage_lost_whole_halts_rather_than_cut_around_it():
    # a 1x2 job losing stage 0's only worker: the cut (one stage of both) would need
    # stage 0's state, which nobody holds (the service once published it: its worker had
    # no state to load)
    m = shaped(1, 2, snapshots=False)
    m, d = m.fail((0, 0))
    assert isinstance(d, Halt) and "stage 0 has no live replica" in d.reason, d
    assert "restore from checkpoint" in d.reason and m.state == "halted"


def test_fixed_shape_still_pauses():
    m = elastic(2, 2, snapshots=True, pause=True)
    m, d = m.fail_many([((0, 0), None), ((0, 1), None), ((1, 1), None)])
    assert isinstance(d, Pause) and "1 live worker cannot serve 2 stages" in d.reason


def test_when_no_shape_fits_the_live_workers_the_run_pauses_for_returns_then_cuts():
    # a spec's units merge at most two of its stages: 1 live worker of a 2x3 job fits no
    # shape (chaos: it halted, where --shape fixed paused); it pauses, and a return resumes
    # on a shape again
    m = shaped(2, 3)
    m, d = m.fail_many([((0, 0), None), ((0, 1), None), ((1, 1), None), ((0, 2), None)])
    assert isinstance(d, Publish) and d.partition is not None and d.shape_job.stages == 2, d
    m = m.entered(m.version)
    m, d = m.fail((1, 2))
    assert isinstance(d, Pause) and "fit no shape" in d.reason, d
    m, d = m.recover((0, 0))
    assert isinstance(d, Publish) and d.partition is not None, d
