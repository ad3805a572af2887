"""When a membership change is due: the timing rules, as pure functions of the clock.

The local coordinator (executor/launch/) and the plan service (api/) apply the same rules
with their own limits (`Patience`); membership.py decides what a due change does, and
decision_plan.py turns the decision into a plan. As torchft's `quorum_compute`: values
in, a verdict out, no store, no process, no clock of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass(frozen=True)
class Patience:
    """The limits one deployment runs by (seconds)."""
    silent: float  # a watched worker silent this long is dead
    suspect_grace: float  # once a peer reported it suspect, silent this long is dead
    resync_after: float  # a suspect with nobody dead: the same members re-published after
    # a paused run with nobody due back gives up after this (None: it waits for an operator)
    pause_limit: Optional[float] = None


def dead_at(last_beat: float, patience: Patience, suspected: bool) -> float:
    """When a worker last heard from at `last_beat` is declared failed by silence: a
    suspect report cuts the full patience to the grace (a worker blocked in a collective
    still beats, so silence after a suspect is a death, not slowness)."""
    wait = min(patience.silent, patience.suspect_grace) if suspected else patience.silent
    return last_beat + wait


def resync_due(suspected_at: Optional[float], now: float, patience: Patience) -> bool:
    """A peer's comm op failed and nobody died: re-publish once `resync_after` has passed,
    so a worker still blocked in the old version's op can reach the new one (sooner, the
    workers chased versions forever). Membership.resync refuses it when paused or already
    superseded."""
    return suspected_at is not None and now - suspected_at > patience.resync_after


Admission = Literal["stale", "wait", "admit"]


def admission(incarnation: int, admitted: int, alive: bool, survivors_entered: bool,
              paused: bool) -> Admission:
    """A newer process of a dead worker asks in. `stale`: an incarnation the plan already
    admits, or a process that died meanwhile (it would be waited for); `wait`: until every
    survivor entered the plan that has the worker failed, so no survivor is still in a
    world that includes the dead process; `admit`: publish the plan that includes it. A
    paused run has no such plan (its survivors may never enter the last one): at once."""
    if not alive or incarnation <= admitted:
        return "stale"
    return "admit" if paused or survivors_entered else "wait"


def pause_verdict(reason: str, paused_for: Optional[float], patience: Patience,
                  coming_back: bool, open_ended: bool) -> Optional[str]:
    """A paused run (fewer live workers than the pipeline needs) waits while a worker may
    come back; `open_ended` (a replayed trace with nodes yet to add) waits for as long as
    it runs. The halt reason once it gives up, else None."""
    if paused_for is None:
        return None
    if not coming_back:
        return f"{reason}, and no worker is due back"
    if not open_ended and patience.pause_limit is not None and paused_for > patience.pause_limit:
        return f"{reason}, and none came back within {paused_for:.0f} s"
    return None
