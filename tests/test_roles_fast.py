"""The fast role choice (planner/control/roles.py, count_bounds.py: a heap and a memo for
the best counts, a bisection for the counts a stage needs, one pass over the workers per
candidate, Roles built for the chosen candidate only) chooses what the plain rule chooses
(tests/roles_reference.py): the same roles, moves, failed set and counts, on random
memberships, workers moved off their home slots and fresh ones among them."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.control import roles as fast
from planner.job import JobSpec
from tests import roles_reference as plain
from tests.strategies import jobs

many = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def memberships(draw):
    if draw(st.booleans()):
        job = draw(jobs(max_d=5, max_s=5, max_m=3, speed=True))
    else:  # bigger uniform grids, where the heap and the bisection have room to differ
        job = JobSpec.uniform(draw(st.integers(2, 24)), draw(st.integers(1, 8)),
                              draw(st.integers(1, 4)))
    if draw(st.booleans()):
        job = job.model_copy(update={"bandwidth": 10.0, "state_bytes": draw(st.lists(
            st.integers(0, 300), min_size=job.stages, max_size=job.stages))})
    D, S = job.replicas, job.stages
    cells = [(d, s) for d in range(D) for s in range(S)]
    ids = draw(st.permutations(cells))  # who fills which slot: moved workers included
    filled = draw(st.lists(st.sampled_from(cells), unique=True, max_size=len(cells)))
    live = {f"{w[0]}.{w[1]}": slot for w, slot in zip(ids, filled)}
    for w in draw(st.lists(st.sampled_from(cells), unique=True, max_size=4)):
        live.setdefault(f"{w[0]}.{w[1]}", None)  # back with no state
    for k in range(draw(st.integers(0, 2))):
        if len(live) < len(cells):  # the grid is the job's capacity
            live[f"new{k}"] = None  # a new node's worker with no home in the grid
    horizon = draw(st.sampled_from([0.0, 30.0, 1e4, 1e9]))
    return job, live, horizon, draw(st.booleans()), draw(st.booleans())


def _period(failed):
    """A planner-like period that depends on which slots are empty, not only how many."""
    return 100 + 7 * len(failed) + sum(3 * d + s for d, s in failed) % 13


@many
@given(memberships())
def test_the_fast_choice_is_the_plain_rules_choice(case):
    job, live, horizon, snapshots, with_period = case
    period = _period if with_period else None
    if len(live) < job.stages:
        for choose in (fast.choose_roles, plain.choose_roles):
            try:
                choose(job, live, horizon, period, snapshots=snapshots)
            except fast.NoRolesError:
                continue
            raise AssertionError("fewer live workers than stages got roles")
        return
    a = fast.choose_roles(job, live, horizon, period, snapshots=snapshots)
    roles, moves, failed, counts, p, bound, stall = plain.choose_roles(
        job, live, horizon, period, snapshots=snapshots)
    assert a.roles == roles
    assert a.moves == moves
    assert (a.failed, a.counts, a.period, a.bound, a.stall) == (failed, counts, p, bound, stall)
    assert a.slots == {(r.replica, r.stage): r.worker for r in roles}


@many
@given(jobs(max_d=6, max_s=6, max_m=3, speed=True), st.booleans())
def test_the_best_counts_are_the_plain_loops_for_every_live_count(job, balance):
    chains = [0] * job.stages if balance else None
    for n in range(job.stages, job.replicas * job.stages + 2):
        assert fast.best_counts(job, n, chains) == plain.best_counts(job, n, chains)
        assert fast.best_counts(job, n, chains) == plain.best_counts(job, n, chains)  # memo
