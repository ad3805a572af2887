"""Roles weigh the risk of a halt (planner/control/halt_risk.py, docs/design.md section
11 "Safe by default"): a stage with one copy and no snapshot costs its expected halt, and
a returning worker goes home unless elsewhere is clearly better."""
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.control.elastic import LOCAL_HORIZON
from planner.control.halt_risk import (HOME_MARGIN, expected_work, one_copy_stages,
                                       with_home_margin)
from planner.control.membership import Membership, Publish
from planner.control.roles import (_home, _stay_counts, choose_roles, count_bound,
                                   move_stall, place)
from planner.job import Cost, JobSpec
from planner.plan import home_of
from tests.test_roles import fast, live_sets


def test_expected_work_is_the_plain_rate_with_nothing_at_risk_and_falls_with_risk():
    assert expected_work(1000, 100, 10, 0, 6) == 90.0
    assert expected_work(1000, 1000, 10, 2, 6) == 0.0 and expected_work(0, 0, 10, 0, 6) == 0.0
    one, two = expected_work(1000, 0, 10, 1, 6), expected_work(1000, 0, 10, 2, 6)
    assert two < one < 100.0
    # one stage at risk among 6 live workers: the survival integral (1 - e^-1/6) * 6
    assert math.isclose(one, 100 * 6 * (1 - math.exp(-1 / 6)))
    assert one_copy_stages([1, 2, 1], snapshots=False) == 2
    assert one_copy_stages([1, 2, 1], snapshots=True) == 0
    assert with_home_margin(105.0, 1) == 100.0 and with_home_margin(105.0, 0) == 105.0


def _heavy_last_stage(f2: int) -> JobSpec:
    job = JobSpec.uniform(3, 3, 4)
    return job.model_copy(update={"cost": Cost(F=[10, 10, f2], I=[10, 10, f2], W=[8] * 3,
                                               OPT=[5] * 3)})


def test_a_move_that_leaves_one_copy_must_gain_more_than_the_halt_risk():
    # counts [2, 2, 2] -> [2, 1, 3] gains 7% (bound 365 -> 341) and leaves stage 1 one copy
    job = _heavy_last_stage(26)
    live = {f"{d}.{s}": (d, s) for d in range(2) for s in range(3)}
    assert count_bound(job, [2, 1, 3]) < count_bound(job, [2, 2, 2])
    assert choose_roles(job, live, LOCAL_HORIZON, snapshots=True).counts == [2, 1, 3]
    assert choose_roles(job, live, LOCAL_HORIZON, snapshots=False).counts == [2, 2, 2]
    # a gain well above the risk still moves
    job = _heavy_last_stage(32)
    assert choose_roles(job, live, LOCAL_HORIZON, snapshots=False).counts == [2, 1, 3]


def test_a_returning_worker_goes_home_when_elsewhere_is_no_better():
    # replica 1 dead, 1.2 back: stage 0 has the highest count bound but any 4-worker
    # counts give the same period; home keeps stage 2 from being one death from a halt
    job = JobSpec.uniform(2, 3, 4)
    live = {"0.0": (0, 0), "0.1": (0, 1), "0.2": (0, 2), "1.2": None}
    for snapshots in (False, True):
        a = choose_roles(job, live, LOCAL_HORIZON, snapshots=snapshots)
        assert {r.worker: (r.replica, r.stage) for r in a.roles}["1.2"] == (1, 2)


KILLS = {1: [(1, 2)], 2: [(1, 1)], 3: [(1, 0)], 4: [(0, 2)], 7: [(0, 0)], 8: [(1, 2)]}
REJOINS = {4: [(1, 2)], 6: [(1, 0), (0, 2)], 9: [(1, 2)]}


