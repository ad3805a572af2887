"""Entering a version, decided: a pure function of what the members all-gathered, lowered
into steps that sync.py runs through a handler table (as planner/lowering.py lowers a
plan into an iteration's steps). No I/O here: the same rows give every member the same
decision, and a test can walk every case without a process.

The rows: for each member of the new world, (last settled iteration, holds no state).
  - every stage has a member with state: RESUME at r = 1 + the lowest iteration such a
    member settled; each member's steps: roll back to r if ahead, else settle its last
    step; keep nothing of r or later; then a member with no state receives its stage's
    from the lowest member of its stage that has one, and that member sends it to each;
  - no member has state: RESTORE (every stage from the newest copy in some tier:
    restore_plan.py);
  - some stages have no member with state: LOST (those stages are replayed from the
    boundary logs, or the job restores, after one more gather: replayer.py); the
    survivors' own steps are RESUME's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

Worker = tuple[int, int]


class EntryOp(str, Enum):
    ROLLBACK = "ROLLBACK"  # back to the state before step `it` (its own pre-step copies)
    SETTLE = "SETTLE"  # its last step made final (a clip's redo, a tied weight's value)
    KEEP_BEFORE = "KEEP_BEFORE"  # forget copies and logs of iterations >= `it`
    RECV_STATE = "RECV_STATE"  # its stage's state from `peer`
    SEND_STATE = "SEND_STATE"  # its stage's state to each of `peers`


@dataclass(frozen=True)
class EntryStep:
    op: EntryOp
    it: Optional[int] = None
    peer: Optional[Worker] = None
    peers: tuple[Worker, ...] = ()


class EntryKind(str, Enum):
    RESUME = "resume"
    RESTORE = "restore"
    LOST = "lost"


@dataclass(frozen=True)
class EntryDecision:
    kind: EntryKind
    iteration: int  # RESUME/LOST: r, the iteration the survivors train next; RESTORE: -1
    top: int  # the newest iteration a member had settled (what a restore trains again)
    lost: tuple[int, ...] = ()  # LOST: the stages no member holds
    steps: tuple[EntryStep, ...] = field(default=())  # this member's, RESUME/LOST survivors


def plan_entry(rows: dict[Worker, tuple[int, bool]], me: Worker, done: int,
               stages: int) -> EntryDecision:
    """`rows`: member -> (last settled iteration, holds no state); `me` and its own last
    stepped iteration `done` (a step it cannot settle is still rolled back)."""
    served = {w[1] for w, (_, fresh) in rows.items() if not fresh}
    top = max(settled for settled, _ in rows.values())
    if not served:
        return EntryDecision(EntryKind.RESTORE, -1, top)
    r = min(settled for settled, fresh in rows.values() if not fresh) + 1
    lost = tuple(sorted(set(range(stages)) - served))
    kind = EntryKind.LOST if lost else EntryKind.RESUME
    steps = _resume_steps(rows, me, done, r) if me[1] not in lost else ()
    return EntryDecision(kind, r, top, lost, steps)


def _resume_steps(rows: dict, me: Worker, done: int, r: int) -> tuple[EntryStep, ...]:
    fresh = rows[me][1]
    out = []
    if not fresh:
        out.append(EntryStep(EntryOp.ROLLBACK, r) if done >= r else EntryStep(EntryOp.SETTLE))
    out.append(EntryStep(EntryOp.KEEP_BEFORE, r))
    peers = sorted(w for w in rows if w[1] == me[1])
    donors = [w for w in peers if not rows[w][1]]
    takers = tuple(w for w in peers if rows[w][1])
    if fresh:
        out.append(EntryStep(EntryOp.RECV_STATE, peer=donors[0]))
    elif takers and me == donors[0]:
        out.append(EntryStep(EntryOp.SEND_STATE, peers=takers))
    return tuple(out)
