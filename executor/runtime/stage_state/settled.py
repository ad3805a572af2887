"""What entering a plan version starts from, for every way in (stage_state/sync.py,
reshape.py): the last iteration a worker stepped for good, and the error when no live
worker holds some stage's state."""
from __future__ import annotations

from executor.runtime.stage_handle import StageHandle


class NoCopy(RuntimeError):
    """No live worker holds some stage's state, in training or in a snapshot."""


def settled(h: StageHandle) -> int:
    """The last iteration this worker stepped for good: a step still waiting for what a
    stage that died never published (its gradient norm, with the clip on; a tied weight's
    new value, on a mirror) cannot be settled, and is rolled back (the stage's replay
    steps it again)."""
    st = h.state
    stuck = None if st.fresh else h.stage.stepper.unsettled()
    return st.done if stuck is None else min(st.done, stuck - 1)
