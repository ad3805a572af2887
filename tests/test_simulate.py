"""The failure-trace simulator's policies on traces small enough to work out by hand.

Periods come from the planner (the simulator's input); everything a policy does with them
(what it loses, how long it stalls, its rate in each state) is worked out here.
"""
import pytest

from planner.job import JobSpec
from planner.simulation.compare import simulate
from planner.simulation.policies import POLICIES, Params
from planner.simulation.trace import Event, Trace
from planner.solvers.backends import solve

U = 1e-3  # seconds per spec unit


def P(job, failed=()):
    return solve(job, list(failed), "greedy", canonical=True).metrics.period * U


def run(job, events, duration, params, every=250.0):
    result = simulate(job, Trace(events), duration, U, params, checkpoint_every_s=every)
    return result, {o.policy: o for o in result.outcomes}


PARAMS = Params(detect_s=5, restart_s=60, spares=1, rejoin_s=10, oobleck_reconfig_s=7,
                oobleck_min_stages=2, bamboo_failover_s=3, swift_log_overhead=0.0)


def test_no_failures_every_policy_but_bamboo_trains_at_the_failure_free_rate():
    """... the user's grid's rate, or, for the policies that re-cut the model at the start
    (the limits, Oobleck's templates), their best use of every worker, which is no
    slower (the user's cut is one they may keep). The limit, a bound no layout reaches,
    lies above them all."""
    job = JobSpec.uniform(4, 4, 8)
    result, out = run(job, [], 3600.0, Params(swift_log_overhead=0.0))
    rate = job.num_microbatches / P(job)
    assert result.base_rate == pytest.approx(rate)
    recut = {"limit", "shape-limit", "oobleck"}
    for name in POLICIES:
        if not name.startswith("bamboo"):
            if name in recut:
                assert out[name].microbatches >= rate * 3600 * (1 - 1e-9), name
            else:
                assert out[name].microbatches == pytest.approx(rate * 3600), name
            assert out[name].stalled_s == 0 and out[name].lost == 0
    # recycle starts on the user's grid, as the product does (the shape is chosen at
    # events): with no event it keeps it, below the best shape the planner schedules
    assert out["recycle"].microbatches < out["shape-limit"].microbatches
    assert out["limit"].microbatches > out["shape-limit"].microbatches  # bubbles, p2p
    assert out["bamboo"].microbatches < 0.9 * rate * 3600  # redundant forwards, always on
    # SWIFT's logging is its steady-state cost
    _, out = run(job, [], 3600.0, Params(swift_log_overhead=0.05))
    assert out["swift-replay"].microbatches == pytest.approx(0.95 * rate * 3600)


