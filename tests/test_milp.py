"""MILP back-end: tiny jobs only, and agreement with CP-SAT where both prove optimality."""
from __future__ import annotations

import pytest
from hypothesis import given, settings

from planner.solvers.cpsat import cpsat_plan
from planner.solvers.greedy import greedy_plan
from planner.job import JobSpec
from planner.solvers.milp import milp_plan
from planner.plan import Mode
from planner.validate import check, validate
from tests.strategies import small_jobs


@settings(max_examples=8, deadline=None)
@given(small_jobs(max_d=2, max_s=2, max_m=3, max_actions=18))
def test_milp_valid_and_agrees_with_cpsat(case):
    job, failed, mode = case
    m = milp_plan(job, failed, mode, time_limit=3)
    assert validate(m) == []
    check(m)
    assert m.metrics.period <= greedy_plan(job, failed, mode).metrics.period
    assert m.metrics.lower_bound <= m.solver.bound <= m.metrics.period
    c = cpsat_plan(job, failed, mode, time_limit=1)
    if m.solver.status == "OPTIMAL" and c.solver.status == "OPTIMAL":
        assert m.metrics.period == c.metrics.period
    # Each proof bounds the other solver's plan.
    assert c.metrics.period >= m.solver.bound and m.metrics.period >= c.solver.bound


def test_milp_refuses_large_jobs():
    with pytest.raises(ValueError, match="tiny"):
        milp_plan(JobSpec.uniform(2, 4, 8), [], time_limit=1)


def test_milp_never_claims_an_optimum_worse_than_greedy():
    """A case hypothesis found in CI: the MILP started from the greedy base rule's plan
    (makespan 14 as horizon) and HiGHS returned 14 as proven optimal, where greedy's
    portfolio has 13. It now starts from the portfolio's plan and distrusts a bound above
    a plan in hand."""
    job = JobSpec.model_validate({"replicas": 2, "stages": 2, "microbatches": 1,
                                  "cost": {"F": [1, 1], "I": [1, 1], "W": [1, 3], "OPT": [1, 1]},
                                  "p2p": {"intra": 0, "cross": 3}})
    mode = Mode(split_backward=True, staggered=False)
    m = milp_plan(job, [(0, 1)], mode, time_limit=3)
    g = greedy_plan(job, [(0, 1)], mode)
    assert m.metrics.period <= g.metrics.period == 13
    assert m.solver.bound <= m.metrics.period
