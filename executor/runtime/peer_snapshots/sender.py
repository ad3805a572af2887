"""PeerSnapshots: a worker's side of peer-memory snapshots (docs/executor.md).

Each worker process runs a SnapshotHost (other stages' snapshots it is asked to keep)
and keeps its own stage's state at its snapshot iterations (local.py). Every K-th
iteration the agent calls `offer()` right after its optimizer step: the state is copied
to host memory there (the only cost on the critical path), and if this worker is its
stage's writer the copy is queued for the stage's holder (planner/control/
snapshot_holders.py, from the plan in force). A background thread streams it (wire.py:
straight from the host buffers, in 1 MB pieces, each socket call without the GIL), then
marks it complete in the store; latest wins: an offer that arrives while one is still
queued replaces it. So the copy travels while the trainer computes or waits, as Gemini
streams its in-memory checkpoints in idle time.
"""
from __future__ import annotations

import socket
import statistics
import threading
import time
from typing import Callable, Optional

from executor.protocol import SNAP_DONE
from executor.runtime.peer_snapshots.cadence import Cadence
from executor.runtime.peer_snapshots.client import publish_address, put_snapshot
from executor.runtime.peer_snapshots.host import SnapshotHost
from executor.runtime.peer_snapshots.local import HostCopy, LocalCopies
from executor.runtime.peer_snapshots.wire import SnapshotError

DONE_KEY = SNAP_DONE  # the newest iteration of stage s complete at its holder


def reachable_host(store) -> str:
    """The address of this machine that the store's host reaches (so do the other
    workers): loopback for a local run, else the interface routing to the store."""
    host = getattr(store, "host", None) or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 1))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


