"""The `limit` is a bound, not a policy (planner/simulation/throughput_bound.py): no
layout of the live workers the planner schedules, one depth or several, trains faster, and
on every shipped trace no policy trains faster at any instant."""
import math
import os

import pytest
from hypothesis import given, settings, strategies as st

from planner.job import Cost, JobSpec
from planner.simulation.compare import simulate
from planner.simulation.costs import Model, Pipelines, RecyclePeriods, greedy_period, group
from planner.simulation.policies import POLICIES, Params
from planner.simulation.presets import PRESETS, UNIT_S, preset_job, preset_model
from planner.simulation.throughput_bound import ThroughputBound
from planner.simulation.trace import Placement, read_trace

TRACES = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "traces")


def _gpt(D, S, M=16, name="gpt3-2.7b"):
    model = preset_model(name, D)
    sh = PRESETS[name]
    return preset_job(model, D, S, M, sh.seq, sh.d_model, 1), model


@pytest.mark.parametrize("fname,D,S", [
    ("p3-trace.csv", 4, 8), ("g4dn-trace.csv", 6, 4),
    pytest.param("g4dn-trace.csv", 3, 8, marks=pytest.mark.slow)],  # 30 s more, same trace
    ids=["P3-4x8", "g4dn-6x4", "g4dn-3x8"])
def test_no_policy_trains_faster_than_the_limit_at_any_instant_of_a_shipped_trace(fname, D, S):
    job, model = _gpt(D, S)
    tr = read_trace(os.path.join(TRACES, fname), Placement(D, S, 1, "stages"))
    res = simulate(job, tr, tr.end, UNIT_S, Params(oobleck_reconfig_s=5.0), list(POLICIES),
                   model=model)
    top = res.outcome("limit")
    assert top.stalled_s == 0 and top.lost == 0
    edges = sorted({a for a, _, _ in top.segments})

    def limit_rate(t):
        for a, b, r in top.segments:
            if a <= t < b:
                return r
        return 0.0

    for o in res.outcomes:
        for a, b, r in o.segments:
            if r <= 0 or b <= a:
                continue
            # the limit's rate may change inside the policy's segment: check every piece
            cuts = [a] + [e for e in edges if a < e < b]
            for t in cuts:
                assert r <= limit_rate(t) * (1 + 1e-9), (o.policy, t, r, limit_rate(t))
        assert o.microbatches <= top.microbatches * (1 + 1e-9), o.policy


def test_pipelines_of_unequal_depth_stay_under_the_bound():
    """Oobleck's layouts: pipelines of different depths sharing the batch. However the
    micro-batches are shared, the iteration's rate stays below the bound's for the
    workers they hold. (Not below the best one-depth shape's, the limit before it was a
    bound: a 3-stage and a 5-stage pipeline beat every one-depth shape of 8 workers.)"""
    D, S, M = 4, 8, 16
    job, model = _gpt(D, S, M)
    pipes = Pipelines(job, model, UNIT_S, greedy_period)
    tb = ThroughputBound(model.units, D * M, model.capacity)
    for depths in [(3, 5), (2, 3, 4), (4, 4, 5), (5, 6, 7, 8), (2, 2, 2, 3)]:
        n = sum(depths)
        best = 0.0
        for share in range(1, D * M):  # micro-batches of the first pipeline, rest even
            counts = [share] + [max(1, (D * M - share) // (len(depths) - 1))] * (len(depths) - 1)
            T = max(pipes.period(group(model.units, k), m) for k, m in zip(depths, counts))
            best = max(best, sum(counts) / T)
        assert best <= D * M / (tb.period(n) * UNIT_S) * (1 + 1e-9), depths


@settings(max_examples=40, deadline=None)
@given(D=st.integers(1, 4), S=st.integers(1, 5), M=st.integers(1, 6),
       costs=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9),
                                st.integers(0, 9)), min_size=5, max_size=5),
       dead=st.sets(st.tuples(st.integers(0, 3), st.integers(0, 4)), max_size=4))
def test_the_planners_period_for_any_failed_set_is_never_below_the_bound(D, S, M, costs,
                                                                         dead):
    """A spec's grid with any failed set that leaves every stage a worker: the greedy
    planner's period is at least the bound's for the live count."""
    F, I, W, O = (list(x[:S]) for x in zip(*costs))
    job = JobSpec(replicas=D, stages=S, microbatches=M, cost=Cost(F=F, I=I, W=W, OPT=O))
    failed = {(d, s) for d, s in dead if d < D and s < S}
    if any(all((d, s) in failed for d in range(D)) for s in range(S)):
        return
    P = RecyclePeriods(job, 1.0)(frozenset(failed))
    tb = ThroughputBound(Model.of_spec(job).units, D * M, None)
    B = tb.period(D * S - len(failed))
    assert B is not None and B <= P * (1 + 1e-9), (B, P)


def test_the_bound_is_the_work_when_one_worker_holds_everything():
    """One worker, one stage that fits: the period is all the work plus one step, exactly;
    more workers never raise it, and no cut that fits means nothing trains."""
    job, model = _gpt(2, 4, 4, "gpt3-medium")
    tb = ThroughputBound(model.units, 8, model.capacity)
    work = sum(u.F + u.I + u.W for u in model.units)
    step = sum(u.OPT for u in model.units)
    assert tb.period(1) == pytest.approx(8 * work + step, rel=1e-9)
    periods = [tb.period(n) for n in range(1, 9)]
    assert all(a >= b for a, b in zip(periods, periods[1:]))
    assert periods[-1] >= 8 * work / 8  # never below the work spread over every worker
    tight = ThroughputBound(model.units, 8, capacity=1)
    assert tight.period(8) is None and math.isinf(tight.workers_needed(1e18, 8))
