"""A worker whose last slot and running stage differ (a plan of another shape gave it a
new slot, then was superseded before its state moved) takes the stage of its next slot,
not the one its last slot named (chaos seed 98 run 68: a worker running stage 2 was given
slot 1 of a cut, the cut was superseded by a plan of the old shape naming slot 1 again, and
it kept stage 2's module: its restore of stage 1 failed to load, the process exited 1)."""
from types import SimpleNamespace

from executor.runtime.entry import _move
from executor.runtime.stage_handle import StageHandle
from executor.runtime.worker_state import WorkerState


class _Stage:
    def __init__(self, s):
        self.stage, self.closed = s, False
        self.stepper = SimpleNamespace(unsettled=lambda: None, settle=lambda: None)

    def close(self):
        self.closed = True


def _agent(me, running):
    a = StageHandle.__new__(StageHandle)
    a.state = WorkerState((1, 2), me=me)
    a.stage, a.conf = _Stage(running), None
    a.new_stage = lambda s, conf=None: _Stage(s)
    a.log = lambda msg: None
    return a


def test_the_stage_it_runs_decides_whether_it_moves_not_its_last_slot():
    a = _agent(me=(1, 1), running=2)  # slot 1 given by the superseded cut, stage 2 running
    old = a.stage
    _move(a, (0, 1), SimpleNamespace(version=9))
    assert old.closed and a.stage.stage == 1 and a.state.fresh and a.state.me == (0, 1)


def test_a_slot_of_the_stage_it_runs_keeps_it():
    a = _agent(me=(1, 2), running=2)
    old = a.stage
    _move(a, (0, 2), SimpleNamespace(version=9))
    assert a.stage is old and not old.closed and not a.state.fresh
