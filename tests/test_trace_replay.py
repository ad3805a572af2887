"""A spot trace replayed on real processes (executor/launch/faults/trace_replay.py): node removals
SIGKILL workers, additions start new ones, and the run equals the failure-free one."""
import pytest

from executor.inputs.launch_spec import Faults
from executor.launch.faults.trace_replay import TraceReplay, load_window, window
from planner.simulation.trace import NodeEvent, Placement, TraceError
from tests.test_executor_runtime import assert_exact, run

pytestmark = pytest.mark.hard_timeout(120)


def test_window_starts_with_the_nodes_up_then_replays_its_own_events():
    ev = [NodeEvent(0, "add", "a"), NodeEvent(0, "add", "b"), NodeEvent(10, "remove", "a"),
          NodeEvent(20, "add", "c"), NodeEvent(4000, "remove", "b")]
    assert window(ev, 15, 1) == [NodeEvent(0.0, "add", "b"), NodeEvent(5.0, "add", "c")]
    assert window(ev, 0, 2)[2:] == [NodeEvent(10, "remove", "a"), NodeEvent(20, "add", "c"),
                                    NodeEvent(4000, "remove", "b")]
    with pytest.raises(TraceError, match="no node is up"):
        window([NodeEvent(0, "add", "a"), NodeEvent(1, "remove", "a"),
                NodeEvent(9, "add", "a")], 5, 1)
    with pytest.raises(TraceError, match="past the trace's end"):
        window([NodeEvent(0, "add", "a"), NodeEvent(1, "remove", "a")], 5, 1)


def test_due_events_follow_the_compressed_clock():
    tr = load_window("benchmarks/traces/p3-trace.csv", Placement(3, 2), 3600, 2)
    replay = TraceReplay(tr, time_scale=600)
    own = [e for e in tr.node_events if e.time > 0]
    assert len(own) >= 30 and tr.events  # two hours of the P3 trace: the window
    first = replay.due(tr.events[0].time / 600)
    assert first and replay.due(tr.events[0].time / 600) == []
    assert len(first) + len(replay.due(1e9)) == len(tr.events)
    with pytest.raises(TraceError):
        TraceReplay(tr, time_scale=0)


def test_a_node_removed_and_a_spare_added_kill_and_restart_workers_exactly(tmp_path):
    path = tmp_path / "spot.csv"
    lines = [f"0,add,node{k}" for k in range(6)] + ["1500,remove,node1", "3000,add,node9"]
    path.write_text("\n".join(lines) + "\n")
    tr = load_window(str(path), Placement(3, 2), 0, 1)
    # the trace's clock starts once every worker is in: the removal lands 0.15 s later and
    # the addition 0.3 s later, well inside a 40-iteration run (about 1 s at the least)
    replay = TraceReplay(tr, time_scale=10.0)
    res = run(tmp_path, 3, 2, 40, faults=Faults(trace=replay))
    assert_exact(res, 3, 2, 40, tmp_path)
    assert (replay.kills, replay.restarts) == (1, 1), res.events
    el = res.summary.elastic
    assert (el["trace_events"], el["trace_kills"], el["trace_restarts"]) == (2, 1, 1), el
    assert any("trace: node removed, SIGKILL worker 0:1" in e for e in res.events)
    failed = [p["failed"] for p in res.summary.plans]
    assert [[0, 1]] in failed and failed[-1] == [], res.summary.plans


def test_nodes_removed_at_one_instant_are_planned_around_in_one_version(tmp_path):
    """Two nodes gone at the same trace instant: one plan without both (fail_many), never a
    plan for the first death alone, whose moves the second could undo."""
    path = tmp_path / "spot.csv"
    lines = [f"0,add,node{k}" for k in range(6)] + ["1500,remove,node1", "1500,remove,node3"]
    path.write_text("\n".join(lines) + "\n")
    tr = load_window(str(path), Placement(3, 2), 0, 1)
    replay = TraceReplay(tr, time_scale=10.0)
    res = run(tmp_path, 3, 2, 40, faults=Faults(trace=replay), detect_stragglers=False)
    assert_exact(res, 3, 2, 40, tmp_path)
    assert replay.kills == 2, res.events
    plans = res.summary.plans
    first = next(k for k, p in enumerate(plans) if p["failed"])
    assert len(plans[first]["failed"]) == 2, plans
    # the version right after the last one without failures: nothing was published between
    # (planned per death, a version for the first death alone came in between, untrained)
    assert plans[first]["version"] == plans[first - 1]["version"] + 1, plans


