"""A stage lost whole is replayed alone from its snapshot and its neighbours' boundary logs
(executor/runtime/replay/): the other stages keep their work, and the run ends equal to the
one-process reference. Real worker processes, real SIGKILLs."""
import re
from functools import lru_cache

import pytest

from executor.compute.config import TrainingSettings
from executor.compute.one_process.reference import compare, train_reference
from executor.inputs.launch_spec import Faults
from tests.test_executor_runtime import CFG, M, TOL, logs, run

pytestmark = pytest.mark.hard_timeout(120)


@lru_cache(maxsize=None)
def _reference(D, S, iterations, clip=0.0):
    return train_reference(CFG, D, M, iterations, S, training=TrainingSettings(clip=clip))


def _exact(res, D, S, iterations, tmp_path, clip=0.0):
    assert res.summary is not None, f"halted: {res.halted}\n{res.output}\n{logs(tmp_path)}"
    diffs = compare(res.summary, _reference(D, S, iterations, clip), TOL)
    assert not diffs, "\n".join(diffs) + "\n" + res.output
    return res.summary.elastic


def test_the_issue_run_replays_stage_1_and_the_survivors_keep_their_work(tmp_path):
    # `recycle train -d 2 -s 3 -m 4 --iterations 12 --snapshot-every 5 --kill 0:1@8
    # --kill 1:1@8`: the rollback to the snapshot of iteration 4 re-trained 3 iterations
    # on every stage; now stage 1 alone replays 5..7
    res = run(tmp_path, 2, 3, 12, snapshot_every=5,
              faults=Faults(kills=[(0, 1, 8), (1, 1, 8)]))
    el = _exact(res, 2, 3, 12, tmp_path)
    assert el["retrained_iterations"] <= 1 and el["replays"] == 1, el
    assert el["replayed_iterations"] == 3 and el["replay_s"] > 0, el
    assert el["log_mib_per_worker"] > 0, el
    text = logs(tmp_path)
    assert "replayed stage 1 iterations 5..7 from the boundary logs" in text, text
    assert "rolled back to iteration" not in text  # no global rollback
    assert any("stage 1 replayed iterations 5..7" in e for e in res.events), res.events
    assert [(x["kind"], x["stage"], x["first"], x["last"]) for x in el["lost_stages"]] == \
        [("replay", 1, 5, 7)], el


def test_log_memory_off_rolls_the_job_back_as_before(tmp_path):
    # checkpoints only at the end: the peer-memory tier alone (one on disk of every
    # iteration is newer: the next test)
    res = run(tmp_path, 2, 3, 12, snapshot_every=5, log_memory="off", checkpoint_every=100,
              faults=Faults(kills=[(0, 1, 8), (1, 1, 8)]))
    el = _exact(res, 2, 3, 12, tmp_path)
    assert el["replays"] == 0 and el["retrained_iterations"] == 3, el
    assert "rolled back to iteration 4 from peer-memory snapshots" in logs(tmp_path)
    assert [(x["kind"], x["to"], x["why"]) for x in el["lost_stages"]] == \
        [("rollback", 4, "boundary logs are off (--log-memory off)")], el


def test_the_last_stage_replays_with_the_clip_the_run_applied(tmp_path):
    # a clip of 0.5 applies at every iteration: the replayed steps scale by the norms the
    # survivors logged (every stage's), and the last stage's losses are its replay's
    res = run(tmp_path, 2, 3, 9, snapshot_every=3, training=TrainingSettings(clip=0.5),
              faults=Faults(kills=[(0, 2, 5), (1, 2, 5)]))
    el = _exact(res, 2, 3, 9, tmp_path, clip=0.5)
    assert el["replays"] == 1 and el["retrained_iterations"] <= 1, el
    assert re.search(r"replayed stage 2 iterations 3\.\.[45] from the boundary logs",
                     logs(tmp_path))


