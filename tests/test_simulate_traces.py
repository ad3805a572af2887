"""Traces for the simulator: reading the spot and fail-stop formats, nodes to workers,
synthetic traces, and `recycle simulate` as a user runs it (bad input: one line, exit 2)."""
import json
import subprocess
import sys

import pytest

from planner.simulation.trace import (Placement, TraceError, exponential_trace,
                                      fixed_interval_trace, read_spot, read_trace, spot_trace,
                                      write_spot)

from test_cli_planner import ROOT, SPEC  # noqa: E402  the same 4x4 job


pytestmark = pytest.mark.procs  # its fixtures or tests start processes

def recycle(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "recycle.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(SPEC))
    return str(path)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_placement_stages_and_replicas():
    by_stage = Placement(2, 4, 2, "stages")  # a node: 2 consecutive stages of one replica
    assert by_stage.nodes == 4
    assert [by_stage.workers(n) for n in range(4)] == [
        ((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1)), ((1, 2), (1, 3))]
    by_replica = Placement(4, 2, 2, "replicas")  # a node: one stage of 2 replicas
    assert [by_replica.workers(n) for n in range(4)] == [
        ((0, 0), (1, 0)), ((2, 0), (3, 0)), ((0, 1), (1, 1)), ((2, 1), (3, 1))]
    with pytest.raises(TraceError, match="divide the stages"):
        Placement(2, 3, 2, "stages")
    with pytest.raises(TraceError, match="divide the replicas"):
        Placement(3, 2, 2, "replicas")


def test_spot_trace_fills_slots_keeps_spares_and_replaces_a_preempted_node(tmp_path):
    path = write(tmp_path, "spot.csv", "0,add,node0\n0,add,node1\n0,add,node2\n"
                 "60000,remove,node1\n90000,add,node7\n120000,remove,node0\n")
    where = Placement(1, 4, 2, "stages")  # two node slots
    tr = read_trace(path, where)
    assert tr.initial_failed == frozenset()  # two nodes fill the grid, node2 waits
    kinds = [(e.time, e.kind, e.workers) for e in tr.events]
    assert kinds == [
        (60.0, "fail", ((0, 2), (0, 3))), (60.0, "recover", ((0, 2), (0, 3))),  # node2 steps in
        (120.0, "fail", ((0, 0), (0, 1))), (120.0, "recover", ((0, 0), (0, 1))),  # node7
    ]
    # no spare left: a removal leaves its slot empty until a node is added
    tr = spot_trace(read_spot(path)[:2] + read_spot(path)[3:4], where)
    assert tr.initial_failed == frozenset() and [e.kind for e in tr.events] == ["fail"]
    # a grid larger than the cluster starts with those workers down
    tr = read_trace(path, Placement(2, 4, 2, "stages"))
    assert tr.initial_failed == {(1, 2), (1, 3)}


def test_spot_round_trip_and_synthetic_traces(tmp_path):
    where = Placement(4, 4, 2, "stages")
    fixed = fixed_interval_trace(where, 12 * 3600, 3600, 1800, seed=3)
    assert fixed.failures == 11 and all(len(e.workers) == 2 for e in fixed.events)
    assert [e.time for e in fixed.events if e.kind == "fail"] == [3600.0 * k for k in range(1, 12)]
    path = str(tmp_path / "t.csv")
    write_spot(path, fixed.node_events)
    again = read_trace(path, where)
    assert [(e.time, e.kind, e.workers) for e in again.events] == \
        [(e.time, e.kind, e.workers) for e in fixed.events]
    a = exponential_trace(where, 1e6, 1e5, 1e3, seed=4)
    assert a.events == exponential_trace(where, 1e6, 1e5, 1e3, seed=4).events
    assert a.events != exponential_trace(where, 1e6, 1e5, 1e3, seed=5).events
    for w in {e.workers for e in a.events}:  # a node fails, is back, fails again
        kinds = [e.kind for e in a.events if e.workers == w]
        assert all(k1 != k2 for k1, k2 in zip(kinds, kinds[1:]))


@pytest.mark.parametrize("name,text,line,words", [
    ("spot.csv", "0,add,node0\n0,add,node1\n5000,preempt,node1\n", 3, "t_ms,add|remove"),
    ("spot.csv", "0,add,node0\n5000,remove,node0\n4000,add,node0\n", 3, "earlier"),
    ("fs.csv", "# fail-stop\n10,fail,0:1\n20,recover,9:9\n", 3, "outside the 4x4 grid"),
    ("fs.csv", "10,fail,0:1\n20,speed,0:2,fast\n", 2, "factor"),
    ("fs.csv", "10,fail,0:1\n20,fail,0:1:3\n", 2, "t_s,fail|recover"),
])
def test_malformed_trace_line_is_one_line_with_its_number(spec, tmp_path, name, text, line, words):
    r = recycle("simulate", spec, "--trace", write(tmp_path, name, text), "--no-progress")
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert f"line {line}" in r.stderr and words in r.stderr


def test_simulate_a_trace_file_with_json_png_and_html(spec, tmp_path):
    trace = write(tmp_path, "fs.csv", "3600,fail,1:2\n5400,speed,0:0,0.5\n7200,recover,1:2\n")
    png, page, md = tmp_path / "t.png", tmp_path / "t.html", tmp_path / "t.md"
    r = recycle("simulate", spec, "--trace", trace, "--json", "--png", str(png),
                "--html", str(page), "--markdown", str(md),
                "-p", "recycle", "-p", "bamboo", "-p", "drop-replica")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["trace"]["failures"] == 1 and out["trace"]["hours"] == 2.0
    rows = {p["policy"]: p for p in out["policies"]}
    assert set(rows) == {"recycle", "bamboo", "drop-replica"}
    assert rows["recycle"]["recycle_ratio"] == 1.0
    assert rows["recycle"]["kept"] > rows["drop-replica"]["kept"] > rows["bamboo"]["kept"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in page.read_text() and "drop-replica" in page.read_text()
    assert "| bamboo |" in md.read_text() and "--trace" in md.read_text()


@pytest.mark.parametrize("args,words", [
    (["--hours", "nan"], "--hours must be a number"),
    (["--hours", "inf"], "--hours must be a number"),
    (["--hours", "1e9"], "--hours must be a number"),
    (["--restart-minutes", "-1"], "--restart-minutes must be"),
    (["--detect-seconds", "nan"], "--detect-seconds must be"),
    (["--every", "6h", "--spot"], "at most one of"),
    (["--every", "0s"], "must be positive"),
    (["--mtbf-hours", "1e-6", "--repair-hours", "0"], "failures expected"),
    (["--gpus-per-node", "3"], "divide the stages"),
    (["--placement", "diagonal"], "unknown placement"),
    (["-p", "magic"], "unknown policy"),
    (["--failure-model", "nope"], "unknown failure model 'nope'"),
    (["--failure-model", "llama3-405b", "--every", "1h"], "at most one of"),
    (["--failure-model", "llama3-405b", "--gpus-per-node", "2"], "a failure model places"),
    (["--png", "/nonexistent/dir/x.png"], "cannot write"),
])
def test_bad_simulate_input_is_one_line_and_exit_2(spec, args, words):
    r = recycle("simulate", spec, "--no-progress", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_simulate_draws_a_failure_model_and_says_where_its_hangs_went():
    """Llama 3's record on a small grid of its own preset (4 x 16 hosts of 8 GPUs: 512
    GPUs), two weeks: a draw of a few failures, every named policy run on it."""
    r = recycle("simulate", "--preset", "llama3-405b", "-d", "4", "-s", "16",
                "--failure-model", "llama3-405b", "--hours", "336", "--seed", "3", "--json",
                "--no-progress", "-p", "checkpoint-restart", "-p", "recycle-short",
                "-p", "limit")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "failure model llama3-405b, seed 3" in out["trace"]["source"]
    assert out["trace"]["hours"] == 336 and out["trace"]["failures"] >= 1
    rows = {p["policy"]: p for p in out["policies"]}
    assert rows["recycle-short"]["kept"] > rows["checkpoint-restart"]["kept"]


def test_oversized_specs_are_refused_before_planning(tmp_path):
    # a spec of 1.2M stages (10 MB; the had 4.4M in 50 MB): refused by its size,
    # without reading it (it used to be parsed, then planned until memory ran out)
    big = tmp_path / "big.json"
    n = 1_200_000
    row = "[" + "1," * (n - 1) + "1]"
    with open(big, "w") as fh:
        fh.write(f'{{"replicas": 1, "stages": {n}, "microbatches": 1, "cost": {{'
                 + ", ".join(f'"{k}": {row}' for k in ("F", "I", "W", "OPT")) + "}}")
    r = recycle("simulate", str(big), "--no-progress")
    assert r.returncode == 2 and "MiB" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # a small file whose grid is over the planning limits
    stages = 140_000
    spec = {"replicas": 1, "stages": stages, "microbatches": 1,
            "cost": {k: [1] * stages for k in ("F", "I", "W", "OPT")}}
    path = write(tmp_path, "wide.json", json.dumps(spec))
    r = recycle("simulate", path, "--no-progress")
    assert r.returncode == 2 and "too large to plan" in r.stderr, r.stderr


def test_a_node_holding_a_whole_stage_halts_recycle_and_swift_replays_it(tmp_path):
    from planner.job import JobSpec
    from planner.simulation.compare import simulate
    from planner.simulation.policies import Params

    job = JobSpec.uniform(2, 2, 4)
    where = Placement(2, 2, 2, "replicas")  # node 1 holds stage 1 of both replicas
    path = write(tmp_path, "spot.csv", "0,add,node0\n0,add,node1\n100000,remove,node1\n"
                 "200000,add,node9\n")
    tr = read_trace(path, where)
    assert [(e.kind, e.workers) for e in tr.events] == [
        ("fail", ((0, 1), (1, 1))), ("recover", ((0, 1), (1, 1)))]
    res = simulate(job, tr, 500.0, 1e-3, Params(swift_log_overhead=0.0),
                   checkpoint_every_s=150.0)
    out = {o.policy: o for o in res.outcomes}
    fixed = out["recycle-fixed"]
    assert fixed.restarts == 1 and fixed.lost >= 99 * res.base_rate
    assert any("replayed" in n for n in out["swift-replay"].notes)
    assert out["swift-replay"].microbatches > fixed.microbatches
    # with roles, a worker of the other node moves to stage 1 and loads it from the
    # snapshot held on node 0: the job rolls back a few iterations, not to the checkpoint
    el = out["recycle"]
    assert el.restarts == 0 and any("snapshot" in n for n in el.notes)
    assert el.lost < 5 * res.job.num_microbatches
    assert el.microbatches > out["swift-replay"].microbatches
    assert out["bamboo"].restarts == 0  # each pipeline's stage 0 takes stage 1 over


def test_simulate_reads_and_fills_a_plan_cache(spec, tmp_path):
    import sqlite3

    db = tmp_path / "plans.sqlite"
    trace = write(tmp_path, "fs.csv", "100,fail,1:2\n200,fail,3:0\n300,recover,1:2\n")
    r = recycle("simulate", spec, "--trace", trace, "--hours", "0.1", "--db", str(db), "--json",
                "-p", "recycle-fixed")
    assert r.returncode == 0, r.stderr
    kept = json.loads(r.stdout)["policies"][0]["kept"]
    with sqlite3.connect(db) as con:  # the failure-free set and three failed sets
        assert con.execute("SELECT COUNT(*) FROM plans").fetchone()[0] == 4
    again = recycle("simulate", spec, "--trace", trace, "--hours", "0.1", "--db", str(db),
                    "--json", "-p", "recycle-fixed")
    assert json.loads(again.stdout)["policies"][0]["kept"] == kept
    # the recycle policy (roles) plans its candidates' filled-slot sets through the cache too
    el = recycle("simulate", spec, "--trace", trace, "--hours", "0.1", "--db", str(db), "--json",
                 "-p", "recycle")
    assert el.returncode == 0, el.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM plans").fetchone()[0] >= 4


def test_write_trace_saves_the_synthetic_trace_that_was_simulated(spec, tmp_path):
    out = tmp_path / "spot.csv"
    r = recycle("simulate", spec, "--spot", "--hours", "24", "--seed", "2", "--write-trace",
                str(out), "--json", "-p", "recycle", "-p", "drop-replica")
    assert r.returncode == 0, r.stderr
    failures = json.loads(r.stdout)["trace"]["failures"]
    assert failures > 0
    again = recycle("simulate", spec, "--trace", str(out), "--hours", "24", "--json",
                    "-p", "recycle", "-p", "drop-replica")
    assert again.returncode == 0, again.stderr
    a, b = json.loads(r.stdout), json.loads(again.stdout)
    assert b["trace"]["failures"] == failures
    assert [p["samples"] for p in a["policies"]] == pytest.approx([p["samples"] for p in b["policies"]])
