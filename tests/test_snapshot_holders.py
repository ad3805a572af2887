"""Who holds each stage's peer-memory snapshot (planner/control/snapshot_holders.py).

Properties over random live sets and machine layouts: every stage gets a holder whenever a
live worker of another stage exists, never one of its own workers, on a machine without
the stage whenever one is live, with the least possible load on the busiest holder, and
the same answer whatever order the roles come in.
"""
import random
from itertools import product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.control.roles import identity_roles
from planner.control.snapshot_holders import (home_slot, node_of_workers, plan_holders,
                                              snapshot_holders)
from planner.job import JobSpec
from planner.plan import Role
from planner.solvers.backends import solve

fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def layouts(draw):
    """Roles of a random live set (some workers moved to other stages, some named new
    workers), and a machine layout (per replica, or G GPUs per machine)."""
    D, S = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    cells = [(d, s) for d in range(D) for s in range(S)]
    alive = draw(st.lists(st.sampled_from(cells), unique=True, min_size=1))
    roles = []
    for k, (d, s) in enumerate(alive):
        name = f"{d}.{s}" if not draw(st.booleans()) or k % 3 else f"new{k}"
        roles.append(Role(worker=name, replica=d, stage=s))  # its slot's stage (moved or not)
    G = draw(st.sampled_from([None, 1, 2, 3]))
    return roles, S, G


def _best_load(roles, S, node_of):
    """Brute force: the least busiest-holder load over every choice in the best tiers."""
    stage_of = {r.worker: r.stage for r in roles}
    cands = []
    for s in range(S):
        nodes = {node_of(w) for w, t in stage_of.items() if t == s}
        away = [w for w in stage_of if node_of(w) not in nodes]
        tier = away or [w for w, t in stage_of.items() if t != s]
        if tier:
            cands.append(tier)
    size = 1
    for c in cands:
        size *= len(c)
    if size > 20000:
        return None
    best = None
    for choice in product(*cands):
        load = max((choice.count(w) for w in choice), default=0)
        best = load if best is None else min(best, load)
    return best or 0


@fast
@given(layouts())
def test_every_stage_held_away_from_itself_with_least_load(case):
    roles, S, G = case
    node_of = node_of_workers(S, G)
    got = snapshot_holders(roles, S, node_of)
    stage_of = {r.worker: r.stage for r in roles}
    assert set(got) == set(range(S))
    for s, h in got.items():
        others = [w for w, t in stage_of.items() if t != s]
        if not others:
            assert h is None  # nobody but the stage's own workers: no holder helps
            continue
        assert h in stage_of and stage_of[h] != s  # a live worker, never of the stage
        nodes = {node_of(w) for w, t in stage_of.items() if t == s}
        if any(node_of(w) not in nodes for w in stage_of):  # a machine without the stage
            assert node_of(h) not in nodes
    loads = [list(got.values()).count(w) for w in set(got.values()) if w is not None]
    best = _best_load(roles, S, node_of)
    if best is not None:  # (small enough to try every choice)
        assert max(loads, default=0) == best


@fast
@given(layouts(), st.randoms(use_true_random=False))
def test_holders_do_not_depend_on_the_order_of_roles(case, rnd):
    roles, S, G = case
    shuffled = list(roles)
    rnd.shuffle(shuffled)
    node_of = node_of_workers(S, G)
    assert snapshot_holders(shuffled, S, node_of) == snapshot_holders(roles, S, node_of)


def test_full_grids_put_each_snapshot_on_its_own_holder_and_another_machine():
    for D, S in [(2, 2), (1, 3), (3, 4), (4, 8), (2, 16)]:
        job = JobSpec.uniform(D, S, 2)
        got = snapshot_holders(identity_roles(job, []), S)
        assert len(set(got.values())) == S  # a derangement: one snapshot per holder
        assert all(int(h.split(".")[1]) != s for s, h in got.items())
        if D > 1:  # 2 machines or more: the holders are spread over them
            assert len({h.split(".")[0] for h in got.values()}) > 1
    # 4 GPUs per machine, 2x4: machine 0 holds replica 0's stages, machine 1 replica 1's;
    # every stage lives on both machines, so its holder is any worker of another stage
    got = snapshot_holders(identity_roles(JobSpec.uniform(2, 4, 2), []), 4, node_of_workers(4, 4))
    assert all(home_slot(h)[1] != s for s, h in got.items())


def test_a_stage_left_on_one_machine_is_held_on_another():
    job = JobSpec.uniform(2, 2, 2)
    plan = solve(job, [(0, 0)], "greedy")  # stage 0 lives on replica (machine) 1 only
    got = plan_holders(plan)
    assert got[0] == "0.1"  # machine 0 holds no stage-0 worker now
    assert got[1] in ("1.0",)  # stage 1 lives on both machines: a worker of stage 0
    # with roles: worker "1.1" moved to stage 0 in slot (0, 0)
    roles = [Role(worker="1.1", replica=0, stage=0), Role(worker="1.0", replica=1, stage=0),
             Role(worker="0.1", replica=0, stage=1)]
    got = plan_holders(plan.with_roles(roles))
    assert got == {0: "0.1", 1: "1.0"}


def test_random_big_grids_are_fast_and_spread():
    rnd = random.Random(7)
    job = JobSpec.uniform(32, 16, 2)
    cells = [(d, s) for d in range(32) for s in range(16)]
    dead = rnd.sample(cells, 100)
    got = snapshot_holders(identity_roles(job, dead), 16, node_of_workers(16, 8))
    assert all(h is not None for h in got.values())
    assert len(set(got.values())) == 16
