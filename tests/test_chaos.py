"""`recycle chaos`: the schedules it draws (pure, property-tested over seeds) and real runs of
it, locally and through a real `recycle serve` that is SIGKILLed and restarted mid-run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.launch.faults.injector import parse_event, parse_stall
from recycle.chaos.leaks import new_tag, reap_leaks, tagged, tagged_env
from recycle.chaos.report import summarize
from recycle.chaos.schedule import (MAX_KILLS_PER_ITERATION, MULTI_WHYS, STALL_S, Fault,
                                    Resume, Schedule, draw, draw_one, resume_grids)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
seeds = st.integers(min_value=0, max_value=2**63)
indices = st.integers(min_value=0, max_value=50)


def violations(sched: Schedule) -> list[str]:
    """Replays the schedule on its own (not with the drawing code) in the user's picture:
    worker R:S is of home stage S; rejoins of iteration i land before its kills, and a
    rejoined worker is killable from the next one on (or, drawn as a "rejoined" kill, in
    that very iteration); at least as many workers as some shape runs on stay live after
    every iteration (ceil(S/2) when the run may cut the pipeline, else S), except after a
    "pause" kill, whose victims are all due back, at least one worker left. A resumed
    run's faults are replayed on its own grid, all after the job kill."""
    out = _replay(sched, sched.replicas, sched.stages, sched.faults,
                  0 if sched.resume is None else None)
    r = sched.resume
    if r is not None:
        if not 0 < r.after < sched.iterations - 2:
            out.append(f"job kill after iteration {r.after}: not inside the run")
        if r.replicas * r.microbatches != sched.replicas * sched.microbatches:
            out.append("the resumed grid changes the global batch")
        if r.replicas * r.stages > 6 or not 2 <= r.stages <= 3:
            out.append(f"resumed grid {r.grid}: too big for this machine or the model")
        if any(f.iteration > r.after for f in sched.faults):
            out.append("a fault of the first run after the job kill")
        if any(f.iteration <= r.after for f in r.faults):
            out.append("a fault of the resumed run before the job kill")
        if sched.model is not None and r.stages != sched.stages:
            out.append("a model that cannot change shape resumed on another stage count")
        if any(f.why in ("pause",) for f in r.faults):
            out.append("a pause in a resumed run")
        out += _replay(sched, r.replicas, r.stages, r.faults, r.after + 1)
    return out


