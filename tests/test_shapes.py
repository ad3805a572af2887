"""Shapes (planner/shapes/): the balanced partition against brute force, the memory bound,
the shape choice and its transition cost, the partition a plan carries."""
import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from planner.job import JobSpec
from planner.shapes.choose import ShapeChooser
from planner.shapes.partition import Partition, balance, minimax, ranges, stage_sums
from planner.shapes.shape import family, fitted, replicas_for, shaped_job
from planner.shapes.transition import missing, transport
from planner.shapes.units import Unit, Units, units_of_job


def cuts(n, k):
    """Every split of n units into k non-empty contiguous ranges, as bounds."""
    for inner in itertools.combinations(range(1, n), k - 1):
        yield (0, *inner, n)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=8), st.data())
def test_balance_is_optimal_against_brute_force_under_a_memory_bound(costs, data):
    n = len(costs)
    k = data.draw(st.integers(1, n))
    size = data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    cap = data.draw(st.integers(0, sum(size) + 1))

    def fits(i, j):
        return sum(size[i:j]) <= cap

    def key(b):
        sums = stage_sums(costs, b)
        return max(sums), sum(c * c for c in sums)

    feasible = [b for b in cuts(n, k) if all(fits(i, j) for i, j in ranges(b))]
    got = balance(costs, k, fits)
    if not feasible:
        assert got is None
        return
    assert got is not None and got[0] == 0 and got[-1] == n and len(got) == k + 1
    assert all(a < b for a, b in zip(got, got[1:]))
    assert all(fits(i, j) for i, j in ranges(got)), "the memory bound"
    assert key(got) == min(key(b) for b in feasible)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=7), st.data())
def test_minimax_is_optimal_against_brute_force(costs, data):
    n = len(costs)
    k = data.draw(st.integers(1, n))
    weight = data.draw(st.lists(st.integers(1, 4), min_size=k, max_size=k))
    banned = data.draw(st.sets(st.tuples(st.integers(0, n), st.integers(0, n)), max_size=4))

    def value(s, i, j):  # depends on the stage as well as the range, as fitted's does
        return None if (i, j) in banned else sum(costs[i:j]) / weight[s] + (k - s)

    def worst(b):
        vs = [value(s, i, j) for s, (i, j) in enumerate(ranges(b))]
        return None if None in vs else max(vs)

    options = [w for w in map(worst, cuts(n, k)) if w is not None]
    # with a floor (a lower bound on value that grows with j) the search stops early
    floor = (lambda s, i, j: sum(costs[i:j]) / weight[s]) if data.draw(st.booleans()) else None
    got = minimax(n, k, value, floor)
    if not options:
        assert got is None
        return
    assert got is not None and worst(got[0]) == pytest.approx(got[1])
    assert got[1] == pytest.approx(min(options))


def preset_like(layers=8, capacity=100.0, params=10.0, act=5.0, state=1e9):
    """Units of a small model: an embedding, equal layers, a costlier head."""
    layer = Unit(F=10, I=10, W=8, OPT=2, activation=act, params=params, state_bytes=state)
    edge = Unit(F=0, I=0, W=0, OPT=2, activation=1, params=params, state_bytes=state)
    head = Unit(F=15, I=15, W=15, OPT=2, activation=act, params=params, state_bytes=state)
    units = (edge,) + (layer,) * layers + (head,)
    return units, capacity


def job_of(units, capacity, D, S, M, bandwidth=None):
    """A D x S job whose stages are `balance`'s cut of the units (as a preset's)."""
    b = balance([u.work for u in units], S)
    base = JobSpec.uniform(D, S, M, activation=None, capacity=None)
    u = Units(units, "layer", b, capacity, 1)
    job = shaped_job(base.model_copy(update={"replicas": D, "microbatches": M}), u, b)
    job = job.model_copy(update={"replicas": D, "microbatches": M, "bandwidth": bandwidth})
    return job, Units(units, "layer", b, capacity, 1)


def test_every_shape_fits_a_worker_and_too_shallow_ones_are_left_out():
    units, cap = preset_like(layers=8, capacity=60.0)  # ~4 units a worker at most
    job, u = job_of(units, cap, 2, 5, 4)
    fam = family(job, u)
    assert fam[0].fixed and fam[0].job is job
    for shape in fam:
        for i, j in shape.ranges():
            held = sum(x.params + x.activation for x in units[i:j])
            assert held <= cap, (shape.bounds, i, j)
        mem = shape.job.memory
        assert all(c >= a for a, c in zip(mem.activation, mem.capacity))
        assert shape.job.num_microbatches == job.num_microbatches  # the global batch
        assert shape.job.replicas * shape.stages >= job.replicas * job.stages
    # 10 units of 15 each (params + activation) cannot go in fewer than 3 stages of 60
    assert min(s.stages for s in fam) == 3
    assert balance([x.work for x in units], 2, u.fits) is None


