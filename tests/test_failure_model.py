"""Failure models of a dedicated cluster (planner/simulation/failure_model.py): the draws
match the model's rates, scopes and repair times; a hang stalls every policy until its
watchdog fires, announced maintenance loses no work; the per-stage period model of large
grids stays within the planner's own periods."""
import math
import statistics
from collections import Counter

import pytest

from planner.job import JobSpec
from planner.simulation.compare import simulate
from planner.simulation.costs import RecyclePeriods
from planner.simulation.failure_model import (LLAMA3_GPU_HOURS, Cause, FailureModel, preset,
                                              sample)
from planner.simulation.policies import Params
from planner.simulation.trace import Event, Trace, TraceError


def test_the_llama3_preset_is_metas_record():
    m = preset("llama3-405b")
    counts = {c.name: c.count for c in m.causes}
    assert sum(n for name, n in counts.items() if name != "planned maintenance") == 419
    assert counts["planned maintenance"] == 47 and counts["faulty GPU"] == 148
    assert sum(m.expected(16_384, 54 * 24).values()) == pytest.approx(466)
    assert LLAMA3_GPU_HOURS == 16_384 * 1296 and m.hours == 1296
    assert m.source and len(m.assumptions) >= 4  # what the paper does not give is said


def test_draws_match_the_models_rates_scopes_and_repairs():
    """Ten 54-day draws of the Llama 3 model on its 128 x 16 grid of 8-GPU workers: each
    cause's count within 4 standard deviations of rate x GPU-hours (a unit already down is
    not failed again: a few GPU events are dropped), switches take two neighbouring
    workers, a dependency every worker, repairs average the model's means."""
    m = preset("llama3-405b")
    D, S, hours, draws = 128, 16, 1296.0, 10
    seen, repairs = Counter(), {c.name: [] for c in m.causes}
    for seed in range(draws):
        tr = sample(m, D, S, hours, seed)
        failed_at = {}
        for e in tr.events:
            cause = next(c for c in m.causes if c.name == e.cause)
            if e.kind == "fail":
                seen[e.cause] += 1
                if cause.scope == "switch":
                    (r1, s1), (r2, s2) = e.workers
                    assert r1 == r2 and s2 == s1 + 1 and s1 % 2 == 0
                elif cause.scope == "job":
                    assert len(e.workers) >= D * S - 20  # all but those already down
                else:
                    assert len(e.workers) == 1
                assert e.hang_s == (m.watchdog_s if cause.hang else 0.0)
                assert e.planned == cause.planned
                failed_at[e.workers] = e.time
            else:
                repairs[e.cause].append(e.time - failed_at.pop(e.workers))
        assert all(a.time <= b.time for a, b in zip(tr.events, tr.events[1:]))
    for c in m.causes:
        lam = c.rate * D * S * m.gpus_per_worker * hours * draws
        assert abs(seen[c.name] - lam) <= 4 * math.sqrt(lam) + 1, (c.name, seen[c.name], lam)
    for name in ("faulty GPU", "GPU HBM3 memory", "software bug", "planned maintenance"):
        c = next(x for x in m.causes if x.name == name)
        mean_h = statistics.fmean(repairs[name]) / 3600
        n = len(repairs[name])
        assert abs(mean_h - c.repair_h) <= 4 * c.repair_h / math.sqrt(n), (name, mean_h, n)


def test_bad_models_and_lengths_are_refused_in_one_line():
    with pytest.raises(TraceError, match="unknown failure model 'nope'"):
        preset("nope")
    with pytest.raises(TraceError, match="scope 'rack'"):
        FailureModel("x", 1, 1, 60.0, (Cause("c", 1e-3, "rack", 1.0),))
    with pytest.raises(TraceError, match="finite, positive --hours"):
        sample(preset("llama3-405b"), 2, 2, math.inf)


def test_a_hang_stalls_every_policy_until_the_watchdog_and_maintenance_loses_nothing():
    job = JobSpec.uniform(4, 2, 4)
    hang = [Event(1000.0, "fail", ((1, 1),), cause="NCCL watchdog timeout", hang_s=600.0),
            Event(2000.0, "recover", ((1, 1),))]
    crash = [Event(1000.0, "fail", ((1, 1),)), Event(2000.0, "recover", ((1, 1),))]
    pols = ["recycle-roles", "checkpoint-restart", "drop-replica", "limit"]
    params = Params(detect_s=5.0, restart_s=60.0, spares=4)
    got = {name: simulate(job, Trace(ev), 4000.0, 1e-3, params, pols, 300.0, 0.0)
           for name, ev in (("hang", hang), ("crash", crash))}
    for p in pols[:-1]:
        o = got["hang"].outcome(p)
        hung = [(a, b) for a, b, c in o.stall_spans if c == "hang"]
        assert hung == [(pytest.approx(400.0), pytest.approx(1000.0))], (p, o.stall_spans)
        assert o.microbatches < got["crash"].outcome(p).microbatches  # 600 s of waiting
    assert got["hang"].outcome("limit").microbatches == pytest.approx(
        got["crash"].outcome("limit").microbatches)  # no event costs the bound anything
    everyone = tuple((d, s) for d in range(4) for s in range(2))
    for planned in (False, True):
        ev = [Event(1500.0, "fail", everyone, planned=planned),
              Event(2400.0, "recover", everyone)]
        res = simulate(job, Trace(ev), 4000.0, 1e-3, params, ["checkpoint-restart"],
                       1800.0, 0.0)
        lost = res.outcomes[0].lost_by.get("checkpoint", 0.0)
        assert (lost == 0) == planned, (planned, lost)  # drained first: nothing to redo


def test_a_large_grids_periods_planned_on_a_proxy_grid_are_the_whole_grids():
    """At 1,024 workers (64 x 16) the simulator plans a failed set on a proxy grid of the
    failed replicas and enough live peers (costs.RecyclePeriods): the period is the whole
    grid's within 2% (the greedy back-end's own choices differ with the width), for sets of
    1-4 failures across stages, a replica with two failed stages, the first and last
    stages together (where taking the worst stage alone was 4% low)."""
    job = JobSpec.uniform(64, 16, 4)
    rp = RecyclePeriods(job, 1e-3)
    assert rp.proxy
    sets = [{(3, 5)}, {(3, 5), (40, 5)}, {(3, 5), (40, 9)}, {(7, 2), (7, 3), (60, 12)},
            {(1, 0), (2, 15), (3, 7), (4, 7)}, {(1, 0), (2, 15)}]
    for failed in sets:
        f = frozenset(failed)
        assert rp.proxy_width(f) < 64
        assert rp(f) == pytest.approx(rp.exact(f), rel=0.02), sorted(f)
    assert rp(frozenset()) == rp.exact(frozenset())


def test_a_hang_found_after_another_failure_stalls_from_that_failure_on():
    """A hang started at 400 s is found at 1000 s; a crash at 700 s came between. The
    simulation had already run to 700 s, so the hang's stall runs from there (it used to be
    dropped whole when another event fell inside its window)."""
    job = JobSpec.uniform(4, 2, 4)
    ev = [Event(700.0, "fail", ((0, 0),)),
          Event(1000.0, "fail", ((1, 1),), cause="NCCL watchdog timeout", hang_s=600.0)]
    res = simulate(job, Trace(ev), 2000.0, 1e-3, Params(detect_s=5.0), ["recycle-roles"],
                   1e9, 0.0)
    spans = [(round(a), round(b), c) for a, b, c in res.outcomes[0].stall_spans]
    assert (705, 1000, "hang") in spans and (700, 705, "detection") in spans, spans
