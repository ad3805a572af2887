"""The one way a worker waits for something another process does (docs/executor.md,
"Waiting"): poll `done()` with back-off, ask now and then whether a newer plan is out (a
member may be dead: what we wait for may never come), stop at a deadline. Every wait of
the runtime goes through `wait_until` and ends, when it gives up, in one exception type,
`WaitEnded`, whose `reason` says why (the agent handles them all alike: abort the
iteration, take the newer plan or report the suspect).

The numbers are `Timeouts`' (executor/timeouts.py), all derived from `--timeout`.
"""
from __future__ import annotations

import re
import time
from typing import Callable, Optional

Worker = tuple[int, int]

DEADLINE = "deadline"
NEWER_PLAN = "newer plan"

# gloo and NCCL start their errors with the C++ source they came from:
# "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed"
_SOURCE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def said(exc: BaseException, limit: int = 200) -> str:
    """What a backend's error says, for a log line or a reason a person reads: its first
    line, without the C++ source location, at most `limit` characters."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _SOURCE.sub("", text)[:limit] or type(exc).__name__


class CommError(RuntimeError):
    """Communication with a peer failed (it died, hung, or left for a newer plan): the
    iteration in flight is aborted and the worker takes the newest plan."""

    def __init__(self, msg: str, peer: Optional[Worker] = None):
        super().__init__(msg)
        self.peer = peer


class WaitEnded(CommError):
    """A wait that ended without what it waited for: `reason` is DEADLINE, or NEWER_PLAN
    with `plan` the plan to take (the agent enters it without asking again)."""

    def __init__(self, what: str, reason: str, *, limit_s: Optional[float] = None,
                 plan=None, peer: Optional[Worker] = None, detail: str = ""):
        msg = (f"{what}: timed out after {limit_s:g} s" if reason == DEADLINE
               else f"{what}: superseded by plan v{getattr(plan, 'version', '?')}")
        super().__init__(msg + (f" ({detail})" if detail else ""), peer)
        self.what, self.reason, self.plan = what, reason, plan


def wait_until(done: Callable[[], bool], what: str, *, limit_s: Optional[float],
               newer: Optional[Callable[[], object]] = None,
               leave_for: Callable[[object], bool] = lambda plan: True,
               peer: Optional[Worker] = None, poll_s: float = 0.0002,
               max_poll_s: float = 0.002, check_s: float = 0.2,
               late: Optional[tuple[float, Callable[[], None]]] = None,
               missing: Optional[Callable[[], str]] = None) -> None:
    """Return once done() is true. Every `check_s`, `newer()` (a newer plan or None): a
    plan that `leave_for` accepts ends the wait (WaitEnded, NEWER_PLAN). Past `limit_s`
    (None: no deadline) it ends with DEADLINE (`missing()` says what is still missing).
    `late` = (seconds, callback): called once when the wait has lasted that long. Polls
    back off from `poll_s` to `max_poll_s` (a store round trip costs ~0.1 ms)."""
    start = checked = time.monotonic()
    while not done():
        now = time.monotonic()
        if newer is not None and now - checked >= check_s:
            checked = now
            plan = newer()
            if plan is not None and leave_for(plan):
                raise WaitEnded(what, NEWER_PLAN, plan=plan, peer=peer)
        if late is not None and now - start > late[0]:
            late[1]()
            late = None
        if limit_s is not None and now - start > limit_s:
            raise WaitEnded(what, DEADLINE, limit_s=limit_s, peer=peer,
                            detail=missing() if missing is not None else "")
        time.sleep(poll_s)
        poll_s = min(2 * poll_s, max_poll_s)
