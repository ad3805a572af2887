"""benchmarks/trace_vs_simulate.py's pure parts, so the benchmark cannot rot: a trace
window as the files `recycle simulate` reads, a run's progress from its output lines, the
simulator's answer on that window, and the results table. No timing assertions."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from benchmarks.trace_progress import (closeness, delayed_events, first_replan,
                                       identical_until_replan, own_rate, parse_lines,
                                       recovery_seconds, restore_events, simulated,
                                       window_progress, write_eventless, write_failstop,
                                       write_window)
from benchmarks.trace_report import markdown
from executor.launch.faults.trace_replay import load_window
from planner.job import JobSpec
from planner.simulation.trace import Event, Placement, Trace, read_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P3 = os.path.join(ROOT, "benchmarks", "traces", "p3-trace.csv")


def test_the_window_file_replays_the_same_worker_events_as_train_does(tmp_path):
    out = str(tmp_path / "win.csv")
    own = write_window(P3, 3600, 2, out)
    assert own >= 30  # the window: two hours of the P3 trace, 30+ node events
    for pl in (Placement(2, 3, 1), Placement(2, 3, 2, "replicas")):
        mine, train = read_trace(out, pl), load_window(P3, pl, 3600, 2)
        assert [(e.time, e.kind, e.workers) for e in mine.events] == \
            [(e.time, e.kind, e.workers) for e in train.events]
        assert mine.initial_failed == train.initial_failed
    write_eventless(str(tmp_path / "none.csv"), 6)
    quiet = load_window(str(tmp_path / "none.csv"), Placement(2, 3), 0, 2)
    assert quiet.events == [] and not quiet.initial_failed


def test_recoveries_delayed_as_a_replacement_starts_and_cancelled_by_a_new_failure(tmp_path):
    a, b = (0, 1), (1, 2)
    tr = Trace([Event(100, "fail", (a,)), Event(100, "recover", (a,)),
                Event(200, "fail", (b,)), Event(200, "recover", (b,)),
                Event(230, "fail", (b,)), Event(230, "recover", (b,)),
                Event(500, "fail", (a,))])
    got = delayed_events(tr, 50)
    assert got == [(100, "fail", a), (150, "recover", a), (200, "fail", b), (230, "fail", b),
                   (280, "recover", b), (500, "fail", a)]
    path = str(tmp_path / "fs.csv")
    write_failstop(path, got)
    back = read_trace(path, Placement(2, 3))
    assert [(e.time, e.kind, e.workers[0]) for e in back.events] == got


LINES = ["train: ...", "trace: every worker is in; replaying the trace from now",
         "iter    0  loss 2.0  9 tok/s  plan v0  failed -",
         "iter    9  loss 1.9  9 tok/s  plan v0  failed -",
         "trace: node removed, SIGKILL worker 1:2",
         "trace: node removed, SIGKILL worker 1:2",
         "worker 1:2 failed (process exited with code -9)",
         "trace: node added, starting worker 1:2 (no state)",
         "worker 1:2 is back (incarnation 2): publishing the plan that includes it",
         "iter   19  loss 1.8  9 tok/s  plan v2  failed -",
         "iter   39  loss 1.7  9 tok/s  plan v2  failed -"]
TIMES = [0.0, 10.0, 10.5, 11.0, 12.0, 12.0, 12.1, 12.2, 12.7, 13.0, 15.0]


def test_progress_in_the_window_from_the_run_lines():
    log = parse_lines(list(zip(TIMES, LINES)))
    assert (log.t0, log.kills, log.deaths, log.halted) == (10.0, 2, 1, False)
    assert log.starts == [pytest.approx(0.5)] and log.last_back == 12.7
    # 10 iterations done at 11.0, 20 at 13.0: 15 at 12.0, linear in between
    assert window_progress(log, 2.0) == pytest.approx(15.0)
    assert window_progress(log, 0.5) == pytest.approx(1.0)  # iteration 0 done at 10.5
    # every worker up: t0 to the first SIGKILL (15 iterations in 2 s), and from a second
    # after the window's end or the last replacement's return to the end (27 -> 40 in 1.3 s)
    assert own_rate(log, 2.0) == pytest.approx(28 / 3.3)
    assert own_rate(log, 6.0) == pytest.approx(15 / 2)  # no stretch after the window
    assert own_rate(parse_lines(list(zip(TIMES[:5], LINES[:5]))), 2.0) == 10.0  # to its end
    early = parse_lines([(10.0, LINES[1]), (10.3, LINES[4]), (10.5, LINES[2])])
    assert own_rate(early, 2.0) is None  # 0.3 s with every worker up
    with pytest.raises(ValueError, match="give more --iterations"):
        window_progress(log, 6.0)  # it stopped training at 15.0, inside the window
    halted = parse_lines(list(zip(TIMES, LINES[:4])) + [(12.0, "training halted: no copy")])
    assert halted.halted and window_progress(halted, 6.0, halted=True) == 10.0
    with pytest.raises(ValueError, match="replayed no trace"):
        parse_lines([(0.0, "iter    0  loss 2.0")])


def test_summary_figures():
    summary = {"recovery": [{"kind": "kill", "seconds": 0.2}, {"kind": "rejoin", "seconds": 9},
                            {"kind": "kill", "seconds": 0.4}],
               "plans": [{"moves": []}, {"moves": [{"source": "snapshot"}, {"source": "snapshot"}]},
                         {"moves": [{"source": "peer"}]}, {}]}
    assert recovery_seconds(summary) == [0.2, 0.4]
    assert restore_events(summary) == 1  # one rollback, however many workers loaded


@pytest.mark.procs
def test_simulate_on_the_window_restores_each_emptied_stage_from_its_snapshot(tmp_path):
    """Two GPUs a node, one stage of both replicas on each: every removal in the window
    empties a stage, which the simulator restores from its peer-memory snapshot."""
    spec = tmp_path / "job.json"
    spec.write_text(JobSpec.uniform(2, 3, 2).model_dump_json())
    win = str(tmp_path / "win.csv")
    write_window(P3, 3600, 2, win)
    delayed = str(tmp_path / "delayed.csv")
    tr = load_window(P3, Placement(2, 3, 2, "replicas"), 3600, 2)
    write_failstop(delayed, delayed_events(tr, 300.0))

    def sim(trace, fmt, g):
        r = subprocess.run([sys.executable, "-m", "recycle.cli", "simulate", str(spec),
                            "--trace", trace, "--trace-format", fmt, "--hours", "2",
                            "--gpus-per-node", str(g), "--placement", "replicas",
                            "--unit-s", "0.05", "--detect-seconds", "30", "--policy", "recycle-short",
                            "--json", "--no-progress", "--jobs", "1"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        return simulated(json.loads(r.stdout))

    now, later = sim(win, "spot", 2), sim(delayed, "failstop", 1)
    assert tr.failures == 3 and now["snapshot_restores"] == 3 and now["failures"] == 3
    assert 0.9 < now["kept"] < 1.0  # three detections and rollbacks in two hours
    assert later["kept"] < now["kept"]  # replacements five minutes late cost more


def test_agreement_of_two_summaries():
    a = {"losses": [2.0, 1.9, 1.8, 1.7], "param_checksums": [10.0, -0.5]}
    b = {"losses": [2.0, 1.9, 1.8000001, 1.70003], "param_checksums": [10.0001, -0.5]}
    c = closeness(b, a)
    assert c["first_difference"] == 2 and c["first_over_1e-5"] == 3 and c["same_length"]
    assert c["max_loss_diff"] == pytest.approx(3e-5, rel=1e-3)
    assert c["max_scaled_diff"] == pytest.approx(3e-5 / 1.70003)
    assert c["jump"] == 3  # 1e-7 then 3e-5: a wrong state, not rounding grown
    assert identical_until_replan(c, 2) and not identical_until_replan(c, 3)
    assert identical_until_replan(closeness(a, a), None)
    assert not identical_until_replan(closeness(a, dict(a, losses=a["losses"][:3])), None)
    # rounding grows about 10x in 130 iterations: from 1e-7 to over 1e-5 with no jump
    grown = {"losses": [1.0 + 1e-7 * 1.02 ** i for i in range(300)], "param_checksums": [1.0]}
    flat = {"losses": [1.0] * 300, "param_checksums": [1.0]}
    g = closeness(grown, flat)
    assert g["first_over_1e-5"] is not None and g["jump"] is None
    assert first_replan({"plans": [{"version": 0, "first_iteration": 0},
                                   {"version": 3, "first_iteration": 40},
                                   {"version": 2, "first_iteration": 12}]}) == 12
    assert first_replan({"plans": [{"version": 0, "first_iteration": 0}]}) is None


def test_the_results_table_shows_each_case_and_its_ratio():
    agree = {"first_difference": 50, "first_over_1e-5": 400, "jump": None,
             "max_loss_diff": 3e-5, "max_scaled_diff": 3e-5, "same_length": True}
    row = {"case": "p3-g1-stages", "gpus_per_node": 1, "placement": "stages",
           "node_events": 67, "deaths": [7, 8], "halts": 0, "halt_reasons": [],
           "elastic": [{"trace_restarts": 7, "moves": 2, "restore_events": 1}] * 2,
           "simulated": {"kept": 0.98, "moves": 2, "snapshot_restores": 0},
           "simulated_delayed": {"kept": 0.95}, "window_iterations": [400, 410],
           "free_window_iterations": [450, 460], "realised": [0.89, 0.89],
           "realised_median": 0.89, "rounds": [0, 1], "halted_rounds": [],
           "realised_own_rate": [0.9, 0.92], "ratio": 0.89 / 0.98, "ratio_own_rate": 0.93,
           "ratio_delayed": 0.89 / 0.95, "vs_failure_free": [agree, agree],
           "vs_reference": [agree, dict(agree, max_scaled_diff=2e-5)], "first_replan": [48, 49],
           "identical_until_replan": True, "no_jump": True, "wall_s": [60, 61],
           "costs": {"iter_s": 18.0, "detect_s": 36.0, "start_s": 90.0}}
    args = SimpleNamespace(time_scale=180.0, d=2, s=3, m=2, model_args="--layers 3",
                           snapshot_every=5, checkpoint_every=50, trace_hours=2.0,
                           trace_start="1h", rounds=2)
    text = markdown([row], "Made by test.", args, 700, 40.0, 16, [agree])
    line = next(x for x in text.splitlines() if x.startswith("| P3, 1 GPU a node, stages"))
    assert "| 67 / 7, 8 / 7, 7 |" in line and "**0.91**" in line and "0.980" in line
    assert "6480 / 7280" in line  # samples in the window: 16 per iteration
    assert "| p3-g1-stages | 50/48, 50/49 | 400, 400 | -, - | 3e-05, 3e-05 | yes |" in text
    assert "| 0.890, 0.890 | 0.890 | 0.980 | **0.91** | 0.93 (0.900, 0.920) |" in line
    row.update(halted_rounds=[1], halts=1, no_jump=False,
               halt_reasons=["training halted: no copy; newest checkpoint /tmp/x"])
    text = markdown([row], "Made by test.", args, 700, 40.0, 16, [agree])
    assert "| 0.890, 0.890h | 0.890 |" in text and "| NO |" in text
    assert "- p3-g1-stages, round 1: training halted: no copy\n" in text
