"""Roles (planner/control/roles.py): which live worker fills which slot, and what moving costs.

Property tests over random jobs and live sets: no two workers on one slot, every stage
served while enough workers live, every stage change a move with its bytes, plans with
roles validate, and the count bound stays below every plan on those counts.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.job import JobSpec
from planner.plan import Plan, Role
from planner.control.roles import (NoRolesError, choose_roles, count_bound, elastic_bound, failed_of,
                           live_from_failed, plan_roles)
from planner.simulation.costs import plan_period
from planner.solvers.backends import solve
from planner.validate import check, validate
from tests.strategies import jobs

fast = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def live_sets(draw, min_d=2):
    job = draw(jobs(max_d=4, max_s=4, max_m=3))
    if job.replicas < min_d:
        job = job.model_copy(update={"replicas": min_d})
        job = JobSpec.model_validate(job.model_dump())
    job = JobSpec.model_validate({**job.model_dump(), "bandwidth": draw(st.sampled_from([1.0, 50.0])),
                                  "state_bytes": draw(st.lists(st.integers(0, 500), min_size=job.stages,
                                                               max_size=job.stages))})
    cells = [(d, s) for d in range(job.replicas) for s in range(job.stages)]
    alive = draw(st.lists(st.sampled_from(cells), unique=True, min_size=job.stages))
    live = {f"{d}.{s}": (d, s) for d, s in alive}
    for k in range(draw(st.integers(0, 3))):
        if len(live) < len(cells):
            live[f"new{k}"] = None
    return job, live, draw(st.sampled_from([0.0, 50.0, 1e9]))


@fast
@given(live_sets())
def test_roles_fill_distinct_slots_serve_every_stage_and_account_every_move(case):
    job, live, horizon = case
    a = choose_roles(job, live, horizon, lambda f: plan_period(job, f))
    slots = [(r.replica, r.stage) for r in a.roles]
    assert len(set(slots)) == len(slots)  # no two workers on one slot
    assert sorted(r.worker for r in a.roles) == sorted(live)  # every live worker has one
    assert {s for _, s in slots} == set(range(job.stages))  # every stage served
    assert a.failed == failed_of(a.roles, job.replicas, job.stages)
    assert a.counts == [sum(1 for _, s in slots if s == t) for t in range(job.stages)]
    new_stage = {r.worker: r.stage for r in a.roles}
    changed = {w for w, slot in live.items() if slot is None or slot[1] != new_stage[w]}
    assert {m.worker for m in a.moves} == changed  # every stage change is a move, once
    for m in a.moves:
        assert m.from_stage == (None if live[m.worker] is None else live[m.worker][1])
        assert m.to_stage == new_stage[m.worker]
        assert m.bytes == job.state_bytes[m.to_stage]
        # a stage nobody held is loaded from its snapshot, the others from a live peer
        held = any(slot is not None and slot[1] == m.to_stage for slot in live.values())
        if m.source == "snapshot":
            assert not held
    # a plan with these roles validates
    plan = solve(job, a.failed, "greedy").with_roles(a.roles, a.moves)
    assert validate(plan) == []
    assert Plan.from_json(plan.to_json()) == plan


@fast
@given(live_sets())
def test_no_move_without_gain_and_a_zero_horizon_moves_nobody_it_need_not(case):
    job, live, _ = case
    a = choose_roles(job, live, 0.0, lambda f: plan_period(job, f))
    # with nothing to gain before the next event, only an emptied stage forces a move
    held = {slot[1] for slot in live.values() if slot is not None}
    fresh = sum(1 for v in live.values() if v is None)
    shifted = [m for m in a.moves if m.from_stage is not None]
    empty = job.stages - len(held)
    assert len(shifted) <= max(0, empty - fresh)


@fast
@given(live_sets())
def test_the_count_bound_holds_for_every_plan_on_those_counts(case):
    job, live, horizon = case
    a = choose_roles(job, live, horizon)
    plan = solve(job, a.failed, "greedy")
    assert count_bound(job, a.counts) <= lower_bound(job, a.failed) or \
        count_bound(job, a.counts) <= plan.metrics.period
    assert count_bound(job, a.counts) <= plan.metrics.period
    assert elastic_bound(job, len(live)) <= plan.metrics.period


def test_moves_go_from_the_strongest_stages_to_the_weakest():
    job = JobSpec.uniform(4, 4, 8).model_copy(update={"state_bytes": [100] * 4, "bandwidth": 10.0})
    live = live_from_failed(job, [(0, 1), (1, 1), (2, 1)])
    a = choose_roles(job, live, horizon=10_000, period=lambda f: plan_period(job, f))
    assert a.counts == [3, 3, 3, 4] or sorted(a.counts) == [3, 3, 3, 4]
    assert min(a.counts) == 3 and len(a.moves) == 2
    assert all(m.to_stage == 1 and m.source == "peer" and m.bytes == 100 for m in a.moves)
    assert a.stall == 10  # 100 bytes at 10 a time unit, loaded in parallel
    # ... but not when the next event comes before the move pays off
    b = choose_roles(job, live, horizon=5, period=lambda f: plan_period(job, f))
    assert b.moves == [] and b.counts[1] == 1


def test_a_stage_with_no_live_worker_gets_one_from_its_snapshot():
    job = JobSpec.uniform(2, 3, 4)
    live = live_from_failed(job, [(0, 2), (1, 2)])
    a = choose_roles(job, live, horizon=0)
    assert a.counts[2] == 1
    assert [(m.to_stage, m.source) for m in a.moves] == [(2, "snapshot")]


def test_a_new_nodes_workers_go_where_they_help_most():
    job = JobSpec.uniform(3, 3, 4)
    live = live_from_failed(job, [(0, 1), (1, 1)], fresh=("n0",))
    a = choose_roles(job, live, horizon=0)
    assert dict((r.worker, r.stage) for r in a.roles)["n0"] == 1


def test_too_few_workers_is_no_roles():
    job = JobSpec.uniform(2, 3, 2)
    with pytest.raises(NoRolesError):
        choose_roles(job, {"0.0": (0, 0), "0.1": (0, 1)}, 1.0)


def test_validator_catches_bad_roles_and_moves():
    job = JobSpec.uniform(2, 2, 2).model_copy(update={"state_bytes": [7, 9], "bandwidth": 1.0})
    plan, a = plan_roles(job, live_from_failed(job, [(0, 1), (1, 1)]), horizon=1e9)
    check(plan)
    assert plan.moves and plan.moves[0].bytes == 9
    twice = plan.model_copy(update={"roles": plan.roles + [Role(worker="x", replica=plan.roles[0].replica,
                                                                stage=plan.roles[0].stage)]})
    assert any("both fill" in e for e in validate(twice))
    wrong = plan.model_copy(update={"moves": [plan.moves[0].model_copy(update={"bytes": 1})]})
    assert any("carries 1 bytes" in e for e in validate(wrong))
    missing = plan.model_copy(update={"roles": plan.roles[1:]})
    assert any("empty" in e for e in validate(missing))


def test_plans_without_roles_serialise_as_before():
    job = JobSpec.uniform(2, 2, 2)
    plan = solve(job, [(0, 1)], "greedy")
    text = plan.to_json()
    assert '"roles"' not in text and '"moves"' not in text
    assert '"state_bytes"' not in job.model_dump_json()
    assert Plan.from_json(text).roles is None


def test_the_cache_stores_a_plan_with_roles_as_its_schedule_and_serves_it_for_other_roles():
    from planner.cache import PlanCache

    job = JobSpec.uniform(3, 2, 2)
    plan, a = plan_roles(job, live_from_failed(job, [(1, 1), (2, 1)], fresh=("n0",)), horizon=1e9)
    cache = PlanCache()
    assert cache.put(plan)
    got = cache.get(job, a.failed)
    assert got is not None and got.roles is None and got.routes == plan.routes
    other = [r.model_copy(update={"worker": f"w{i}"}) for i, r in enumerate(plan.roles)]
    check(got.with_roles(other))


def test_gantt_names_the_worker_in_each_slot_and_its_move():
    from planner.gantt import render_svg

    job = JobSpec.uniform(3, 2, 2).model_copy(update={"state_bytes": [5, 6], "bandwidth": 1.0})
    plan, a = plan_roles(job, live_from_failed(job, [(1, 1), (2, 1)]), horizon=1e9)
    svg = render_svg(plan)
    mover = a.moves[0].worker
    assert f"{mover} (moved from stage 0, 6 bytes from peer)" in svg
    assert "moves: 1" in svg
    assert "moved from" not in render_svg(solve(job, [(1, 1)], "greedy"))


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_the_exact_back_ends_plan_the_chosen_slots_and_keep_the_roles(solver):
    job = JobSpec.uniform(2, 2, 1).model_copy(update={"state_bytes": [3, 4], "bandwidth": 1.0})
    plan, a = plan_roles(job, live_from_failed(job, [(0, 1), (1, 0)], fresh=("n",)), 1e9,
                         solver=solver)
    check(plan)
    assert plan.solver.name == solver and plan.roles == sorted(a.roles, key=lambda r: (r.replica, r.stage))
    assert plan.metrics.period >= count_bound(job, a.counts)
