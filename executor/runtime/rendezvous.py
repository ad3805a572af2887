"""The store-side protocol between the in-process coordinator and its workers.

One TCPStore, hosted by the coordinator, carries everything (no HTTP in this mode):
  config                 run configuration JSON (model, job spec, iterations, paths)
  plan/version           counter = newest published version + 1 (0: none yet)
  plan/{v}               the plan JSON of version v
  halted                 reason text, once no plan can exist
  committed              newest iteration every live worker has stepped (snapshot pruning)
  hold                   counter = iteration + 1 before which workers wait for a newer plan
                         (a scheduled rejoin is due); 0: none. Armed and released only by
                         the coordinator; a halt holds every iteration (1), so a worker
                         between iterations looks at `halted` at once
  inc/{r}:{s}            incarnation counter: each process of a worker takes the next number
  hb/{r}:{s}             heartbeat "time iteration incarnation"
  go/{r}:{s}/{inc}/{it}  the coordinator has acted on a fault due at that mid-iteration
  mb/{r}:{s}/{inc}/{n}   the worker's n-th message to the coordinator (JSON)
Messages are written under a key per (worker, incarnation, sequence) rather than through a
shared counter, so a worker SIGKILLed mid-write can never leave a hole others wait on.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Iterator, Optional

import torch.distributed as dist

from executor.sources.plan_source import TrainingHalted
from planner.plan import Plan

Worker = tuple[int, int]


def wkey(w: Worker) -> str:
    return f"{w[0]}:{w[1]}"


def read_int(store: dist.Store, key: str) -> int:
    return int(store.add(key, 0))


GATE_KEYS = ("plan/version", "hold", "committed")  # counters read before every iteration


class StorePlanSource:
    """PlanSource over the coordinator's store (one per worker process). Thread-safe:
    the heartbeat thread and the worker loop share it."""

    def __init__(self, store: dist.Store, me: Worker, incarnation: int, poll_s: float = 0.02):
        self.store, self.me, self.inc, self.poll_s = store, me, incarnation, poll_s
        self._seq = 0
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
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self.store.check(["halted"]):
                    raise TrainingHalted(self.store.get("halted").decode())
                newest = read_int(self.store, "plan/version") - 1
                if newest > after_version:
                    return Plan.from_json(self.store.get(f"plan/{newest}").decode())
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_s)

    def heartbeat(self, replica: int, stage: int, iteration: int, incarnation: int = 1,
                  compute=None) -> None:
        """`compute` (iteration, seconds per micro-batch) rides along with the service; the
        coordinator gets it with each step's `done` message instead."""
        with self._lock:
            self.store.set(f"hb/{replica}:{stage}", f"{time.time()} {iteration} {incarnation}")

    def report_suspect(self, replica: int, stage: int, reason: str) -> None:
        self.send("suspect", peer=[replica, stage], reason=reason)

    def rejoin(self, version: int) -> None:
        """Plan `version` does not admit this process: ask to be planned in."""
        self.send("ready", inc=self.inc)

    def held(self, iteration: int) -> bool:
        with self._lock:
            hold = read_int(self.store, "hold") - 1
        return 0 <= hold <= iteration

    def await_go(self, iteration: int, timeout_s: float) -> None:
        key = f"go/{wkey(self.me)}/{self.inc}/{iteration}"
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if self.store.check([key]):
                    return
            time.sleep(self.poll_s)

    # ---- worker -> coordinator --------------------------------------------------------
    def send(self, kind: str, **fields) -> None:
        msg = dict(fields, t=kind, r=self.me[0], s=self.me[1], v=self.version, inc=self.inc)
        with self._lock:
            self._seq += 1
            self.store.set(f"mb/{wkey(self.me)}/{self.inc}/{self._seq}", json.dumps(msg))

    def committed(self) -> int:
        with self._lock:
            return read_int(self.store, "committed") - 1


class Mailbox:
    """Coordinator side: reads each worker incarnation's messages in order."""

    def __init__(self, store: dist.Store):
        self.store = store
        self._next: dict[tuple[Worker, int], int] = {}

    def drain(self, workers: dict[Worker, int]) -> Iterator[dict]:
        """`workers` maps each worker to its current incarnation."""
        for w, inc in workers.items():
            n = self._next.get((w, inc), 1)
            while self.store.check([f"mb/{wkey(w)}/{inc}/{n}"]):
                yield json.loads(self.store.get(f"mb/{wkey(w)}/{inc}/{n}"))
                n += 1
            self._next[(w, inc)] = n


def publish_plan(store: dist.Store, plan: Plan) -> None:
    """Write the plan first, then bump the counter: a reader never sees a missing plan."""
    store.set(f"plan/{plan.version}", plan.to_json())
    current = read_int(store, "plan/version")
    store.add("plan/version", plan.version + 1 - current)


def set_counter(store: dist.Store, key: str, value: int) -> None:
    store.add(key, value - read_int(store, key))