def test_units_of_a_profiled_job_are_its_layers_and_sum_to_its_stages():
    from executor.models.balance import balanced_boundaries

    lc = [3, 9, 11, 8, 10, 12, 7, 20]  # [embedding, 6 blocks, head]
    spec = JobSpec.uniform(2, 3, 4).model_copy(update={
        "layer_cost": lc, "cost": JobSpec.uniform(2, 3, 4).cost.model_copy(
            update={"F": [12, 20, 15], "W": [7, 9, 8]}),
        "state_bytes": [300, 600, 900], "bandwidth": 10.0})
    u = units_of_job(spec)
    assert u.kind == "layer" and len(u.units) == len(lc)
    # the fixed cut is the one `--split balanced` trains (first block of stages 1..S-1)
    assert tuple(b - 1 for b in u.fixed[1:-1]) == balanced_boundaries(lc, 3)
    for s, (i, j) in enumerate(ranges(u.fixed)):
        assert sum(x.F for x in u.units[i:j]) == pytest.approx(spec.cost.F[s])
        assert sum(x.W for x in u.units[i:j]) == pytest.approx(spec.cost.W[s])
        assert sum(x.state_bytes for x in u.units[i:j]) == pytest.approx(spec.state_bytes[s])
    # without layer costs the stages are the units; a spec's shapes merge at most 2 stages
    plain = units_of_job(JobSpec.uniform(2, 6, 4))
    assert plain.kind == "stage" and plain.fixed == tuple(range(7)) and plain.min_stages == 3


def test_missing_bytes_and_the_transport_against_brute_force():
    state = [0, 10, 30, 60, 100]  # prefix sums of 4 units' bytes: 10, 20, 30, 40
    assert missing(state, None, (1, 3)) == 50
    assert missing(state, (0, 2), (1, 3)) == 30  # holds unit 1, lacks unit 2
    assert missing(state, (0, 4), (2, 4)) == 0
    supply, demand = [2, 1, 3], [3, 2]
    stall = [[5, 1], [2, 7], [4, 4]]
    cost = [[50, 10], [20, 70], [40, 40]]
    x = transport(supply, demand, stall, cost)
    assert [sum(col) for col in zip(*x)] == demand
    assert all(sum(row) <= s for row, s in zip(x, supply))
    worst = max(stall[g][k] for g in range(3) for k in range(2) if x[g][k])
    best, cheapest = None, None
    for a in itertools.product(range(3), repeat=5):  # each of 5 slots from a group
        use = [a.count(g) for g in range(3)]
        if any(u > s for u, s in zip(use, supply)):
            continue
        ks = [0, 0, 0, 1, 1]
        w = max(stall[g][k] for g, k in zip(a, ks))
        c = sum(cost[g][k] for g, k in zip(a, ks))
        best = min(best or (w, c), (w, c))
        cheapest = min(cheapest or c, c)
    total = sum(cost[g][k] * x[g][k] for g in range(3) for k in range(2))
    assert (worst, total) == best
    # screening (bottleneck=False): the fewest bytes, whatever the largest stall
    y = transport(supply, demand, stall, cost, bottleneck=False)
    assert sum(cost[g][k] * y[g][k] for g in range(3) for k in range(2)) == cheapest


def chooser_for(bandwidth, D=2, S=6, M=4):
    units, cap = preset_like(layers=10, capacity=1e9, state=1e9)
    job, u = job_of(units, cap, D, S, M, bandwidth)
    return job, ShapeChooser(job, u)


def test_fewer_live_workers_than_stages_take_a_shallower_shape():
    job, ch = chooser_for(bandwidth=1e9)
    live = {f"0.{s}": (0, s) for s in range(4)}  # 4 of 12 workers, stages 4 and 5 gone
    c = ch.choose(ch.fixed, live, horizon=1e6)
    assert c.changed and c.shape.stages <= 4 and sorted(c.slots.values()) == sorted(live)
    assert "cannot fill 6 stages" in c.reason
    # every worker loads what its new stage holds and it does not
    for m in c.moves:
        held = ch.fixed.ranges()[m.from_stage]
        assert m.bytes == pytest.approx(missing(ch._state, held, c.shape.ranges()[m.to_stage]))