def test_the_users_kill_and_rejoin_sequence_never_leaves_stage_2_one_copy_nor_halts():
    # recycle train -d 2 -s 3 -m 4 --iterations 12 at default flags (no snapshots), with
    # the kills and rejoins of issue 31; rejoins are admitted before their iteration's kills
    job = JobSpec.uniform(2, 3, 4)
    m, d = Membership.start(2, 3, job=job, horizon=LOCAL_HORIZON).first()
    for it in range(12):
        m = m.entered(m.version)
        for kind, w in [("rejoin", w) for w in REJOINS.get(it, [])] + \
                       [("kill", w) for w in KILLS.get(it, [])]:
            m, d = m.recover(w) if kind == "rejoin" else m.fail(w)
            assert isinstance(d, Publish), (it, kind, w, d)
            holders = ([home_of(r.worker) for r in d.roles if r.stage == 2]
                       if d.roles is not None else [x for x in m.live() if x[1] == 2])
            homes = [x for x in m.live() if x[1] == 2]  # the fixed-role design's copies
            assert len(holders) >= len(homes), (it, kind, w, d)
    assert m.state == "running"


@st.composite
def memberships(draw):
    job, live, horizon = draw(live_sets())
    # fresh workers named by home slot, as membership.py names them
    dead = [(d, s) for d in range(job.replicas) for s in range(job.stages)
            if f"{d}.{s}" not in live]
    live = {w: slot for w, slot in live.items() if slot is not None}
    for w in draw(st.lists(st.sampled_from(dead), unique=True, max_size=3)) if dead else []:
        live[f"{w[0]}.{w[1]}"] = None
    return job, live, horizon, draw(st.booleans())


@fast
@given(memberships())
def test_the_choice_beats_sending_every_returning_worker_home(case):
    """Whatever is chosen is worth at least the all-home assignment with its halt risk
    counted, and HOME_MARGIN more when it sends a returning worker elsewhere."""
    job, live, horizon, snapshots = case
    if len(live) < job.stages:
        return
    a = choose_roles(job, live, horizon, snapshots=snapshots)
    have = [0] * job.stages
    for slot in live.values():
        if slot is not None:
            have[slot[1]] += 1
    homes = {w: _home(w, job)[1] for w, slot in live.items() if slot is None}
    home_counts = _stay_counts(job, have, sorted(homes.values()))
    if any(home_counts[s] != have[s] + sum(1 for h in homes.values() if h == s)
           for s in range(job.stages)):
        return  # some stage needs a forced move or a home stage is full: no all-home option
    n = len(live)
    roles, moves = place(job, live, home_counts)
    assert all(r.stage == homes[r.worker] for r in roles if r.worker in homes)
    home_value = expected_work(horizon, move_stall(job, moves), count_bound(job, home_counts),
                               one_copy_stages(home_counts, snapshots), n)
    value = expected_work(horizon, a.stall, a.period, one_copy_stages(a.counts, snapshots), n)
    strays = sum(1 for r in a.roles if r.worker in homes and r.stage != homes[r.worker])
    need = home_value * ((1 + HOME_MARGIN) if strays else 1.0)
    assert value >= need * (1 - 1e-9), (a.counts, home_counts, value, home_value)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 4), st.integers(2, 4), st.data())
def test_random_kills_and_rejoins_without_snapshots_leave_no_more_one_copy_stages_than_fixed(
        D, S, data):
    """No plan of a run without snapshots (a uniform job, moves free: `recycle train`)
    leaves more stages one death from a halt than the fixed-role design would at the same
    live set: moves rebalance the stages, they do not spend their last copies."""
    job = JobSpec.uniform(D, S, 2 * D)
    m, _ = Membership.start(D, S, job=job, horizon=LOCAL_HORIZON).first()
    for _ in range(data.draw(st.integers(1, 12))):
        m = m.entered(m.version)
        dead = sorted(m.failed)
        if dead and data.draw(st.booleans()):
            m, d = m.recover(data.draw(st.sampled_from(dead)))
        else:
            m, d = m.fail(data.draw(st.sampled_from(m.live())))
        if not isinstance(d, Publish):
            return
        fixed = [sum(1 for x in m.live() if x[1] == s) for s in range(S)]
        if 0 in fixed:
            continue  # fixed roles would have halted here
        slots = ({(r.replica, r.stage) for r in d.roles} if d.roles is not None
                 else set(m.live()))
        counts = [sum(1 for x in slots if x[1] == s) for s in range(S)]
        assert one_copy_stages(counts, False) <= one_copy_stages(fixed, False), (counts, fixed)
