"""`recycle chaos`'s harsher kinds (issue 42 item 5) end to end, one short hand-written
schedule of each: a pause (fewer live workers than any shape runs on, every one due back),
a worker killed again in the iteration it returns at, the whole job SIGKILLed and resumed
from its checkpoints on another grid of the same global batch, and the module-factory
models (DropoutGPT: dropout; the MLP Workload) through a kill and a rejoin. Each must be
exact against the one-process reference of its final grid and leave no process behind."""
from __future__ import annotations

import pytest

from recycle.chaos.runner import run_schedule
from recycle.chaos.schedule import Fault, Resume, Schedule


def _s(D, S, M, N, *faults, **kw) -> Schedule:
    return Schedule(0, 0, D, S, M, N, tuple(Fault(*f) for f in faults), **kw)


SCHEDULES = {
    # 2x2 under --shape fixed: three of four killed in iteration 2 -> paused until they
    # are back (the coordinator starts them at once while paused)
    "pause": _s(2, 2, 2, 6, ("kill", (0, 0), 2, None, "pause"),
                ("kill", (1, 0), 2, None, "pause"), ("kill", (0, 1), 2, None, "pause"),
                ("rejoin", (0, 0), 3), ("rejoin", (1, 0), 3), ("rejoin", (0, 1), 3),
                shape="fixed"),
    # back at 2, killed again mid-2
    "rejoined kill": _s(2, 2, 2, 6, ("kill", (0, 0), 1, None, "random"),
                        ("rejoin", (0, 0), 2), ("kill", (0, 0), 2, None, "rejoined")),
    # a kill, then the job SIGKILLed after iteration 2 and resumed on 1x2 (M 2 -> 4),
    # with a stall in the resumed run
    "resume": _s(2, 2, 2, 6, ("kill", (1, 1), 1, None, "random"),
                 resume=Resume(2, 1, 2, 4, (Fault("stall", (0, 1), 4, 0.5),))),
    "dropout": _s(2, 2, 2, 5, ("kill", (1, 1), 1, None, "random"), ("rejoin", (1, 1), 2),
                  model="dropout"),
    # the MLP Workload resumed on the same grid after a kill
    "mlp": _s(2, 2, 2, 5, ("kill", (0, 1), 1, None, "random"), model="mlp",
              resume=Resume(2, 2, 2, 2, ())),
}


# "rejoined kill" in the default run (.ci/run); the others are the `slow` tier
# (`pytest -m slow`): the pause and the resume on another grid have their own tests in the
# default run (test_pause_not_halt.py, test_checkpoint_any_shape.py)
KINDS = [k if k == "rejoined kill" else pytest.param(k, marks=pytest.mark.slow)
         for k in sorted(SCHEDULES)]


@pytest.mark.hard_timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_each_harsher_kind_runs_exact_and_leak_free(tmp_path, kind):
    sched = SCHEDULES[kind]
    assert kind in sched.kinds()
    rec = run_schedule(sched, str(tmp_path), time_limit_s=240)
    detail = {k: rec.get(k) for k in ("outcome", "error", "note", "command", "first_command",
                                      "resumed_from", "max_diff", "leaks", "log")}
    try:
        log = open(rec["log"]).read()[-4000:]
    except OSError:
        log = ""
    assert rec["outcome"] == "exact", (detail, log)
    assert rec["leaks"] == [] and not rec.get("job_kill_lingering"), detail
    if sched.resume is not None:
        assert rec["resumed_from"], detail  # a checkpoint was there to resume from