def _replay(sched: Schedule, D: int, S: int, faults, start) -> list[str]:
    """`start` None: the first run of a resume schedule (faults up to its job kill)."""
    N = sched.iterations
    reshapes = sched.shape != "fixed" and sched.model is None
    floor = -(-S // 2) if reshapes else S
    if start not in (0, None):
        floor = S  # a resumed run keeps S live
    live = {(r, s) for r in range(D) for s in range(S)}
    out = []
    if sched.service and sched.resume:
        out.append("the whole job resumed through the service")
    for f in faults:
        if not 0 <= f.iteration < N:
            out.append(f"{f.short()}: iteration outside 0..{N - 1}")
        if not (0 <= f.worker[0] < D and 0 <= f.worker[1] < S):
            out.append(f"{f.short()}: worker outside the grid")
    if sched.snapshot_every is not None:
        out.append("a drawn schedule sets --snapshot-every (not the default flags)")
    due: dict = {}  # dead worker -> its next rejoin
    for i in range(N):
        at = [f for f in faults if f.iteration == i]
        rejoins = [f for f in at if f.kind == "rejoin"]
        for f in rejoins:
            if f.worker in live:
                out.append(f"{f.short()}: rejoin of a live worker")
            if i > N - 2:
                out.append(f"{f.short()}: rejoins too late to train")
            live.add(f.worker)
        kills = [f for f in at if f.kind == "kill"]
        single = [f for f in kills if f.why not in MULTI_WHYS]
        if len(single) > MAX_KILLS_PER_ITERATION:
            out.append(f"iteration {i}: {len(single)} single kills")
        for f in kills:
            if f.worker not in live or (f.why != "rejoined" and
                                        any(r.worker == f.worker for r in rejoins)):
                out.append(f"{f.short()}: kill of a worker not (yet) live")
            if f.why == "rejoined" and not any(r.worker == f.worker and i - 1 <= r.iteration
                                               for r in faults if r.kind == "rejoin"
                                               and r.iteration <= i):
                out.append(f"{f.short()}: a rejoined kill of a worker that did not just return")
            if f.why == "donor" and not any(r.worker[1] == f.worker[1] for r in rejoins):
                out.append(f"{f.short()}: a donor kill with no rejoin of its home stage")
        # a group kind is whole: every worker live before the kills of that home stage / row
        for why, key in (("stage", 1), ("node", 0)):
            for g in {f.worker[key] for f in kills if f.why == why}:
                lost = {f.worker for f in kills if f.why == why and f.worker[key] == g}
                if lost != {w for w in live if w[key] == g}:
                    out.append(f"iteration {i}: {why} {g} not lost whole")
        live -= {f.worker for f in kills}
        for f in kills:
            later = [r.iteration for r in faults if r.kind == "rejoin" and r.worker == f.worker
                     and r.iteration > i]
            if later:
                due[f.worker] = min(later)
        for f in rejoins:
            due.pop(f.worker, None)
        if len(live) < floor:
            pause = [f for f in kills if f.why == "pause"]
            back = len(live) + sum(1 for w in due if w not in live)
            if not pause and not any(f.why == "pause" for f in faults if f.iteration < i):
                out.append(f"iteration {i}: {len(live)} live workers, fewer than {floor}")
            elif not live or back < floor or any(f.worker not in due for f in pause):
                out.append(f"iteration {i}: a pause ({len(live)} live) with too few due back")
            if [f for f in kills if f.why != "pause"]:
                out.append(f"iteration {i}: a kill while fewer than {floor} are live")
        for f in (f for f in at if f.kind == "stall"):
            if f.worker not in live:
                out.append(f"{f.short()}: stall of a dead worker")
            lo, hi = STALL_S[sched.service]
            if not lo <= f.seconds <= hi:
                out.append(f"{f.short()}: stall outside {lo}..{hi} s")
    return out


@settings(max_examples=300, deadline=None)
@given(seeds, indices, st.booleans())
def test_schedules_never_kill_the_dead_nor_leave_fewer_live_workers_than_stages(
        seed, index, service):
    sched = draw_one(seed, index, service)
    assert violations(sched) == [], sched


def test_the_replay_catches_broken_schedules():
    """The checker above is not vacuous: each rule, broken once."""
    def sched(*faults, **kw):
        return Schedule(0, 0, 2, 2, 2, 12, tuple(Fault(*f) for f in faults), **kw)
    assert violations(sched(("kill", (0, 0), 1), ("kill", (0, 0), 3)))  # kills the dead
    assert violations(sched(("rejoin", (0, 0), 2)))  # rejoins the living
    assert violations(sched(("kill", (0, 0), 1), ("rejoin", (0, 0), 11)))  # too late
    # a rejoined worker is killable only from the next iteration on
    assert violations(sched(("kill", (0, 0), 1), ("rejoin", (0, 0), 3), ("kill", (0, 0), 3)))
    assert violations(sched(("kill", (0, 0), 1), ("kill", (0, 1), 1), ("kill", (1, 0), 1)))
    assert violations(sched(("kill", (1, 1), 1), ("stall", (1, 1), 2, 1.0)))  # stalls the dead
    assert violations(sched(("stall", (1, 1), 2, 9.0)))  # a stall past its range
    assert violations(sched(("kill", (0, 0), 9, None, "donor")))  # no one rejoins there
    assert violations(sched(("kill", (0, 1), 1, None, "stage")))  # (1, 1) still lives
    assert violations(sched(("kill", (0, 0), 1, None, "node")))  # (0, 1) still lives
    assert violations(sched(("kill", (5, 0), 1)))  # off the grid
    assert violations(sched(("kill", (0, 0), 1), snapshot_every=2))  # not the default flags
    # two kills above the single-kill limit (3x2: the live count alone would allow them)
    assert violations(Schedule(0, 0, 3, 2, 2, 12, tuple(
        Fault("kill", w, 1) for w in ((0, 0), (1, 0), (2, 1)))))
    # a rejoin lands before its iteration's kills, so it counts toward the S live workers
    assert not violations(sched(("kill", (0, 0), 1), ("kill", (0, 1), 1), ("rejoin", (0, 0), 3),
                                ("kill", (1, 0), 3, None, "donor")))
    assert not violations(sched(("kill", (0, 0), 1), ("kill", (0, 1), 1), ("kill", (1, 0), 3),
                                service=True))  # a shape of one stage, through a service
    assert violations(sched(("kill", (0, 0), 1), ("kill", (0, 1), 1), ("kill", (1, 0), 3),
                            ("kill", (1, 1), 4)))  # nobody left
    # a whole home stage (or node) may be lost: the plan fills it, from a snapshot
    assert not violations(sched(("kill", (0, 1), 1, None, "stage"),
                                ("kill", (1, 1), 1, None, "stage"), ("rejoin", (0, 1), 4),
                                ("kill", (1, 0), 6, None, "node")))
    assert not violations(sched(("kill", (0, 0), 1), ("rejoin", (0, 0), 3), ("kill", (1, 0), 3),
                                ("rejoin", (1, 0), 5), ("kill", (0, 0), 5)))


@settings(max_examples=100, deadline=None)
@given(seeds, st.booleans())
def test_the_same_seed_draws_the_same_schedules(seed, service):
    assert draw(seed, 3, service) == draw(seed, 3, service)
    assert draw(seed, 1, service)[0] == draw(seed, 3, service)[0]  # --runs 1 repeats run 0


@settings(max_examples=200, deadline=None)
@given(seeds, indices, st.booleans())
def test_grid_run_length_and_service_outage_stay_in_range(seed, index, service):
    s = draw_one(seed, index, service)
    assert s.replicas >= 2 and s.replicas * s.stages <= 6
    assert 2 <= s.microbatches <= 4
    assert (8 <= s.iterations <= 10) if service else (12 <= s.iterations <= 16)
    assert s.of("kill"), "every schedule kills someone"
    if s.resume is not None:
        D2, S2, M2 = s.final_grid()
        assert D2 * M2 == s.replicas * s.microbatches and D2 * S2 <= 6 and 2 <= S2 <= 3
    if service:
        assert 2 <= s.outage.at_s <= 10 and 1 <= s.outage.outage_s <= 15
    else:
        assert s.outage is None


@settings(max_examples=100, deadline=None)
@given(seeds, st.booleans())
def test_flags_read_back_as_recycle_train_parses_them(seed, service):
    s = draw_one(seed, 0, service)
    args = s.to_args()
    assert args[:8] == ["-d", str(s.replicas), "-s", str(s.stages), "-m", str(s.microbatches),
                        "--iterations", str(s.iterations)]
    assert "--snapshot-every" not in args  # the default flags: snapshots on, K auto
    rest = args[8:]
    if s.shape:  # a pause of a shape that cannot cut: `--shape fixed` first
        assert rest[:2] == ["--shape", s.shape] and s.shape == "fixed"
        rest = rest[2:]
    got = []
    for flag, value in zip(rest[0::2], rest[1::2]):
        if flag == "--stall":
            r, st_, i, secs = parse_stall(value)
            got.append(("stall", (r, st_), i, secs))
        else:
            r, st_, i = parse_event(value)
            got.append((flag[2:], (r, st_), i, None))
    assert got == [(f.kind, f.worker, f.iteration, f.seconds) for f in s.faults]


def test_an_explicit_k_is_one_flag_and_shown():
    s = Schedule(0, 0, 2, 2, 2, 12, (Fault("kill", (0, 0), 1),), snapshot_every=3)
    assert s.to_args()[8:10] == ["--snapshot-every", "3"]
    assert s.describe().startswith("K3 ") and s.to_dict()["snapshot_every"] == 3
    d = Schedule(0, 0, 2, 2, 2, 12, (Fault("kill", (0, 0), 1),))
    assert d.describe() == "k0:0@1" and d.to_dict()["snapshot_every"] is None
    assert "--snapshot-every" not in d.to_args()
    off = Schedule(0, 0, 2, 2, 2, 12, (Fault("kill", (0, 0), 1),), snapshot_every=0)
    assert off.to_args()[8:10] == ["--snapshot-every", "0"] and off.describe() == "Koff k0:0@1"


def test_seeds_reach_every_kind_of_fault():
    """Over a few hundred schedules: donor kills, two kills in one iteration, a worker killed
    and rejoined twice, stalls, a whole home stage or node lost, a node added back, fewer
    live workers than stages (a shape change)."""
    found = set()
    for seed in range(300):
        s = draw_one(seed, 0)
        kills, rejoins = s.of("kill"), s.of("rejoin")
        if any(k.iteration == r.iteration and k.worker[1] == r.worker[1] and k.worker != r.worker
               for k in kills for r in rejoins):
            found.add("donor kill")
        if any(sum(k.iteration == i for k in kills) == 2 for i in range(s.iterations)):
            found.add("two kills in one iteration")
        if any(sum(r.worker == w for r in rejoins) >= 2 for w in {r.worker for r in rejoins}):
            found.add("killed and rejoined twice")
        if s.of("stall"):
            found.add("stall")
        found |= s.kinds()
    assert found == {"donor kill", "two kills in one iteration", "killed and rejoined twice",
                     "stall", "stage", "node", "node add", "shape", "pause", "rejoined kill",
                     "resume", "resume grid", "dropout", "mlp"}


@pytest.mark.procs
def test_a_process_that_escaped_its_session_is_found_by_its_tag_and_killed():
    tag = new_tag()
    escapee = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); "
                                "time.sleep(60)"], env=tagged_env(tag))
    try:
        time.sleep(0.3)
        assert tagged(tag) == [escapee.pid]
        leaks = reap_leaks(tag)
        assert len(leaks) == 1 and leaks[0].startswith(f"{escapee.pid} ")
        assert escapee.wait(5) == -signal.SIGKILL
        assert tagged(tag) == []
    finally:
        escapee.kill()
        escapee.wait()


