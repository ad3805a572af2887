"""The worker's side of the store protocol (executor/protocol.py names every key and
message): its plan source over the coordinator's store, and the coordinator's mailbox.

A message is one queue_push, applied whole by the store or not at all, so a worker
SIGKILLed mid-write can never leave a hole others wait on. The coordinator blocks on the
queue in the store (Mailbox) instead of polling a key per worker: polling cost it 9 store
round trips an iteration, each taking a core from the workers on a busy host.
"""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Iterator, Optional

import torch.distributed as dist

from executor import protocol as P
from executor.protocol import GATE_KEYS, MAILBOX, Message
from executor.runtime.transport.waiting import WaitEnded, first, wait_until
from executor.sources.plan_source import TrainingHalted
from planner.plan import Plan

Worker = tuple[int, int]


def read_int(store: dist.Store, key: str) -> int:
    return int(store.add(key, 0))


class StorePlanSource:
    """PlanSource over the coordinator's store (one per worker process). Thread-safe:
    the heartbeat thread and the worker loop share it."""

    def __init__(self, store: dist.Store, me: Worker, incarnation: int, poll_s: float = 0.02):
        self.store, self.me, self.inc, self.poll_s = store, me, incarnation, poll_s
        self._lock = threading.Lock()
        self.version = -1  # version of the plan the worker acts on, stamped on messages
        for key in GATE_KEYS:  # gate() reads them in one multi_get, which waits for missing keys
            store.add(key, 0)

    def gate(self, after_version: int, iteration: int) -> tuple[Optional[Plan], bool, int]:
        """Before `iteration`, in one store round trip (four before: 0.2-0.45 ms an
        iteration of the worker's critical path here): a plan newer than `after_version`
        or None, whether the coordinator holds the iteration, and the committed iteration.
        A halt shows as a hold, which the caller resolves through wait_for_plan."""
        with self._lock:
            version, hold, committed = (int(v) for v in self.store.multi_get(list(GATE_KEYS)))
        newer = self.wait_for_plan(after_version, 0) if version - 1 > after_version else None
        return newer, 0 <= hold - 1 <= iteration, committed - 1

    # ---- PlanSource ----------------------------------------------------------------
    def wait_for_plan(self, after_version: int, timeout_s: float) -> Optional[Plan]:
        return first(lambda: self._newest(after_version), "a newer plan", limit_s=timeout_s,
                     poll_s=self.poll_s, max_poll_s=self.poll_s)

    def _newest(self, after_version: int) -> Optional[Plan]:
        """The newest plan if newer than `after_version`; a halt raises TrainingHalted."""
        with self._lock:
            if self.store.check([P.HALTED]):
                raise TrainingHalted(self.store.get(P.HALTED).decode())
            newest = read_int(self.store, P.PLAN_VERSION) - 1
            if newest > after_version:
                return Plan.from_json(self.store.get(P.plan_key(newest)).decode())
        return None

    def heartbeat(self, replica: int, stage: int, iteration: int, incarnation: int = 1,
                  compute=None, entered=None) -> None:
        """`compute` (iteration, seconds per micro-batch) and `entered` ride along with the
        service; the coordinator gets them from the `done` messages instead."""
        with self._lock:
            self.store.set(P.heartbeat_key((replica, stage)),
                           f"{time.time()} {iteration} {incarnation}")

    def report_suspect(self, replica: int, stage: int, reason: str) -> None:
        self.send(P.Suspect(peer=[replica, stage], reason=reason))

    def rejoin(self, version: int) -> None:
        """Plan `version` does not admit this process: ask to be planned in."""
        self.send(P.Ready())

    def held(self, iteration: int) -> bool:
        with self._lock:
            hold = read_int(self.store, P.HOLD) - 1
        return 0 <= hold <= iteration

    def await_go(self, iteration: int, timeout_s: float) -> bool:
        """The coordinator's go at a fault point: True, or False when it has not answered
        within `timeout_s` (the iteration goes on: no fault lands there)."""
        key = P.go_key(self.me, self.inc, iteration)

        def given() -> bool:
            with self._lock:
                return self.store.check([key])
        try:
            wait_until(given, f"the coordinator's go at iteration {iteration}",
                       limit_s=timeout_s, poll_s=self.poll_s, max_poll_s=self.poll_s)
        except WaitEnded:
            return False
        return True

    # ---- worker -> coordinator --------------------------------------------------------
    def send(self, msg: Message) -> None:
        """`msg` (protocol.py), stamped with who sends it and the version it acts on."""
        msg.r, msg.s, msg.v, msg.inc = self.me[0], self.me[1], self.version, self.inc
        with self._lock:
            self.store.queue_push(MAILBOX, msg.to_json())

    def committed(self) -> int:
        with self._lock:
            return read_int(self.store, P.COMMITTED) - 1


