"""Pause, never halt, while a worker is due back (issue 42, item 3): a paused membership
(fewer live workers than a plan can use) stays paused through further deaths and returns
until a version serves every stage; it halts only when some stage's state survives in no
tier (live holders, peer-memory snapshots, a disk checkpoint or the seed), naming the stage.
Pure membership transitions (planner/control/membership.py), the driver's rule
(planner/control/timing.py), and the issue's run end to end (real CLI processes)."""
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.control.membership import Halt, Membership, Pause, Publish
from planner.control.timing import Patience, pause_verdict
from planner.job import JobSpec
from planner.solvers.backends import solve

JOB = JobSpec.uniform(2, 3, 4)
# The issue's run (2x3, --shape fixed): the order its events reached the coordinator.
BEFORE_PAUSE = [("fail", (1, 0)), ("fail", (0, 1)), ("fail", (1, 2)), ("recover", (1, 0), 2),
                ("fail", (1, 1)), ("recover", (1, 2), 2), ("fail", (1, 0))]


def run(events, m=None, enter=True, **kw):
    """Drive `events`; with `enter`, every live worker enters each version at once and the
    driver says so after every event (as the coordinator's tick does, paused or not)."""
    if m is None:
        m, d = Membership.start(2, 3, job=JOB, horizon=1e9, pause=True,
                                **{"snapshots": True, **kw}).first()
        assert isinstance(d, Publish)
    out = []
    for kind, w, *inc in events:
        m, d = m.fail(w) if kind == "fail" else m.recover(w, *inc)
        out.append(d)
        if enter:
            m = m.entered(m.version)
    return m, out


def test_the_issues_run_returns_in_any_order_resume_and_never_halt():
    """Paused at 2 then 1 live worker; 1:0 came back (paused, nothing held), the tick said
    every live worker had entered the version in force, and `entered` forgot that 1:0 held
    nothing: the next return counted 2 live workers of 3 and halted."""
    m, ds = run(BEFORE_PAUSE)
    assert all(isinstance(d, Publish) for d in ds), ds
    m, (d1, d2) = run([("fail", (0, 2)), ("fail", (1, 2))], m)
    assert isinstance(d1, Pause) and isinstance(d2, Pause) and m.state == "paused"
    assert d2.reason == "1 live worker cannot serve 3 stages"
    for first, second in [((1, 0), (1, 2)), ((1, 0), (0, 2)), ((0, 2), (1, 2))]:
        incs = {(1, 0): 3, (1, 2): 3, (0, 2): 2}
        p, (a, b) = run([("recover", first, incs[first]), ("recover", second, incs[second])], m)
        assert isinstance(a, Pause) and a.reason == "2 live workers cannot serve 3 stages", a
        assert isinstance(b, Publish) and p.state == "running", (first, second, b)
        assert {x.stage for x in b.roles} == {0, 1, 2}
        assert {x.worker for x in b.roles} == {"0.0", "%d.%d" % first, "%d.%d" % second}
        # both returned workers hold nothing: each joins its stage (from_stage None)
        joins = {x.worker for x in b.moves if x.from_stage is None}
        assert joins == {"%d.%d" % first, "%d.%d" % second}, b.moves
        assert not p.back


def test_deaths_and_returns_while_paused_keep_the_job_paused_until_a_plan_is_possible():
    m, _ = run(BEFORE_PAUSE)
    m, ds = run([("fail", (0, 2)), ("fail", (1, 2)), ("recover", (1, 0), 3),
                 ("fail", (1, 0)),  # a returned worker dies again while paused
                 ("recover", (1, 0), 4), ("recover", (0, 2), 2)], m)
    assert all(isinstance(d, Pause) for d in ds[:-1]), ds
    assert [d.reason for d in ds[:-1]] == [f"{n} live worker{'s' if n > 1 else ''} cannot "
                                           "serve 3 stages" for n in (2, 1, 2, 1, 2)]
    assert m.incarnation((1, 0)) == 4
    # 3 live: 0:0, and 1:0 and 0:2 back with no state
    d = ds[-1]
    assert isinstance(d, Publish), d
    assert {x.worker for x in d.moves if x.from_stage is None} == {"1.0", "0.2"}