def test_two_failures_one_recovery_each_policy_by_hand():
    """D=3, S=2, M=4: 0:1 fails at 100 s, 1:1 at 200 s, 0:1 is back at 300 s; 400 s."""
    job = JobSpec.uniform(3, 2, 4)
    DM, M = job.num_microbatches, job.microbatches
    trace = [Event(100.0, "fail", ((0, 1),)), Event(200.0, "fail", ((1, 1),)),
             Event(300.0, "recover", ((0, 1),))]
    _, out = run(job, trace, 400.0, PARAMS)
    P0, P1, P2 = P(job), P(job, [(0, 1)]), P(job, [(0, 1), (1, 1)])
    r0, r1, r2 = DM / P0, DM / P1, DM / P2

    # ReCycle: the iteration in flight is lost at each failure, 5 s to detect, then the
    # plan for the failed set; the rejoin is free. {1:1} is {0:1} renumbered.
    l1, l2 = (100 % P0) * r0, ((200 - 105) % P1) * r1
    o = out["recycle-fixed"]
    assert o.microbatches == pytest.approx(100 * r0 - l1 + 95 * r1 - l2 + 95 * r2 + 100 * r1)
    assert o.lost == pytest.approx(l1 + l2) and o.stalled_s == pytest.approx(10)
    assert out["swift-replay"].microbatches == pytest.approx(o.microbatches)  # no stage lost

    # Checkpoint-restart with one spare: the first failure restarts on the spare (all work
    # since the start lost, 5 + 60 s), the second stops the job (35 s of work lost) until
    # the repair, then a 60 s restart.
    o = out["checkpoint-restart"]
    assert o.microbatches == pytest.approx(40 * r0)
    assert o.lost == pytest.approx(135 * r0) and o.stalled_s == pytest.approx(225)
    assert o.restarts == 2

    # Replica-dropping policies: 3, 2, 1, then 2 replicas of M micro-batches per P0.
    d1, d2 = (100 % P0) * r0, ((200 - 105) % P0) * 2 / 3 * r0
    o = out["drop-replica"]  # torchft: the rejoining replica heals while the others train
    assert o.microbatches == pytest.approx(100 * r0 - d1 + 95 * 2 / 3 * r0 - d2
                                           + 95 / 3 * r0 + 100 * 2 / 3 * r0)
    o = out["rollback"]  # everyone waits 10 s for the rejoin
    assert o.microbatches == pytest.approx(100 * r0 - d1 + 95 * 2 / 3 * r0 - d2
                                           + 95 / 3 * r0 + 90 * 2 / 3 * r0)
    assert o.stalled_s == pytest.approx(20)
    o = out["lossy-forward"]  # only the failed replica's share of the iteration is lost
    assert o.lost == pytest.approx(d1 / 3 + d2 / 2)
    assert o.microbatches == pytest.approx(100 * r0 - d1 / 3 + 95 * 2 / 3 * r0 - d2 / 2
                                           + 95 / 3 * r0 + 90 * 2 / 3 * r0)

    # Oobleck, templates of 2 stages only: 5 or 4 live workers make 2 pipelines of 6
    # micro-batches (one worker idle), against 3 of 4 without failures. A template runs m
    # micro-batches in a + b*m, fitted on one pipeline's periods at M and 2M.
    pipe = JobSpec.uniform(1, 2, 4)
    p4, p8 = P(pipe), P(pipe.model_copy(update={"microbatches": 8}))
    a, b = 2 * p4 - p8, (p8 - p4) / 4
    ro = r0 * (a + 4 * b) / (a + 6 * b)
    o1, o2 = (100 % P0) * r0, ((200 - 112) % (DM / ro)) * ro
    o = out["oobleck"]  # 5 s detection + 7 s reconfiguration per failure, 7 s per rejoin
    assert o.microbatches == pytest.approx(100 * r0 - o1 + 88 * ro - o2 + 88 * ro + 93 * ro)
    assert o.stalled_s == pytest.approx(31)

    # Bamboo: each stage also runs its successor's forward; a failed stage is run by its
    # predecessor (a one-stage pipeline of both stages), the slowest pipeline sets the
    # pace; no work lost, 5 + 3 s per failure, 3 s per rejoin.
    norm = P0 / p4
    T_rc = P(JobSpec.uniform(1, 2, 4, F=20)) * norm
    T_one = P(JobSpec.uniform(1, 1, 4, F=20, I=20, W=16, OPT=10, activation=8)) * norm
    slow = max(T_rc, T_one)
    o = out["bamboo"]
    assert o.microbatches == pytest.approx(100 * 3 * M / T_rc + (92 + 92 + 97) * 3 * M / slow)
    assert o.lost == 0 and o.stalled_s == pytest.approx(19)


def test_a_lost_stage_restores_recycle_and_replays_swift():
    """One pipeline (D=1, S=2): its stage 1 fails at 100 s and is back at 200 s; 500 s."""
    job = JobSpec.uniform(1, 2, 4)
    trace = [Event(100.0, "fail", ((0, 1),)), Event(200.0, "recover", ((0, 1),))]
    _, out = run(job, trace, 500.0, PARAMS, every=150.0)
    P0 = P(job)
    r0 = job.num_microbatches / P0
    o = out["recycle-fixed"]  # global restore: 100 s of work lost, restart 60 s
    assert o.microbatches == pytest.approx(240 * r0) and o.restarts == 1
    assert o.stalled_s == pytest.approx(160)
    # SWIFT: stage 1 alone replays the 100 s of logged iterations: each is its 4 F+I+W.
    replay = 100 / P0 * 4 * 28 * U
    assert replay < 100
    o = out["swift-replay"]
    assert o.microbatches == pytest.approx(100 * r0 - (100 % P0) * r0 + (240 - replay) * r0)
    assert o.restarts == 0
    assert any("replayed" in n for n in o.notes)
    # ... and Bamboo's predecessor takes the stage over: it never stops
    assert out["bamboo"].restarts == 0 and out["bamboo"].stalled_s == pytest.approx(5 + 3 + 3)


