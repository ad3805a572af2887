"""Workers that change stage at run time (docs/executor.md, "Moves"): real processes,
real SIGKILLs; every run equals the one-process reference, the stages' partition never
changes, only who runs each stage."""
import re

import pytest

from executor.launch.report.run_record import failed_by_iteration
from executor.inputs.launch_spec import Faults
from tests.test_executor_runtime import assert_exact, logs, run

pytestmark = pytest.mark.hard_timeout(120)


def test_3x3_kills_leave_stage_2_one_worker_and_a_stage_0_worker_moves_to_it(tmp_path):
    # after the kills stage 0 has three workers, stage 1 two, stage 2 one: the plan moves a
    # stage-0 worker to stage 2, where it loads the state from the live holder 2:2
    res = run(tmp_path, 3, 3, 5, faults=Faults(kills=[(0, 1, 1), (0, 2, 2), (1, 2, 2)]))
    assert_exact(res, 3, 3, 5, tmp_path)
    moved = [p for p in res.summary.plans if p.get("moves")]
    assert moved, res.summary.plans
    move = moved[-1]["moves"][0]
    assert (move["from_stage"], move["to_stage"], move["source"]) == (0, 2, "peer"), moved
    assert sum(1 for s in moved[-1]["roles"].values() if s[1] == 2) == 2
    assert any("moves from stage 0 to stage 2" in e for e in res.events), res.events
    assert f"worker {move['worker'].replace('.', ':')}" in logs(tmp_path)
    assert "moving from stage 0 to stage 2" in logs(tmp_path)


def test_two_moves_in_a_row_out_of_the_last_and_the_first_stage_stay_exact(tmp_path):
    # two kills in stage 2 move a stage-1 worker to the last stage (it starts computing
    # losses); then a kill in stage 1 moves a stage-0 worker there (it stops loading data)
    res = run(tmp_path, 3, 3, 5, faults=Faults(kills=[(0, 2, 1), (1, 2, 1), (0, 1, 2)]))
    assert_exact(res, 3, 3, 5, tmp_path)
    moves = [(m["from_stage"], m["to_stage"]) for p in res.summary.plans
             for m in p.get("moves", [])]
    assert moves == [(1, 2), (0, 1)], res.summary.plans
    el = res.summary.elastic
    assert (el["moves"], el["joins"], el["snapshot_restores"], el["retrained_iterations"]) == \
        (2, 0, 0, 0), el
    assert failed_by_iteration(res.summary.plans, 5)[-1] == [[1, 0], [1, 1], [1, 2]]


@pytest.mark.parametrize("log_memory", ["off", "10%"], ids=["rollback", "replay"])
def test_2x2_loses_both_workers_of_stage_1_and_finishes_from_peer_memory(tmp_path, log_memory):
    # no rejoin: a stage-0 worker moves to stage 1 and loads the snapshot it or its peer
    # holds. Without boundary logs the whole job rolls back to the snapshot's iteration, in
    # memory, and re-trains; with them (the default) stage 1 alone replays from the logs
    # (checkpoints only at the end: a checkpoint of every iteration on disk is a newer copy
    # than the snapshot, and the restore would take it: test_replay.py)
    res = run(tmp_path, 2, 2, 8, faults=Faults(kills=[(0, 1, 3), (1, 1, 5)]), snapshot_every=2,
              log_memory=log_memory, checkpoint_every=100)
    assert_exact(res, 2, 2, 8, tmp_path)
    el = res.summary.elastic
    assert el["snapshot_restores"] == 1, res.summary.plans
    log = logs(tmp_path)
    if log_memory == "off":
        # the snapshot is of iteration 1 or 3 (K=2): iterations after it up to 4 train again
        assert 1 <= el["retrained_iterations"] <= 3 and el["wall_s"] > 0, el
        assert "rolled back to iteration" in log and "from peer-memory snapshots" in log, log
    else:
        assert el["replays"] == 1 and el["retrained_iterations"] <= 1, el
        assert "from the boundary logs" in log and "rolled back to iteration" not in log, log
    assert failed_by_iteration(res.summary.plans, 8)[-1] == [[1, 0], [1, 1]]


