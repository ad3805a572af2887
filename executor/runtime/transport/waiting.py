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
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

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
               missing: Optional[Callable[[], str]] = None,
               progress: Optional[Callable[[], object]] = None) -> None:
    """Return once done() is true. Every `check_s`, `newer()` (a newer plan or None): a
    plan that `leave_for` accepts ends the wait (WaitEnded, NEWER_PLAN). Past `limit_s`
    (None: no deadline) it ends with DEADLINE (`missing()` says what is still missing);
    with `progress`, `limit_s` counts from the last change of progress() (read each
    `limit_s`: a long job that moves is not a dead one). `late` = (seconds, callback):
    called once when the wait has lasted that long. Polls back off from `poll_s` to
    `max_poll_s` (a store round trip costs ~0.1 ms)."""
    start = checked = time.monotonic()
    mark = progress() if progress is not None else None
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
        if limit_s is not None and progress is not None and now - start > limit_s:
            moved = progress()
            if moved != mark:
                mark, start = moved, now
        if limit_s is not None and now - start > limit_s:
            raise WaitEnded(what, DEADLINE, limit_s=limit_s, peer=peer,
                            detail=missing() if missing is not None else "")
        time.sleep(poll_s)
        poll_s = min(2 * poll_s, max_poll_s)


def retried(call: Callable[[], T], what: str, *, patience_s: float,
            retry_on: tuple[type[BaseException], ...], first_s: float = 0.05,
            max_s: float = 1.0, stop: Optional[Callable[[], bool]] = None,
            on_retry: Optional[Callable[[BaseException], None]] = None) -> T:
    """call() until it raises none of `retry_on` (what an unreachable or restarting
    service raises), backing off from `first_s` to `max_s`; past `patience_s` (one number
    for every call to the service: Timeouts.service_outage) the last such error is raised
    again, and so it is at once when `stop()` says the caller is closing. `on_retry(e)`
    is told each failure (a warning once per outage, say). `what` names the call in a
    failure's note."""
    end = time.monotonic() + patience_s
    pause = first_s
    while True:
        try:
            return call()
        except retry_on as exc:
            if on_retry is not None:
                on_retry(exc)
            if time.monotonic() + pause > end or (stop is not None and stop()):
                exc.add_note(f"{what}: gave up after {patience_s:g} s")
                raise
        time.sleep(pause)
        pause = min(2 * pause, max_s)


def first(get: Callable[[], Optional[T]], what: str, *, limit_s: Optional[float],
          **kw) -> Optional[T]:
    """The first value get() returns that is not None (a long-poll's answer, a key's
    value), or None once `limit_s` is past (None: no deadline); the rest as wait_until.
    For a get() that itself blocks for a while (a long-poll), pass poll_s=0."""
    got: list = []

    def arrived() -> bool:
        value = get()
        if value is not None:
            got.append(value)
        return bool(got)
    try:
        wait_until(arrived, what, limit_s=limit_s, **kw)
    except WaitEnded as exc:
        if exc.reason != DEADLINE:
            raise
        return None
    return got[0]
