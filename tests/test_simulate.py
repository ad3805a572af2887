"""Failure-trace simulator on hand-made traces whose answers can be worked out by hand."""
import pytest

from planner.solvers.backends import solve
from planner.job import JobSpec
from planner.simulate import Event, random_trace, simulate

JOB = JobSpec.uniform(2, 2, 4)
DM = JOB.num_microbatches


def period(failed):
    return solve(JOB, failed, "greedy").metrics.period


def run(trace, duration):
    return {o.policy: o for o in simulate(JOB, trace, duration, period, unit_s=1e-3,
                                          checkpoint_every_s=100.0, restart_s=10.0)}


def test_no_failures_every_policy_runs_at_full_rate():
    rate = DM / (period([]) * 1e-3)
    for o in run([], 50.0).values():
        assert o.microbatches == pytest.approx(rate * 50.0)


def test_one_failure_and_repair():
    trace = [Event(20.0, "fail", (1, 0)), Event(30.0, "recover", (1, 0))]
    out = run(trace, 50.0)
    full, slow = DM / (period([]) * 1e-3), DM / (period([(1, 0)]) * 1e-3)
    # ReCycle: full rate, the failed set's rate for 10 s, full again; one iteration lost.
    assert out["recycle"].microbatches == pytest.approx(full * 40 + slow * 10 - DM)
    # Checkpoint-restart: stops 20..30, loses the 20 s since the checkpoint, restarts 10 s.
    assert out["checkpoint"].microbatches == pytest.approx(full * 10)
    assert out["checkpoint"].stalled_s == pytest.approx(10.0)
    # Elastic: half the replicas for 10 s.
    # (the iteration in flight, with both replicas in it, is lost)
    assert out["drop-replica"].microbatches == pytest.approx(full * 40 + full / 2 * 10 - DM)
    assert out["recycle"].microbatches > out["drop-replica"].microbatches > out["checkpoint"].microbatches


def test_losing_a_whole_stage_halts_recycle_too():
    trace = [Event(10.0, "fail", (0, 1)), Event(12.0, "fail", (1, 1)),
             Event(20.0, "recover", (1, 1)), Event(25.0, "recover", (0, 1))]
    out = run(trace, 40.0)
    assert out["recycle"].stalled_s == pytest.approx(8.0)
    assert any("restarted from checkpoint at 20s" in n for n in out["recycle"].notes)


def test_random_trace_is_seeded_and_alternates():
    a = random_trace(JOB, 1e6, 1e5, 1e3, seed=4)
    assert a == random_trace(JOB, 1e6, 1e5, 1e3, seed=4) and a != random_trace(JOB, 1e6, 1e5, 1e3, seed=5)
    for w in {e.worker for e in a}:
        kinds = [e.kind for e in a if e.worker == w]
        assert all(k1 != k2 for k1, k2 in zip(kinds, kinds[1:]))