@pytest.mark.parametrize("log_memory", ["off", "10%"], ids=["rollback", "replay"])
def test_a_stage_lost_before_its_first_snapshot_rolls_back_to_the_start(tmp_path, log_memory):
    # K = 50: no snapshot is ever taken in this run, so stage 1 dies with every copy of its
    # trained state. Its copy is the run's start (the seed): every stage is rebuilt there
    # and re-trained, or, with the boundary logs, stage 1 alone replays from it
    res = run(tmp_path, 2, 2, 6, faults=Faults(kills=[(0, 1, 1), (1, 1, 2)]), snapshot_every=50,
              log_memory=log_memory, checkpoint_every=100)  # (no newer copy on disk)
    assert_exact(res, 2, 2, 6, tmp_path)
    assert res.summary.elastic["snapshot_restores"] == 1, res.summary.plans
    log = logs(tmp_path)
    if log_memory == "off":
        assert "rolled back to iteration -1" in log and "from the seed" in log, log
    else:
        assert re.search(r"replayed stage 1 iterations 0\.\.\d from the boundary logs .*"
                         r"state of iteration -1 from the seed", log), log


def test_losing_a_stage_without_snapshots_restores_it_from_the_disk(tmp_path):
    """Issue 42: with snapshots off a stage lost whole halted the run, though its state was
    on disk (a checkpoint of every iteration) or at the start; the job now rolls back to
    the newest copy of every stage there."""
    res = run(tmp_path, 2, 2, 6, faults=Faults(kills=[(0, 1, 1), (1, 1, 2)]), snapshot_every=0)
    assert_exact(res, 2, 2, 6, tmp_path)
    assert any(re.search(r"rolled back to iteration -?\d+ from (the checkpoint on disk|the "
                         r"seed)", e) for e in res.events), res.events


def test_fewer_live_workers_than_stages_pause_until_a_restart_is_back(tmp_path):
    # three of four workers die one by one; the last death leaves 1 live worker for 2
    # stages: nothing is lost (stage 1's state is in peer memory or the seed), so the run
    # pauses instead of halting, and resumes when 1:1's restart is in, exact
    res = run(tmp_path, 2, 2, 8, faults=Faults(kills=[(0, 0, 2), (0, 1, 3), (1, 1, 4)],
                                               restarts=[(1, 1, 5)]), snapshot_every=1,
              shape="fixed")
    assert_exact(res, 2, 2, 8, tmp_path)
    el = res.summary.elastic
    assert el["pauses"] == 1 and el["paused_s"] > 0 and el["snapshot_restores"] == 1, el
    paused = [e for e in res.events if e.startswith("training paused")]
    assert paused == ["training paused: 1 live worker cannot serve 2 stages; waiting for "
                      "workers to come back (every stage's state has a copy in peer memory, "
                      "on disk or at the start)"]
    assert any(e.startswith("training resumes after") for e in res.events), res.events


def test_one_worker_left_of_four_trains_the_whole_model_alone_exact(tmp_path):
    """--shape auto (the default): the last live worker takes every stage's units (stage
    1's from its snapshot), trains on as a one-stage pipeline to the end, exact."""
    res = run(tmp_path, 2, 2, 8, faults=Faults(kills=[(0, 0, 2), (0, 1, 3), (1, 1, 4)]),
              snapshot_every=1)
    assert_exact(res, 2, 2, 8, tmp_path)
    assert res.summary.elastic["pauses"] == 0, res.events
    assert res.summary.plans[-1]["partition"]["bounds"] == [0, 2], res.summary.plans[-1]


def test_a_pause_nobody_comes_back_to_halts_with_the_reason(tmp_path):
    res = run(tmp_path, 2, 2, 8, faults=Faults(kills=[(0, 0, 2), (0, 1, 3), (1, 1, 4)]),
              snapshot_every=1, shape="fixed")
    assert res.summary is None
    assert res.halted == "1 live worker cannot serve 2 stages, and no worker is due back"