def test_recovery_percentiles_per_mode():
    def rec(service, *secs):
        return {"service": service, "outcome": "exact", "leaks": [], "recovery": [
            {"kind": "kill", "worker": [0, 0], "iteration": 1, "seconds": x} for x in secs]}
    stats = summarize([rec(False, 1.0, 3.0), rec(False, 2.0), rec(True, 10.0)])["recovery"]
    assert stats["local"]["kill"] == {"n": 3, "p50": 2.0, "p99": 2.98, "max": 3.0}
    assert stats["service"]["kill"]["max"] == 10.0 and stats["all"]["kill"]["n"] == 4
    assert stats["all"]["rejoin"] == {"n": 0, "p50": None, "p99": None, "max": None}
    # a kill the schedule drew as part of a whole stage lost counts apart, with the moves
    lost = rec(False, 4.0)
    lost["schedule"] = {"snapshot_every": None, "faults": [  # None: the default flags
        {"kind": "kill", "worker": [0, 0], "iteration": 1, "why": "stage"}]}
    lost["elastic"] = {"moves": 1, "snapshot_restores": 1, "snapshot_every": 2, "pauses": 0,
                       "replays": 1, "retrained_iterations": 0}
    got = summarize([rec(False, 1.0), lost])
    assert got["recovery"]["local"]["kill"]["n"] == 1
    assert got["recovery"]["local"]["loss"] == {"n": 1, "p50": 4.0, "p99": 4.0, "max": 4.0}
    assert got["elastic"] == {"runs": 1, "moves": 1, "snapshot_restores": 1, "replays": 1,
                              "retrained_iterations": 0, "runs_with_moves": 1,
                              "snapshot_every": {"2": 1}, "pauses": 0, "shape_changes": 0,
                              "runs_with_shape_changes": 0}
    assert got["ok"]
    # only exact is a success: a halt (a copy of every stage lived) fails the soak
    halted = {**rec(False), "outcome": "halt"}
    assert not summarize([rec(False, 1.0), halted])["ok"]
    assert summarize([halted])["counts"]["halt"] == 1