def test_a_node_removed_readded_and_removed_in_one_instant_kills_one_process(tmp_path):
    """P3 removes a node, adds a spare and removes that within one millisecond: one process
    dies, so one SIGKILL is counted (the replay counted two: the process was not reaped
    yet when the second removal came)."""
    path = tmp_path / "spot.csv"
    lines = [f"0,add,node{k}" for k in range(6)]
    lines += ["1500,remove,node1", "1500,add,node9", "1500,remove,node9"]
    path.write_text("\n".join(lines) + "\n")
    tr = load_window(str(path), Placement(3, 2), 0, 1)
    replay = TraceReplay(tr, time_scale=10.0)
    res = run(tmp_path, 3, 2, 40, faults=Faults(trace=replay), detect_stragglers=False)
    assert_exact(res, 3, 2, 40, tmp_path)
    assert (replay.kills, replay.restarts) == (1, 0), res.events
    assert sum("trace: node removed, SIGKILL" in e for e in res.events) == 1, res.events


def test_a_trace_that_leaves_fewer_workers_than_stages_pauses_until_a_node_is_added(tmp_path):
    """Five of six nodes removed at one instant leave one worker for two stages: the run
    pauses (peer memory, or the seed, still has every stage) and resumes, exact, once the
    trace adds a node; before, it halted at the removal."""
    path = tmp_path / "spot.csv"
    lines = [f"0,add,node{k}" for k in range(6)]
    lines += [f"1500,remove,node{k}" for k in range(5)] + ["3000,add,node9"]
    path.write_text("\n".join(lines) + "\n")
    tr = load_window(str(path), Placement(3, 2), 0, 1)
    replay = TraceReplay(tr, time_scale=10.0)
    res = run(tmp_path, 3, 2, 40, faults=Faults(trace=replay), snapshot_every=2,
              detect_stragglers=False, shape="fixed")
    assert_exact(res, 3, 2, 40, tmp_path)
    assert (replay.kills, replay.restarts) == (5, 1), res.events
    assert res.summary.elastic["pauses"] == 1, res.events
    assert "training paused: 1 live worker cannot serve 2 stages; waiting for workers to " \
        "come back (every stage's state has a copy in peer memory, on disk or at the " \
        "start)" in res.events


def test_recycle_train_replays_two_hours_of_the_p3_trace_exactly(tmp_path):
    """`recycle train --trace`: an hour into the real P3 trace, two hours of it at 1500x on
    a 2x3 grid (one worker a node): nodes removed and spares added as the trace says, and
    the run's losses and parameters are the failure-free run's."""
    import json

    from executor.compute.one_process.reference import Summary, compare
    from tests.test_executor_runtime import TOL
    from tests.test_run_ends import train

    args = ["-d", "2", "-s", "3", "-m", "2", "--iterations", "40"]
    got = train(*args, "--trace", "benchmarks/traces/p3-trace.csv", "--trace-start", "1h",
                "--trace-hours", "2", "--time-scale", "1500", "--timeout", "4", "--snapshot-every", "2",
                "--summary", str(tmp_path / "got.json"), "--run-dir", str(tmp_path / "run"))
    assert got.returncode == 0, got.stderr[-3000:]
    ref = train(*args, "--reference", "--summary", str(tmp_path / "ref.json"))
    assert ref.returncode == 0, ref.stderr[-2000:]
    a, b = (Summary.load(str(tmp_path / f)) for f in ("got.json", "ref.json"))
    assert not compare(a, b, TOL)
    el = json.loads((tmp_path / "got.json").read_text())["elastic"]
    assert el["trace_kills"] >= 1 and el["trace_restarts"] >= 1, el
    assert "trace: node removed, SIGKILL worker" in got.stderr
