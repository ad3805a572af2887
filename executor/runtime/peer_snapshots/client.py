"""Talking to other workers' SnapshotHosts: put, fetch, what each holds, forget.

A holder is found by its worker id through the run's store (`snap/addr/<id>`, written
by its SnapshotHost when the process starts; a restarted process overwrites it). Every
call has a deadline: a holder that died answers 'connection refused' or 'closed', one that
hangs a timeout, and either is a SnapshotError naming it, never a hang.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Iterable, Optional

from torch import Tensor

from executor.runtime.peer_snapshots.host import ADDR_KEY
from executor.runtime.peer_snapshots.wire import (Deadline, SnapshotError, byte_views,
                                                  connect, recv_exact, recv_header,
                                                  send_header, send_payload, tensors_of,
                                                  unflatten)


def publish_address(store, worker: str, address: tuple[str, int]) -> None:
    import os
    store.set(ADDR_KEY.format(worker), json.dumps({"host": address[0], "port": address[1],
                                                   "pid": os.getpid()}))


def address_of(store, worker: str) -> tuple[str, int]:
    key = ADDR_KEY.format(worker)
    if not store.check([key]):  # get() would block for the store's timeout
        raise SnapshotError(f"worker {worker} keeps no snapshots (no {key} in the store)")
    d = json.loads(store.get(key))
    return d["host"], int(d["port"])


def _request(store, worker: str, header: dict, timeout_s: float):
    dl = Deadline(timeout_s, f"snapshot holder {worker}")
    sock = connect(address_of(store, worker), dl)
    send_header(sock, header, dl)
    return sock, dl


def put_snapshot(store, worker: str, stage: int, iteration: int, tree: dict,
                 tensors: list[Tensor], spec: list, nbytes: int, timeout_s: float,
                 pause: Optional[Callable[[], None]] = None) -> None:
    """Stream one snapshot (host tensors, laid out as `spec`) to `worker`'s host and wait
    for its acknowledgement: once this returns, the holder has it complete."""
    sock, dl = _request(store, worker, {"op": "put", "stage": stage, "iteration": iteration,
                                        "tensors": spec, "tree": tree, "nbytes": nbytes},
                        timeout_s)
    with sock:
        send_payload(sock, byte_views(tensors), nbytes, dl, pause)
        reply = recv_header(sock, dl)
    if not reply.get("ok"):
        raise SnapshotError(f"snapshot holder {worker} refused stage {stage} iteration "
                            f"{iteration}: {reply.get('error')}")


def fetch(store, holder: str, stage: int, iteration: Optional[int] = None,
          timeout_s: float = 30.0, progress: Optional[Callable[[int, int], None]] = None
          ) -> tuple[int, dict]:
    """(iteration, state) of `stage`'s snapshot held by worker `holder`: the given
    iteration, or its newest. The state is the tree that was offered (for the agent:
    {"model": state_dict, "optim": optimizer state_dict}) with CPU tensors the caller
    owns. `progress(bytes_in, bytes_total)` is called as the payload arrives."""
    sock, dl = _request(store, holder, {"op": "get", "stage": stage, "iteration": iteration},
                        timeout_s)
    with sock:
        head = recv_header(sock, dl)
        if "error" in head:
            raise SnapshotError(f"snapshot holder {holder}: {head['error']}")
        payload = recv_exact(sock, int(head["nbytes"]), dl, progress)
    return int(head["iteration"]), unflatten(head["tree"], tensors_of(payload, head["tensors"]))


def held_by(store, holder: str, timeout_s: float = 5.0) -> dict[int, list[int]]:
    """stage -> iterations of the complete snapshots `holder` keeps, oldest first."""
    sock, dl = _request(store, holder, {"op": "held"}, timeout_s)
    with sock:
        head = recv_header(sock, dl)
    return {int(s): list(its) for s, its in head["held"].items()}


def inventory(store, workers: Iterable[str], timeout_s: float = 5.0
              ) -> dict[str, Optional[dict[int, list[int]]]]:
    """held_by for each worker; None for one that cannot answer (dead, hung, never
    started a host) within `timeout_s` overall."""
    end = time.monotonic() + timeout_s
    out: dict[str, Optional[dict[int, list[int]]]] = {}
    for w in workers:
        try:
            out[w] = held_by(store, w, max(0.05, end - time.monotonic()))
        except SnapshotError:
            out[w] = None
    return out


def forget(store, holder: str, after: int, stage: Optional[int] = None,
           timeout_s: float = 5.0) -> None:
    """Drop `holder`'s snapshots of iterations > `after` (of `stage`, or of all stages):
    after a rollback they hold state of undone iterations."""
    sock, dl = _request(store, holder, {"op": "forget", "stage": stage, "after": after},
                        timeout_s)
    with sock:
        head = recv_header(sock, dl)
    if not head.get("ok"):
        raise SnapshotError(f"snapshot holder {holder}: {head.get('error')}")


def common_iteration(copies: dict[int, Iterable[int]], stages: int) -> Optional[int]:
    """The newest iteration at which every stage 0..stages-1 has a copy (copies[s]: the
    iterations stage s can be given at: snapshots on holders, live workers' local
    copies), or None."""
    sets = [set(copies.get(s, ())) for s in range(stages)]
    both = set.intersection(*sets) if sets else set()
    return max(both) if both else None


def where_held(inv: dict[str, Optional[dict[int, list[int]]]]) -> dict[int, dict[int, list[str]]]:
    """From an inventory: stage -> iteration -> the workers holding that snapshot."""
    out: dict[int, dict[int, list[str]]] = {}
    for w, held in inv.items():
        for s, its in (held or {}).items():
            for it in its:
                out.setdefault(s, {}).setdefault(it, []).append(w)
    return out