def test_every_worker_dead_is_still_a_pause_the_driver_ends_it_when_none_is_due_back():
    m, _ = run(BEFORE_PAUSE)
    m, ds = run([("fail", (0, 2)), ("fail", (1, 2)), ("fail", (0, 0))], m)
    assert all(isinstance(d, Pause) for d in ds) and m.live() == []
    assert ds[-1].reason == "0 live workers cannot serve 3 stages"
    patience = Patience(silent=1, suspect_grace=1, resync_after=1, pause_limit=None)
    assert pause_verdict(m.reason, 5.0, patience, coming_back=True, open_ended=False) is None
    why = pause_verdict(m.reason, 5.0, patience, coming_back=False, open_ended=False)
    assert why == "0 live workers cannot serve 3 stages, and no worker is due back"
    m, ds = run([("recover", (0, 0), 2), ("recover", (0, 1), 2), ("recover", (1, 1), 2)], m)
    assert [type(d) for d in ds] == [Pause, Pause, Publish]
    assert {x.worker for x in ds[-1].moves} == {"0.0", "0.1", "1.1"}


def test_a_newer_process_of_a_live_worker_while_paused_publishes_nothing():
    """Before: a replacement re-stamped the plan in force while paused (a version the
    paused survivors could not train under)."""
    m, _ = run(BEFORE_PAUSE)
    m, _ = run([("fail", (0, 2))], m)
    v = m.version
    m, (d,) = run([("recover", (0, 0), 2)], m)
    assert isinstance(d, Pause) and m.version == v and m.state == "paused"
    assert m.incarnation((0, 0)) == 2 and (0, 0) in m.back  # its new process holds nothing
    m, (d,) = run([("recover", (1, 0), 3)], m)
    assert isinstance(d, Publish)
    assert {x.worker for x in d.moves if x.from_stage is None} == {"0.0", "1.0"}, d.moves


def test_without_a_copy_in_any_tier_fewer_workers_halt_naming_the_stage():
    # no snapshots, no disk tier: 1:1's death leaves 1 live worker and stage 1 with no copy
    job = JobSpec.uniform(1, 3, 2)
    m, _ = Membership.start(1, 3, job=job, pause=True).first()
    m, d = m.fail((0, 1))
    assert isinstance(d, Halt) and d.reason.startswith("stage 1 has no live replica"), d
    assert "\n" not in d.reason and m.state == "halted"


def test_a_disk_tier_makes_a_stage_lost_whole_restorable_without_snapshots():
    m, ds = run([("fail", (0, 1)), ("fail", (1, 1))], snapshots=False, disk=True)
    assert isinstance(ds[-1], Publish), ds  # stage 1 restored (from disk or the seed)
    assert [(x.to_stage, x.source) for x in ds[-1].moves] == [(1, "snapshot")]
    m, ds = run([("fail", (0, 0)), ("fail", (1, 0))], m)
    assert isinstance(ds[-1], Pause), ds  # 2 live of 3 stages: nothing lost, a pause
    m, ds = run([("recover", (0, 0), 2)], m)
    assert isinstance(ds[-1], Publish) and m.state == "running"
    # the default (no disk tier, no snapshots) still halts where it did
    _, ds = run([("fail", (0, 1)), ("fail", (1, 1))], snapshots=False)
    assert isinstance(ds[-1], Halt) and "stage 1 has no live replica" in ds[-1].reason


def test_a_service_restarted_while_paused_still_knows_who_came_back_with_nothing():
    """The service rebuilds a paused job's membership from its latest plan and its row's
    dead workers (Membership.following): a worker back during the pause fills no slot of
    that plan, and holds nothing."""
    m, _ = run(BEFORE_PAUSE, enter=False)
    m, _ = run([("fail", (0, 2)), ("fail", (1, 2)), ("recover", (1, 0), 3)], m, enter=False)
    assert m.state == "paused" and m.back == {(1, 0)}
    plan = solve(JOB, list(m.empty_slots()), "greedy").stamped(m.version, m.incarnations)
    plan = plan.with_roles(list(m.roles), [])
    again = Membership.following(plan, job=JOB, snapshots=True, horizon=1e9, pause=True,
                                 state="paused", reason=m.reason, failed=sorted(m.failed))
    assert again.back == {(1, 0)} and again.failed == m.failed
    again, d = again.entered(again.version).recover((0, 2), 2)
    assert isinstance(d, Publish), d
    assert {x.worker for x in d.moves if x.from_stage is None} == {"1.0", "0.2"}


