"""SnapshotHost: the server in every worker process that keeps other stages' snapshots.

One listening socket (the worker's host, an ephemeral port, published in the run's store
under `snap/addr/<worker id>`), one daemon thread accepting and one per connection, so a
slow transfer never holds up another. Per stage it keeps the newest two complete snapshots
(iteration, header, payload bytes): two, because a stage that dies while its newest copy
is still streaming in must be restorable from the one before, and the job rolls back to
an iteration that every stage can give. A transfer cut off half way is dropped, never
kept. Everything lives in this process's memory and dies with it.

Requests, one per connection (a JSON header, wire.py):
  put   {stage, iteration, tensors, tree, nbytes} + payload -> {ok}
  get   {stage, iteration or null (newest)}      -> {iteration, tensors, tree, nbytes} + payload
  held  {}                                       -> {held: {stage: [iterations]}, bytes}
  forget {stage or null, after}                  -> {ok}: drop iterations > after
A put of an iteration below the newest held one means the job rolled back: the held
snapshots above it belong to iterations that were undone, and are dropped.
"""
from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from typing import Optional

from executor.protocol import SNAP_ADDR
from executor.runtime.peer_snapshots.wire import (Deadline, SnapshotError, recv_exact,
                                                  recv_header, send_bytes, send_header)

KEEP = 2  # complete snapshots kept per stage
MAX_PAYLOAD = 1 << 42  # 4 TiB: a larger size in a header is garbage, not a stage
ADDR_KEY = SNAP_ADDR


@dataclass
class Held:
    iteration: int
    header: dict  # tensors + tree (what a fetcher needs to rebuild the state)
    payload: bytearray

    def __post_init__(self):
        self.nbytes = len(self.payload) + len(json.dumps(self.header))


class SnapshotHost:
    def __init__(self, bind_host: str = "127.0.0.1", *, io_timeout_s: float = 30.0,
                 log=None):
        self.io_timeout_s = io_timeout_s
        self.log = log or (lambda msg: None)
        self._lock = threading.Lock()
        self._held: dict[int, list[Held]] = {}
        self.receiving = 0  # bytes of transfers in progress (not yet complete)
        self.floor = -(2 ** 62)  # older snapshots are of a shape left behind (reset)
        self.peak_bytes = 0
        self.sock = socket.create_server((bind_host, 0))
        self.address = (bind_host, self.sock.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._accept, name="snapshot-host", daemon=True).start()

    # ---- what is held ---------------------------------------------------------------
    def held(self) -> dict[int, list[int]]:
        """stage -> iterations held (complete snapshots), oldest first."""
        with self._lock:
            return {s: [h.iteration for h in hs] for s, hs in sorted(self._held.items()) if hs}

    def held_bytes(self) -> int:
        """Host memory the complete snapshots take (payloads and headers)."""
        with self._lock:
            return sum(h.nbytes for hs in self._held.values() for h in hs)

    def get(self, stage: int, iteration: Optional[int] = None) -> Optional[Held]:
        with self._lock:
            hs = self._held.get(stage, [])
            if iteration is None:
                return hs[-1] if hs else None
            return next((h for h in hs if h.iteration == iteration), None)

    def put(self, stage: int, item: Held) -> None:
        with self._lock:
            if item.iteration < self.floor:  # of a shape the job left (reset)
                return
            hs = [h for h in self._held.get(stage, []) if h.iteration < item.iteration]
            hs.append(item)  # an equal or older one replaced; newer ones were undone
            self._held[stage] = hs[-KEEP:]
            self._note_peak()

    def reset(self, floor: int) -> None:
        """The job changed shape before iteration `floor`: stage numbers mean other units
        now, so every snapshot held goes, and one of an older iteration still on its way
        is dropped when it lands."""
        with self._lock:
            self.floor = floor
            self._held.clear()

    def forget(self, stage: Optional[int], after: int) -> None:
        """Drop snapshots of iterations > `after` (of one stage, or all)."""
        with self._lock:
            for s in list(self._held):
                if stage is None or s == stage:
                    self._held[s] = [h for h in self._held[s] if h.iteration <= after]

    def _note_peak(self) -> None:
        now = sum(len(h.payload) for hs in self._held.values() for h in hs) + self.receiving
        self.peak_bytes = max(self.peak_bytes, now)

    def close(self) -> None:
        self.closed = True
        try:  # close() alone does not wake a thread blocked in accept() on Linux
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass

    # ---- serving ----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn, f"{peer[0]}:{peer[1]}"),
                             name="snapshot-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            dl = Deadline(self.io_timeout_s, f"snapshot client {peer}")
            try:
                req = recv_header(conn, dl)
                op = req.get("op")
                if op == "put":
                    self._serve_put(conn, req, dl)
                elif op == "get":
                    self._serve_get(conn, req, dl)
                elif op == "held":
                    send_header(conn, {"held": {str(s): its for s, its in self.held().items()},
                                       "bytes": self.held_bytes()}, dl)
                elif op == "forget":
                    self.forget(req.get("stage"), int(req["after"]))
                    send_header(conn, {"ok": True}, dl)
                else:
                    send_header(conn, {"error": f"unknown request {op!r}"}, dl)
            except (SnapshotError, KeyError, TypeError, ValueError) as exc:
                self.log(f"snapshot host: {peer}: {exc}")
            except Exception as exc:  # (MemoryError, ...) a request never takes the worker down
                self.log(f"snapshot host: {peer}: {type(exc).__name__}: {exc}")

    def _serve_put(self, conn, req: dict, dl: Deadline) -> None:
        n = int(req["nbytes"])
        if not 0 <= n <= MAX_PAYLOAD:
            raise SnapshotError(f"a snapshot of {n} bytes is refused")
        with self._lock:
            self.receiving += n
            self._note_peak()
        try:
            payload = recv_exact(conn, n, dl)
        finally:
            with self._lock:
                self.receiving -= n
        stage, it = int(req["stage"]), int(req["iteration"])
        self.put(stage, Held(it, {"tensors": req["tensors"], "tree": req["tree"]}, payload))
        send_header(conn, {"ok": True}, dl)

    def _serve_get(self, conn, req: dict, dl: Deadline) -> None:
        stage, it = int(req["stage"]), req.get("iteration")
        h = self.get(stage, None if it is None else int(it))
        if h is None:
            send_header(conn, {"error": f"no snapshot of stage {stage}"
                                        + (f" at iteration {it}" if it is not None else "")
                                        + f"; held: {self.held()}"}, dl)
            return
        send_header(conn, {"iteration": h.iteration, "nbytes": len(h.payload), **h.header}, dl)
        send_bytes(conn, h.payload, dl)
