"""The simulator's `recycle-roles` policy (roles: workers move between stages, on the job's
own partition) against `recycle-fixed`, on traces small enough to work out by hand.
(`recycle` adds shapes: tests/test_shapes_simulate.py.)"""
import dataclasses

import pytest

from planner.job import JobSpec
from planner.control.roles import choose_roles
from planner.simulation.compare import simulate
from planner.simulation.policies import Params
from planner.simulation.trace import Event, Trace
from planner.solvers.backends import solve

U = 1e-3


def P(job, failed=()):
    return solve(job, list(failed), "greedy", canonical=True).metrics.period * U


def run(job, events, duration, params=Params(), every=1e9, logs=0.0):
    """The roles' arithmetic without the logs' share of the throughput (`logs`: with it)."""
    params = dataclasses.replace(params, swift_log_overhead=logs)
    res = simulate(job, Trace(events), duration, U, params, ["recycle-roles", "recycle-fixed"],
                   checkpoint_every_s=every)
    return res, {o.policy: o for o in res.outcomes}


def test_a_worker_moves_into_the_weakest_stage_and_the_rate_follows():
    """D=3, S=2: stage 1 loses two of its three workers at 100 s; 400 s in all. Fixed roles
    run stage 1 on one worker; with roles a stage-0 worker moves over (counts 2 and 2)."""
    job = JobSpec.uniform(3, 2, 4).model_copy(update={"state_bytes": [4000, 4000],
                                                      "bandwidth": 2.0})  # 2 s a move
    ev = [Event(100.0, "fail", ((0, 1), (1, 1)))]
    res, out = run(job, ev, 400.0, Params(detect_s=5, horizon_s=1e6))
    DM = job.num_microbatches
    r0 = DM / P(job)
    live = {f"{d}.{s}": (d, s) for d in range(3) for s in range(2) if (d, s) not in ((0, 1), (1, 1))}
    a = choose_roles(job, live, 1e6 / U, lambda f: round(P(job, f) / U))
    assert a.counts == [2, 2] and len(a.moves) == 1 and a.stall == 2000
    r_roles, r_fixed = DM / P(job, a.failed), DM / P(job, [(0, 1), (1, 1)])
    assert r_roles > 1.3 * r_fixed
    lost = (100 % P(job)) * r0
    o = out["recycle-roles"]  # detection 5 s + the move's 2 s, then the roles' rate
    assert o.microbatches == pytest.approx(100 * r0 - lost + (400 - 107) * r_roles)
    assert o.stalled_s == pytest.approx(7)
    f = out["recycle-fixed"]
    assert f.microbatches == pytest.approx(100 * r0 - lost + (400 - 105) * r_fixed)
    assert res.stats["recycle-roles"]["moves"] == 1


def test_the_boundary_logs_cost_recycle_their_share_of_the_throughput():
    job = JobSpec.uniform(2, 2, 4)
    _, out = run(job, [], 100.0, logs=0.01)
    rate = job.num_microbatches / P(job)
    assert out["recycle-roles"].microbatches == pytest.approx(100 * rate * 0.99)
    assert out["recycle-fixed"].microbatches == pytest.approx(100 * rate)  # logs nothing
    _, off = run(job, [], 100.0, Params(replay=False), logs=0.01)
    assert off["recycle-roles"].microbatches == pytest.approx(100 * rate)


def test_no_move_when_the_next_event_comes_too_soon():
    job = JobSpec.uniform(3, 2, 4).model_copy(update={"state_bytes": [10**6, 10**6],
                                                      "bandwidth": 1.0})  # 1000 s a move
    _, out = run(job, [Event(100.0, "fail", ((0, 1), (1, 1)))], 400.0,
                 Params(detect_s=5, horizon_s=300))
    assert out["recycle-roles"].microbatches == pytest.approx(out["recycle-fixed"].microbatches)


@pytest.mark.parametrize("replay", [False, True])
def test_a_stage_that_loses_every_holder_restores_from_its_snapshot_not_the_checkpoint(replay):
    """D=2, S=2: both stage-1 workers fail at 100 s. Fixed roles halt until a repair and
    restore from the checkpoint; with roles a stage-0 worker takes stage 1 from the
    snapshot (on a node that survived). Without the boundary logs the work since the last
    snapshot is lost; with them only the iteration in flight is, and the job stalls while
    stage 1 alone replays the micro-batches since the snapshot: its F+I+W each, on the
    one worker that took it."""
    job = JobSpec.uniform(2, 2, 4)
    ev = [Event(100.0, "fail", ((0, 1), (1, 1))), Event(300.0, "recover", ((0, 1), (1, 1)))]
    params = Params(detect_s=5, restart_s=60, snapshot_every=3, replay=replay)
    res, out = run(job, ev, 500.0, params, every=1000.0)
    P0 = P(job)
    r0 = job.num_microbatches / P0
    o = out["recycle-roles"]
    since, in_flight = (100 % (3 * P0)) * r0, (100 % P0) * r0
    assert o.restarts == 0 and any("snapshot" in n for n in o.notes)
    if replay:
        assert o.lost == pytest.approx(in_flight)
        c = job.cost
        replay_s = [b - a for a, b, cause in o.stall_spans if cause == "replay"]
        assert replay_s == [pytest.approx((since - in_flight) * (c.F[1] + c.I[1] + c.W[1]) * U)]
    else:
        assert o.lost == pytest.approx(since)
        assert all(cause != "replay" for _, _, cause in o.stall_spans)
    assert o.lost <= 3 * job.num_microbatches
    f = out["recycle-fixed"]
    assert f.restarts == 1 and f.lost == pytest.approx(100 * r0)
    assert o.microbatches > f.microbatches


def test_fewer_live_workers_than_stages_pauses_and_resumes_from_memory():
    job = JobSpec.uniform(1, 3, 4)
    ev = [Event(100.0, "fail", ((0, 2),)), Event(200.0, "recover", ((0, 2),))]
    res, out = run(job, ev, 300.0, Params(detect_s=5, restart_s=60), every=1000.0)
    o = out["recycle-roles"]
    # one pipeline: stage 2's snapshot is on another node (worker 0:0 or 0:1), so nothing
    # but the iteration in flight is lost, and no checkpoint restore
    assert o.restarts == 0
    assert any("paused" in n for n in o.notes) and any("resumed" in n for n in o.notes)
    assert o.stalled_s == pytest.approx(100)