def test_snapshots_resolved_off_reach_the_membership():
    """--snapshot-every auto is taken as on until the workers choose K; auto may choose
    off: then a stage lost whole has no copy (no disk tier) and the run halts naming it,
    instead of planning a restore from a snapshot nobody holds."""
    m, _ = run([])
    assert m.with_snapshots(True) is m
    off = m.with_snapshots(False)
    assert not off.snapshots and off.with_snapshots(False) is off
    _, ds = run([("fail", (0, 1)), ("fail", (1, 1))], off)
    assert isinstance(ds[-1], Halt) and "stage 1 has no live replica" in ds[-1].reason
    _, ds = run([("fail", (0, 1)), ("fail", (1, 1))], m)
    assert isinstance(ds[-1], Publish)
    _, ds = run([("fail", (0, 1)), ("fail", (1, 1))], Membership.start(
        2, 3, job=JOB, horizon=1e9, pause=True, snapshots=True, disk=True).first()[0]
        .with_snapshots(False))
    assert isinstance(ds[-1], Publish)  # the disk tier still holds stage 1


@settings(max_examples=400, deadline=None)
@given(st.integers(2, 3), st.integers(2, 3),
       st.lists(st.tuples(st.sampled_from(["fail", "recover", "replace", "enter"]),
                          st.integers(0, 2), st.integers(0, 2)), max_size=16))
def test_with_a_copy_of_every_stage_no_sequence_of_deaths_and_returns_halts(D, S, steps):
    """Snapshots keep a copy of every stage: whatever dies, comes back, is replaced by a
    newer process or enters its version, in any order, the membership publishes (as many
    live workers as stages) or pauses (fewer), never halts, and never publishes while
    paused. (Before: a paused replacement re-stamped the plan in force; with `enter`
    between two returns, a halt.)"""
    job = JobSpec.uniform(D, S, 2 * D)
    m, _ = Membership.start(D, S, job=job, snapshots=True, horizon=1e9, pause=True).first()
    for kind, r, s in steps:
        w = (r % D, s % S)
        if kind == "enter":
            m = m.entered(m.version)
            continue
        if kind == "replace":
            m2, d = m.recover(w, m.incarnation(w) + 1)
        else:
            m2, d = m.fail(w) if kind == "fail" else m.recover(w)
        assert not isinstance(d, Halt), (kind, w, d)
        if isinstance(d, (Pause, Publish)):
            m = m2
            assert (m.state == "paused") == isinstance(d, Pause)
            assert (len(m.live()) < S) == isinstance(d, Pause), (len(m.live()), d)
        if isinstance(d, Publish) and d.roles is not None:
            assert {x.stage for x in d.roles} == set(range(S))
            assert len(d.roles) == len(m.live())


# ---- the issue's run, end to end ----------------------------------------------------------
ISSUE = ["-d", "2", "-s", "3", "-m", "4", "--iterations", "12",
         "--kill", "1:0@2", "--kill", "1:2@3", "--kill", "0:1@3", "--kill", "1:1@4",
         "--kill", "1:0@5", "--kill", "0:2@6", "--kill", "1:2@6",
         "--rejoin", "1:0@4", "--rejoin", "1:2@5", "--rejoin", "1:0@8", "--rejoin", "0:2@8",
         "--rejoin", "1:2@9"]
TOL = 1e-5


def _train(tmp_path, name, *args):
    summary = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, "-m", "recycle.cli", "train", *args,
                        "--summary", str(summary), "--run-dir", str(tmp_path / name)],
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(summary.read_text()), r.stderr


def _exact(tmp_path, model_args):
    got, out = _train(tmp_path, "run", *model_args, *ISSUE)
    ref, _ = _train(tmp_path, "ref", *model_args, *ISSUE[:8], "--reference")
    assert len(got["losses"]) == len(ref["losses"]) == 12
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert worst <= TOL, (worst, out)
    c = subprocess.run([sys.executable, "-m", "recycle.cli", "compare", str(tmp_path / "run.json"),
                        str(tmp_path / "ref.json"), "--tol", str(TOL)],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "training halted" not in out, out
    return got, out


@pytest.mark.procs
@pytest.mark.hard_timeout(420)
def test_the_issues_run_with_a_fixed_shape_finishes_exact(tmp_path):
    got, out = _exact(tmp_path, ["--shape", "fixed"])
    assert got["elastic"]["pauses"] >= 1, out


@pytest.mark.procs
@pytest.mark.hard_timeout(420)
def test_the_issues_run_with_a_module_factory_model_at_default_flags_finishes_exact(tmp_path):
    # a `?split=` model builds its stages by count: it cannot change shape, so the default
    # (--shape auto) pauses as --shape fixed does
    from examples.dropout_lm import name
    got, out = _exact(tmp_path, ["--model", name(4)])  # the default 4 layers
    assert got["elastic"]["pauses"] >= 1, out