def test_adjacent_failures_restart_bamboo_without_that_pipeline():
    job = JobSpec.uniform(2, 4, 4)
    trace = [Event(100.0, "fail", ((0, 1),)), Event(150.0, "fail", ((0, 2),))]
    _, out = run(job, trace, 300.0, PARAMS, every=1000.0)
    o = out["bamboo"]
    assert o.restarts == 1 and any("adjacent" in n for n in o.notes)
    assert o.stalled_s == pytest.approx(5 + 3 + 5 + 60)
    # after the restart one pipeline of two trains: half the micro-batches per iteration
    last = o.segments[-1]
    first = o.segments[0]
    assert last[2] == pytest.approx(first[2] / 2)


@pytest.mark.procs
def test_the_simulators_period_is_the_greedy_plans():
    from planner.simulation.costs import RecyclePeriods, plan_period

    job = JobSpec.uniform(3, 4, 4)
    for failed in ([], [(0, 1)], [(0, 1), (2, 1)], [(1, 0), (1, 3), (2, 2)]):
        assert plan_period(job, failed) == solve(job, failed, "greedy").metrics.period
    # planned ahead in processes or as they come: the same periods
    sets = [frozenset(), frozenset({(0, 1)}), frozenset({(0, 1), (2, 1)}),
            frozenset({(1, 0), (1, 3)}), frozenset({(2, 2)})]
    ahead = RecyclePeriods(job, U)
    ahead.prefetch(sets, jobs=2)
    assert ahead.planned == 5
    assert [ahead(f) for f in sets] == [RecyclePeriods(job, U)(f) for f in sets]
    assert ahead.planned == 5  # all served from what was planned ahead


def test_a_straggler_is_re_planned_by_recycle_and_slows_the_synchronous_policies():
    job = JobSpec.uniform(2, 2, 4)
    trace = [Event(100.0, "speed", ((0, 1),), 0.5)]
    _, out = run(job, trace, 200.0, Params(swift_log_overhead=0.0))
    r0 = job.num_microbatches / P(job)
    slow = job.model_copy(update={"speed": [[1.0, 0.5], [1.0, 1.0]]})
    rs = job.num_microbatches / P(slow)
    assert r0 / 2 < rs < r0  # its peer takes some of its micro-batches
    assert out["recycle-fixed"].microbatches == pytest.approx(100 * r0 + 100 * rs)
    assert out["recycle-fixed"].lost == 0 and out["recycle-fixed"].stalled_s == 0
    for name in ("checkpoint-restart", "drop-replica", "oobleck"):
        assert out[name].microbatches == pytest.approx(100 * r0 + 100 * r0 / 2), name


def test_a_spare_replacing_a_node_at_once_does_not_cut_the_detection_stall_short():
    """A spot trace's removal with a waiting spare is a failure and a recovery at the same
    instant: the recovery's decision (no stall: the fresh worker loads while others train)
    once reset the failure's detection stall, so spot traces cost no detection at all."""
    job = JobSpec.uniform(2, 2, 4)
    trace = [Event(100.0, "fail", ((0, 1),)), Event(100.0, "recover", ((0, 1),)),
             Event(200.0, "fail", ((1, 0),)), Event(203.0, "recover", ((1, 0),))]
    _, out = run(job, trace, 400.0, PARAMS)
    for name in ("recycle", "recycle-fixed"):
        assert out[name].stalled_s == pytest.approx(2 * PARAMS.detect_s), name
