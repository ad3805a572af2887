"""The validator catches each broken constraint; bounds, cache and exports behave."""
import pytest

from planner.solvers.backends import solve
from planner.cache import PlanCache, precompute
from planner.failures import canonical_sets
from planner.gantt import render_svg
from planner.job import JobSpec
from planner.plan import Action, Plan
from planner.plan import Mode
from planner.validate import InvalidPlan, check, validate

JOB = JobSpec.uniform(3, 3, 4)


def _plan(failed=((1, 1),)):
    return solve(JOB, list(failed), "greedy")


def _edit(plan: Plan, replica, stage, fn) -> Plan:
    data = plan.model_dump()
    for w in data["workers"]:
        if (w["replica"], w["stage"]) == (replica, stage):
            w["actions"] = fn(w["actions"])
    return Plan.model_validate(data)


def test_valid_plan_passes():
    assert validate(_plan()) == []


def _shift(op, g, delta):
    def fn(actions):
        for a in actions:
            if a["op"] == op and a["microbatch"] == g:
                a["start"] += delta
                a["end"] += delta
        return actions
    return fn


def test_missing_action_is_caught():
    bad = _edit(_plan(), 0, 0, lambda acts: [a for a in acts if not (a["op"] == "W" and a["microbatch"] == 0)])
    assert any("0W0 is missing" in e for e in validate(bad))


def test_forward_before_its_input_is_caught():
    p = _plan()
    f1 = next(a for a in p.worker(0, 1).actions if a.op == "F" and a.microbatch == 0)
    bad = _edit(p, 0, 1, _shift("F", 0, -f1.start))
    errs = validate(bad)
    assert any(e.startswith("(2) 1F0") for e in errs), errs


def test_overlap_is_caught():
    p = _plan()
    acts = p.worker(0, 2).actions
    second = acts[1]
    bad = _edit(p, 0, 2, _shift(second.op, second.microbatch, acts[0].start - second.start))
    assert any(e.startswith("(5)") for e in validate(bad))


def test_memory_limit_is_caught():
    job = JobSpec.uniform(2, 2, 6, activation=4, capacity=8)  # two micro-batches at a time
    p = solve(job, [], "greedy")
    assert validate(p) == []
    tight = job.model_copy(update={"memory": job.memory.model_copy(update={"capacity": [4, 4]})})
    bad = p.model_copy(update={"job": tight})
    assert any(e.startswith("(6)") for e in validate(bad))


def test_opt_before_peer_weight_gradients_is_caught():
    p = _plan(())
    def early(actions):
        actions[-1]["start"], actions[-1]["end"] = 0, 5
        return actions
    bad = _edit(p, 2, 0, early)
    assert any(e.startswith("(7)") or e.startswith("(5)") for e in validate(bad))


def test_action_on_failed_worker_and_wrong_route_are_caught():
    p = _plan()
    data = p.model_dump()
    data["failed"] = [[0, 0]]
    errs = validate(Plan.model_validate(data))
    assert any("(1) failed worker (0, 0) has actions" in e for e in errs) or any("routed to failed" in e for e in errs)


def test_check_rejects_wrong_metrics():
    p = _plan()
    bad = p.model_copy(update={"metrics": p.metrics.model_copy(update={"period": 1})})
    with pytest.raises(InvalidPlan, match="replay gives"):
        check(bad)


def test_cache_returns_plans_mapped_to_the_asked_replicas(tmp_path):
    cache = PlanCache(str(tmp_path / "plans.sqlite"))
    n = precompute(cache, JOB, 2, solvers=["greedy"])
    assert n == len(list(canonical_sets(JOB, 2))) == cache.count(JOB)
    for failed in ([(2, 0)], [(0, 2), (2, 1)], [(1, 1), (2, 1)]):
        plan = cache.get(JOB, failed)
        assert plan is not None and plan.failed == sorted(failed)
        check(plan)
    # A worse plan never replaces a better one; a better one does.
    best = cache.get(JOB, [(2, 0)])
    worse = solve(JOB, [(2, 0)], "1f1b")
    assert worse.metrics.period > best.metrics.period
    assert not cache.put(worse, Mode())
    reopened = PlanCache(str(tmp_path / "plans.sqlite"))
    assert reopened.get(JOB, [(2, 0)]).metrics.period == best.metrics.period


def test_gantt():  # CSV export: tests/test_interop.py
    p = _plan()
    svg = render_svg(p)
    assert svg.count("replica ") >= JOB.replicas * JOB.stages
    assert "FAILED" in svg and 'fill="url(#hatch)"' in svg  # re-routed micro-batches marked


def test_plan_json_round_trip():
    p = _plan()
    assert Plan.from_json(p.to_json()) == p
    assert p.model_dump(mode="json")["format"] == "recycle.plan/v1"
    assert p.routes[1 * JOB.microbatches][1] != 1  # micro-batch of replica 1 re-routed at stage 1
    assert isinstance(p.worker(0, 0).actions[0], Action)