class PeerSnapshots:
    def __init__(self, store, worker: str, every: int, stages: int, *,
                 timeout_s: float = 30.0, log: Optional[Callable[[str], None]] = None,
                 bind_host: Optional[str] = None, max_copies: int = 3,
                 node_of=None, first: int = 0, budget: int = 2 ** 62):
        if every == 0 or every < -1:
            raise ValueError(f"snapshot_every must be at least 1 or auto (0 is no "
                             f"PeerSnapshots), not {every}")
        self.store, self.worker, self.stages = store, worker, stages
        # which iterations: every K, or auto (K from the first snapshot's measured cost)
        self.cadence = Cadence(every, stages, first, store, budget, log or (lambda m: None))
        self.timeout_s, self.node_of = timeout_s, node_of
        self.log = log or (lambda msg: None)
        self.host = SnapshotHost(bind_host or reachable_host(store), io_timeout_s=timeout_s,
                                 log=self.log)
        publish_address(store, worker, self.host.address)
        self.local = LocalCopies(max_copies, self.log)
        self._holders: tuple[int, dict] = (-1, {})  # (plan version, stage -> holder)
        self._cv = threading.Condition()
        self._queue: Optional[tuple[int, HostCopy, Optional[str]]] = None
        self._closed = False
        self._conn = None  # the thread's own store connection (the agent's is not shared)
        self.sent, self.dropped, self.failed = 0, 0, 0
        self._calibrating: Optional[tuple[int, float, bool]] = None  # (it, copy_s, writer)
        self.send_s: list[float] = []
        threading.Thread(target=self._run, name="snapshot-sender", daemon=True).start()

    # ---- the training thread ------------------------------------------------------------
    def due(self, iteration: int) -> bool:
        return self.cadence.due(iteration)

    @property
    def every(self) -> Optional[int]:
        """K in force (0: off; None: auto, not chosen yet)."""
        return None if self.cadence.choice is None else self.cadence.choice.every

    def follow(self, plan) -> None:
        """The holders of `plan` (once per version)."""
        if self._holders[0] != plan.version:
            from planner.control.snapshot_holders import plan_holders
            self._holders = (plan.version, plan_holders(plan, self.node_of))

    def holder_of(self, stage: int) -> Optional[str]:
        return self._holders[1].get(stage)

    def offer(self, stage: int, iteration: int, state, send: bool = True) -> HostCopy:
        """Keep `state` (tree of live tensors; the final state after step `iteration`)
        as this stage's copy of `iteration`, and with `send` stream it to the stage's
        holder in the background."""
        copy = self.local.take(iteration, state, stage)
        if iteration == self.cadence.first and self.cadence.choice is None:
            self._calibrating = (iteration, self.local.copy_s[-1], send)
        holder = self.holder_of(stage) if send else None
        if holder == self.worker:
            holder = None  # (never chosen: a holder is never of its own stage)
        with self._cv:
            if self._queue is not None and self._queue[2] is not None:
                self.dropped += 1  # latest wins: the queued one never left
            if self._queue is not None:
                self.local.done_with(self._queue[1])
            self.local.use(copy)
            self._queue = (stage, copy, holder)
            self._cv.notify()
        return copy

    def reshaped(self, stages: int, floor: int) -> None:
        """The job now runs `stages` stages of other units from iteration `floor` on: the
        copies and snapshots of the old shape go (stage_state/reshape.py)."""
        self.stages = self.cadence.stages = stages
        self.local.drop_after(-(2 ** 62))
        self.local.stage = None
        self.host.reset(floor)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self.host.close()

    # ---- the background thread ----------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while self._queue is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                (stage, copy, holder), self._queue = self._queue, None
            try:
                cpu0 = time.thread_time()  # the send's CPU: what it takes from the trainers
                if holder is not None:
                    self._send(stage, copy, holder)
                self._measured(stage, copy, time.thread_time() - cpu0)
                self._prune()
            except Exception as exc:  # the sender must never take the worker down
                self.log(f"snapshot: {type(exc).__name__}: {exc}")
            finally:
                self.local.done_with(copy)

    def _measured(self, stage: int, copy: HostCopy, send_cpu_s: float) -> None:
        """The calibration snapshot's cost, once its send is over (cadence.py)."""
        cal = self._calibrating
        if cal is not None and cal[0] == copy.iteration:
            self._calibrating = None
            self.cadence.measured(stage, cal[1], send_cpu_s, copy.nbytes, writer=cal[2],
                                  store=self._store())

    def _send(self, stage: int, copy: HostCopy, holder: str) -> None:
        t0 = time.perf_counter()
        copy.ready()
        try:
            put_snapshot(self._store(), holder, stage, copy.iteration, copy.tree, copy.bufs,
                         copy.spec, copy.nbytes, self.timeout_s, pause=_yield)
        except SnapshotError as exc:
            self.failed += 1
            self.log(f"snapshot of stage {stage} iteration {copy.iteration} to worker "
                     f"{holder} failed: {exc}")
            return
        self.send_s.append(time.perf_counter() - t0)
        self.sent += 1
        self._store().set(DONE_KEY.format(stage), str(copy.iteration))

    def _prune(self) -> None:
        """Keep the local copies a rollback may need: from the lowest stage's newest
        snapshot complete at its holder on (local.py)."""
        if len(self.local.iterations()) < 2:
            return
        keys = [DONE_KEY.format(s) for s in range(self.stages)]
        conn = self._store()
        if not conn.check(keys):
            return  # some stage has no snapshot anywhere yet: keep (up to max_copies)
        self.local.keep_from(min(int(v) for v in conn.multi_get(keys)))

    def _store(self):
        if self._conn is None:  # a client of its own: the agent's is used by its thread
            clone = getattr(self.store, "clone", None)
            self._conn = clone() if clone is not None else self.store
        return self._conn

    # ---- figures ------------------------------------------------------------------------
    def stats(self) -> dict:
        copy = self.local.copy_s
        return {"every": self.every, "offers": len(copy), "sent": self.sent, "dropped": self.dropped,
                "failed": self.failed,
                "copy_ms_median": 1e3 * statistics.median(copy) if copy else 0.0,
                "send_ms_median": 1e3 * statistics.median(self.send_s) if self.send_s else 0.0,
                "state_bytes": max((c.nbytes for c in map(self.local.get, self.local.iterations()) if c), default=0),
                "local_bytes": self.local.held_bytes(), "held_bytes": self.host.held_bytes(),
                "held": self.host.held()}

    def stats_line(self) -> str:
        d = self.stats()
        return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}".replace(" ", "")
                        for k, v in d.items())


def _yield() -> None:
    time.sleep(0)  # between 1 MB pieces: let the training thread have the GIL