def test_the_shape_changes_only_when_the_time_saved_repays_the_moves():
    """Eight of twelve workers live, every stage still held: another shape is faster, and
    is taken when its loads are cheap against the horizon, not when they are dear."""
    live = {f"{d}.{s}": (d, s) for d in range(2) for s in range(6) if (d, s) not in
            ((1, 0), (1, 1), (1, 2), (1, 3))}
    H = 3e4  # time units to the next event
    job, cheap = chooser_for(bandwidth=1e9)  # a unit's 1 GB in one time unit
    c = cheap.choose(cheap.fixed, live, horizon=H)
    assert c.changed, c.options
    stay = next(o for o in c.options if o.current)
    assert c.period < stay.period  # the gain that pays for the change
    # the same choice with each GB taking 1e4 units: the loads outweigh the gain
    _, dear = chooser_for(bandwidth=1e5)
    d = dear.choose(dear.fixed, live, horizon=H)
    assert not d.changed and d.shape is dear.fixed
    kept = next(o for o in d.options if o.current)
    faster = [o for o in d.options if not o.current and o.period < kept.period]
    assert faster and all(o.stall > 0 and o.value < kept.value for o in faster)
    # and a horizon long enough repays even the dear loads
    assert dear.choose(dear.fixed, live, horizon=1e9).changed


def test_a_shape_is_not_priced_when_its_bound_cannot_win():
    """The choice skips a shape whose least possible period, with no stall, is worth less
    than the best so far (what keeps it to milliseconds at thousands of workers)."""
    job, ch = chooser_for(bandwidth=1e9, D=4)
    live = {f"{d}.{s}": (d, s) for d in range(4) for s in range(6)}
    c = ch.choose(ch.fixed, live, horizon=1e6)
    assert len(c.options) < len(ch.candidates(len(live)))


def test_fitted_cut_gives_the_stage_with_more_workers_more_units():
    units, cap = preset_like(layers=12, capacity=1e9)
    job, u = job_of(units, cap, 3, 4, 4)
    even = fitted(job, u, (2, 2, 2, 2))
    more = fitted(job, u, (3, 2, 2, 2))
    lens = lambda b: [j - i for i, j in ranges(b)]
    assert lens(more)[0] > lens(even)[0]
    assert replicas_for(job, 4) * 4 >= job.replicas * job.stages


def test_partition_on_a_plan_and_in_the_cache_key(tmp_path):
    from planner.cache import PlanCache
    from planner.plan import Plan
    from planner.solvers.backends import solve

    with pytest.raises(ValueError):
        Partition(unit="layer", bounds=[0, 3, 3, 5], base="abc")
    with pytest.raises(ValueError):
        Partition(unit="layer", bounds=[1, 5], base="abc")
    job, ch = chooser_for(bandwidth=1e9)
    shape = next(s for s in ch.family if s.stages == 3)
    part = shape.partition(job, ch.units)
    assert part.stages == 3 and part.base == job.identity_hash()
    plan = solve(shape.job, [], "greedy")
    assert "partition" not in plan.to_json()  # unset: the JSON of before
    shaped = plan.model_copy(update={"partition": part})
    back = Plan.from_json(shaped.to_json())
    assert back.partition == part
    cache = PlanCache(str(tmp_path / "c.sqlite"))
    cache.put(shaped)
    assert cache.get(shape.job, []) is None  # no partition asked: another key
    got = cache.get(shape.job, [], partition=part)
    assert got is not None and got.partition == part
    other = Partition(unit="layer", bounds=[0, 1, 2, len(ch.units.units)], base=part.base)
    assert cache.get(shape.job, [], partition=other) is None


def test_recycle_plan_says_which_shape_and_plans_it_on_request(tmp_path):
    import json
    import os

    from typer.testing import CliRunner

    from planner.plan import Plan
    from planner.validate import validate
    from recycle.cli import app

    spec = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "job.json")
    run = CliRunner().invoke
    r = run(app, ["plan", spec, "--fail", "1:2"])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith("shape: 3 stages instead of 4 (job stages 0 | 1-2 | 3)")
    assert "period 290 against 313 on 4 stages" in first
    assert "failed: 1:2" in r.output  # the plan printed is still the job's own shape
    assert not run(app, ["plan", spec]).output.startswith("shape:")  # no failure, no line
    r = run(app, ["plan", spec, "--fail", "1:2", "--json"])
    assert "partition" not in json.loads(r.output)  # JSON alone, as before
    out = tmp_path / "p.json"
    r = run(app, ["plan", spec, "--fail", "1:2", "--shape", "auto", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = Plan.load(str(out))
    assert plan.partition.bounds == [0, 1, 3, 4] and plan.job.stages == 3
    assert plan.job.num_microbatches == 32 and validate(plan) == []
    everyone = {f"{d}.{s}" for d in range(4) for s in range(4)}
    assert {r.worker for r in plan.roles} == everyone - {"1.2"}
    # a worker whose new stage holds job stages 1-2 loads the one it lacks: 0 bytes (the
    # spec prices no state) but named, for the runtime
    for m in plan.moves:
        assert m.to_stage == 1 and m.from_stage in (1, 2) and m.bytes == 0
    assert len(plan.moves) == sum(1 for r in plan.roles if r.stage == 1)