class Mailbox:
    """Coordinator side: the workers' messages as they come. A thread blocks in the store
    on the queue, over a connection of its own, and hands each message over, so waiting
    for messages costs no round trips and a message is seen at once."""

    def __init__(self, store: dist.Store):
        self.store = store
        self._got: queue.Queue = queue.Queue()
        self._held: list[Message] = []  # taken by wait(), not yet drained
        self._inc: dict[Worker, int] = {}  # each worker's newest process, as last read
        self.reader: Optional[threading.Thread] = None  # started by the first wait/drain

    def _start(self) -> None:
        # Its own client, woken by close(), never by a timeout. close() must be called and
        # joins it: a thread still blocked in the store when the interpreter exits aborts
        # the process ("terminate called without an active exception").
        for attempt in range(3):  # the store is our own, on loopback: a connect that timed
            try:                  # out is a starved machine (CI with every core busy)
                self._conn = self.store.clone()
                break
            except dist.DistNetworkError:
                if attempt == 2:
                    raise
        self._conn.set_timeout(timedelta(days=1))
        self.reader = threading.Thread(target=self._read, name="recycle-mailbox", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                raw = self._conn.queue_pop(MAILBOX, True)
            except Exception:  # the store is gone: so is the coordinator
                return
            if raw == _CLOSE:
                return
            self._got.put(Message.parse(raw))

    def wait(self, timeout_s: float) -> None:
        """Return when a message is there to drain, or after timeout_s."""
        if self.reader is None:
            self._start()
        if not self._held:
            try:
                self._held.append(self._got.get(timeout=timeout_s))
            except queue.Empty:
                pass

    def drain(self) -> Iterator[Message]:
        """The messages so far, in order, from each worker's newest process: a message
        from a process not heard from before, or after forget(), makes its counter be read
        again (inc/{r}:{s}); an older process's messages are dropped."""
        if self.reader is None:
            self._start()
        while True:
            if self._held:
                m = self._held.pop(0)
            else:
                try:
                    m = self._got.get_nowait()
                except queue.Empty:
                    return
            w = m.worker
            if m.inc != self._inc.get(w):
                self._inc[w] = read_int(self.store, P.incarnation_key(w))
            if m.inc == self._inc[w]:
                yield m

    def forget(self, w: Worker) -> None:
        """w's process is gone: read its counter again at its next message (a late one
        from the gone process is then dropped once the next process has started)."""
        self._inc.pop(w, None)

    def close(self) -> None:
        """Stop the reader (it blocks in the store until a message comes: this one) and
        wait for it."""
        if self.reader is None:
            return
        try:
            self.store.queue_push(MAILBOX, _CLOSE)
        except Exception:  # the store is gone already: so is the reader
            pass
        self.reader.join(10.0)


_CLOSE = b"{}"  # what close() pushes to wake the reader: no message is empty


def publish_plan(store: dist.Store, plan: Plan) -> None:
    """Write the plan first, then bump the counter: a reader never sees a missing plan."""
    store.set(P.plan_key(plan.version), plan.to_json())
    current = read_int(store, P.PLAN_VERSION)
    store.add(P.PLAN_VERSION, plan.version + 1 - current)


def set_counter(store: dist.Store, key: str, value: int) -> None:
    store.add(key, value - read_int(store, key))