def test_a_dead_senders_missing_log_falls_back_to_the_global_rollback_and_says_why(tmp_path):
    # 0:0 dies at iteration 6 with what it sent of iteration 5; stage 1 then dies whole at
    # 8: its window (5..7) lacks 0:0's activations of 5, so the job rolls back to 4
    res = run(tmp_path, 2, 3, 12, snapshot_every=5, checkpoint_every=100,  # memory tier
              faults=Faults(kills=[(0, 0, 6), (0, 1, 8), (1, 1, 8)]))
    el = _exact(res, 2, 3, 12, tmp_path)
    assert el["replays"] == 0 and el["retrained_iterations"] >= 1, el
    (back,) = el["lost_stages"]
    assert back["kind"] == "rollback" and "iteration 5 into stage 1" in back["why"], el
    text = logs(tmp_path)
    assert re.search(r"cannot replay stage\(s\) \[1\] from the boundary logs \(no live worker "
                     r"logged the activation of micro-batch \d+, iteration 5 into stage 1\)",
                     text), text


TIED = "examples.tied_lm:TiedLM?split=" + ",".join(["emb", "blocks.0", "blocks.1", "norm", "head"])


@pytest.mark.parametrize("lost,clip", [(2, 0.0), (0, 0.05)], ids=["mirror", "owner-clipped"])
def test_a_stage_holding_a_tied_weight_replays_with_its_logged_shares(tmp_path, lost, clip):
    # the embedding of stage 0 is the head of stage 2 (2x3): a lost mirror copies the
    # owner's logged values after each replayed step; a lost owner adds the mirror's
    # logged gradient shares before its clip and step
    from executor.inputs.workload_name import load_workload
    training = TrainingSettings(clip=clip)
    res = run(tmp_path, 2, 3, 8, snapshot_every=3, training=training, model=TIED,
              faults=Faults(kills=[(0, lost, 5), (1, lost, 5)]))
    assert res.summary is not None, f"halted: {res.halted}\n{res.output}\n{logs(tmp_path)}"
    ref = train_reference(CFG, 2, M, 8, 3, training=training, workload=load_workload(TIED))
    diffs = compare(res.summary, ref, TOL)
    assert not diffs, "\n".join(diffs) + "\n" + res.output
    el = res.summary.elastic
    assert el["replays"] == 1 and el["retrained_iterations"] <= 1, (el, logs(tmp_path))


def test_a_newer_checkpoint_on_disk_than_any_snapshot_is_the_copy_the_job_rolls_back_to(tmp_path):
    """Issue 42: peer memory and disk are two tiers of one store. The same run with a
    checkpoint of every iteration: before, the job went back to the snapshot of iteration
    4 and trained 5..7 again; the checkpoint of iteration 7 is a copy of every stage (or of
    6, when stage 1's writer was SIGKILLed while its part of 7 was still being written)."""
    res = run(tmp_path, 2, 3, 12, snapshot_every=5, log_memory="off",
              faults=Faults(kills=[(0, 1, 8), (1, 1, 8)]))
    el = _exact(res, 2, 3, 12, tmp_path)
    m = re.search(r"rolled back to iteration (\d+) from the checkpoint on disk of iteration (\d+)",
                  logs(tmp_path))
    assert m and m.group(1) == m.group(2) and int(m.group(1)) in (6, 7), logs(tmp_path)
    assert el["retrained_iterations"] <= 2, el
    assert any("from the checkpoint on disk of iteration" in e for e in res.events), res.events


def test_a_boundary_log_whose_snapshots_never_come_empties_and_stops():
    """Issue 42 item 4: when `--snapshot-every auto` chooses off, no snapshot ever trims
    the log, which filled to its budget and kept it; it now empties and stops."""
    import torch

    from executor.runtime.replay.boundary_log import BoundaryLog
    log = BoundaryLog(10 ** 6, origin=-1)
    for it in range(3):
        log.keep(1, 0, it, 0, torch.ones(100))
    assert log.bytes > 0 and log.on
    log.off()
    assert log.bytes == 0 and not log.on and not log.entries
    log.keep(1, 0, 3, 0, torch.ones(100))
    assert log.bytes == 0