# ---- the command ------------------------------------------------------------------------
def chaos(*args: str, timeout: float = 60, env_tag: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "RECYCLE_CHAOS_TEST": env_tag or uuid.uuid4().hex}
    return subprocess.run([sys.executable, "-m", "recycle.cli", "chaos", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--runs", "0"], "--runs must be at least 1"),
    (["--seed", "-3"], "--seed must be >= 0"),
    (["--time-limit", "0"], "--time-limit must be positive"),
    (["--shape", "fixed"], "--shape must be auto or speed"),
    (["--json", "/nonexistent-dir/x.json"], "/nonexistent-dir/x.json"),
])
@pytest.mark.procs
def test_bad_input_is_one_line_and_exit_code_2(args, message):
    res = chaos(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def run_and_check(tmp_path, *args: str, limit: float):
    """`recycle chaos ... --json`: exit 0, every run exact, nothing leaked. Whatever happens,
    no process the command started outlives the test."""
    tag = uuid.uuid4().hex
    report = tmp_path / "chaos.json"
    try:
        res = chaos(*args, "--json", str(report), "--out-dir", str(tmp_path / "out"),
                    timeout=limit, env_tag=tag)
        assert report.exists(), res.stdout + res.stderr
        data = json.loads(report.read_text())
        detail = res.stdout + res.stderr + json.dumps(data["runs"], indent=1)
        assert data["summary"]["leaks"] == 0, detail
        assert all(not r["leaks"] for r in data["runs"]), detail
        assert res.returncode == 0, detail
        assert data["summary"]["counts"]["exact"] == data["summary"]["runs"] == 1
        assert data["complete"] is True
    finally:
        leftovers = reap_leaks(tag, "RECYCLE_CHAOS_TEST")
    assert leftovers == [], "processes outlived `recycle chaos`"


@pytest.mark.slow
@pytest.mark.hard_timeout(240)
def test_a_soak_stopped_half_way_keeps_the_runs_it_finished(tmp_path):
    """SIGTERM after the first of two runs: the JSON holds that run (marked incomplete), and
    the second run's processes go with the command."""
    tag, report = uuid.uuid4().hex, tmp_path / "chaos.json"
    proc = subprocess.Popen([sys.executable, "-m", "recycle.cli", "chaos", "--seed", "1",
                             "--runs", "2", "--json", str(report), "--out-dir",
                             str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env={**os.environ, "RECYCLE_CHAOS_TEST": tag})
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            if report.exists() and json.loads(report.read_text())["runs"]:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the command ended before its second run"
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        data = json.loads(report.read_text())
        assert data["complete"] is False and len(data["runs"]) == 1, data["summary"]
        assert data["summary"]["runs"] == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        leftovers = reap_leaks(tag, "RECYCLE_CHAOS_TEST")
    assert leftovers == [], "processes outlived `recycle chaos`"


@pytest.mark.hard_timeout(120)
def test_a_sigkilled_chaos_leaves_no_run_behind(tmp_path):
    """The runs live in sessions of their own, out of reach of a kill of the command's
    group; SIGKILLed, `recycle chaos` runs no cleanup: its train run and workers must see
    it gone and leave by themselves."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "recycle.cli", "chaos", "--seed", "1",
                             "--runs", "1", "--out-dir", str(tmp_path / "out")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "RECYCLE_CHAOS_TEST": tag})
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(tagged(tag, "RECYCLE_CHAOS_TEST")) < 4:
            time.sleep(0.1)  # the command, the run's coordinator and its workers are up
        assert len(tagged(tag, "RECYCLE_CHAOS_TEST")) >= 4
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20  # as a SIGKILLed `recycle train`'s (test_never_hang)
        while time.monotonic() < deadline and tagged(tag, "RECYCLE_CHAOS_TEST"):
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        leftovers = reap_leaks(tag, "RECYCLE_CHAOS_TEST")
    assert leftovers == [], "processes outlived a SIGKILLed `recycle chaos`:\n" + "\n".join(leftovers)


# One seed of each in the default run (.ci/run); the others are the `slow` tier
# (`pytest -m slow`), beside the soak's committed figures (benchmarks/results/chaos.md).
SEEDS = [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]


@pytest.mark.hard_timeout(240)
@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_runs_exact_and_leak_free(tmp_path, seed):
    run_and_check(tmp_path, "--seed", str(seed), "--runs", "1", limit=200)


@pytest.mark.hard_timeout(420)
@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_through_a_crashing_service_runs_exact_and_leak_free(tmp_path, seed):
    run_and_check(tmp_path, "--seed", str(seed), "--runs", "1", "--service", limit=380)


@pytest.mark.parametrize("service", [False, True])
def test_schedules_draw_shape_changes_locally_and_through_a_service(service):
    drawn = [draw_one(3, k, service) for k in range(60)]
    assert sum("shape" in s.kinds() for s in drawn) >= 6


# ---- the harsher kinds (issue 42 item 5) ------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(seeds, indices)
def test_every_too_few_live_stretch_is_a_pause_with_its_victims_due_back(seed, index):
    """Fewer live workers than any shape runs on only after a "pause" kill, at least one
    left, every victim due back (the run pauses and starts them at once), no other kill
    until they are; the built-in GPT at S = 2 pauses only under --shape fixed."""
    s = draw_one(seed, index)
    assert violations(s) == [], s
    if "pause" in s.kinds():
        pause = [f for f in s.of("kill") if f.why == "pause"]
        assert pause and len({f.iteration for f in pause}) == 1
        assert all(any(r.worker == f.worker and r.iteration > f.iteration for r in s.of("rejoin"))
                   for f in pause)
        assert s.fewest_live() >= 1
        if s.model is None and s.stages == 2:
            assert s.shape == "fixed"


@settings(max_examples=300, deadline=None)
@given(seeds, indices)
def test_resume_grids_keep_the_global_batch(seed, index):
    s = draw_one(seed, index)
    if s.resume is None:
        return
    D2, S2, M2 = s.final_grid()
    assert (D2, S2, M2) in resume_grids(s.replicas, s.stages, s.microbatches, s.model is None)
    assert D2 * M2 == s.replicas * s.microbatches
    args = s.resume_args()
    assert args[:4] == ["-d", str(D2), "-s", str(S2)]
    # M follows D when D changes (recycle/commands/train.py): it is given only on the same D
    assert ("-m" in args) == (D2 == s.replicas)
    assert all(f.iteration > s.resume.after for f in s.resume.faults)
    assert all(f.iteration <= s.resume.after for f in s.faults)


def test_resume_grids():
    assert resume_grids(2, 2, 4) == [(2, 2, 4), (1, 2, 8), (1, 3, 8), (2, 3, 4)]
    assert resume_grids(2, 3, 3, reshapes=False) == [(2, 3, 3), (1, 3, 6)]
    assert all(d * m == 6 and d * s <= 6 for d, s, m in resume_grids(3, 2, 2))


def test_the_harsher_kinds_are_drawn_through_a_service_but_the_resume_and_old_schedules_stay():
    """Through a service every harsher kind but the whole job killed and resumed is drawn
    (that one drives `recycle train --resume` locally); a local schedule that draws none
    of them is the schedule its (seed, index) drew before they existed (their own random
    stream)."""
    drawn = [draw_one(5, k, service=True) for k in range(40)]
    assert all(s.resume is None for s in drawn)
    assert any(s.model is not None for s in drawn) and any(s.shape == "fixed" for s in drawn)
    assert any(f.why == "pause" for s in drawn for f in s.faults)
    assert any(f.why == "rejoined" for s in drawn for f in s.faults)
    # seed 97 run 0 (no harsher kind): as drawn before them
    assert draw_one(97, 0).describe() == "k1:0@4 k2:0@5 r1:0@5 r2:0@9 s0:0@12/3.2s"


def test_the_replay_catches_broken_harsher_schedules():
    def sched(*faults, **kw):
        return Schedule(0, 0, 2, 2, 2, 12, tuple(Fault(*f) for f in faults), **kw)
    # a pause: fewer than S live under --shape fixed, victims due back
    ok = sched(("kill", (0, 0), 3, None, "pause"), ("kill", (1, 0), 3, None, "pause"),
               ("kill", (0, 1), 3, None, "pause"), ("rejoin", (0, 0), 5), ("rejoin", (1, 0), 5),
               ("rejoin", (0, 1), 5), shape="fixed")
    assert violations(ok) == [] and "pause" in ok.kinds()
    assert violations(sched(("kill", (0, 0), 3, None, "pause"), ("kill", (1, 0), 3, None, "pause"),
                            ("kill", (0, 1), 3, None, "pause"), ("rejoin", (0, 0), 5),
                            ("rejoin", (1, 0), 5), shape="fixed"))  # (0, 1) never back
    assert violations(sched(("kill", (0, 0), 3), ("kill", (1, 1), 3), ("kill", (1, 0), 4),
                            ("rejoin", (0, 0), 5), ("rejoin", (1, 1), 5), ("rejoin", (1, 0), 6),
                            shape="fixed"))  # too few live, not drawn as a pause
    # a worker killed again in the iteration it returns at: only as a "rejoined" kill
    assert not violations(sched(("kill", (0, 0), 1), ("rejoin", (0, 0), 3),
                                ("kill", (0, 0), 3, None, "rejoined")))
    assert violations(sched(("kill", (0, 0), 1), ("kill", (0, 0), 6, None, "rejoined")))
    # a resume: its faults after the job kill, the global batch kept
    r = Schedule(0, 0, 2, 2, 4, 12, (Fault("kill", (0, 0), 1),),
                 resume=Resume(4, 1, 3, 8, ()))
    assert violations(r) == [] and {"resume", "resume grid"} <= r.kinds()
    assert violations(Schedule(0, 0, 2, 2, 4, 12, (Fault("kill", (0, 0), 1),),
                               resume=Resume(4, 1, 3, 4, ())))  # the batch halves
    assert violations(Schedule(0, 0, 2, 2, 4, 12, (Fault("kill", (0, 0), 5),),
                               resume=Resume(4, 2, 2, 4, ())))  # a fault after the kill
    assert r.resume_args()[:6] == ["-d", "1", "-s", "3", "--iterations", "12"]
