"""How a stage's state travels between workers: a JSON header, then raw tensor bytes.

A state is a tree (dicts, lists, tuples, scalars, tensors: a model's and an optimizer's
state_dict). The header holds the tree with every tensor replaced by its index, and each
tensor's dtype, shape and byte offset; the payload is the tensors' bytes back to back
(each at a 64-byte aligned offset), sent straight from the host buffers (no serialised
copy) and received into one bytearray that the fetched tensors are views of. JSON, not
pickle: the header comes from the network (a store anyone on the cluster can read), and
unpickling it would run whatever it says.

Every socket read and write has a deadline: a peer that dies shows as a closed connection
at once, one that hangs as a timeout; both are a SnapshotError naming the peer.
"""
from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any, Callable, Optional

import torch
from torch import Tensor

ALIGN = 64
CHUNK = 1 << 20  # bytes per socket call: the GIL goes back to the trainer between chunks
_LEN = struct.Struct("!Q")
MAX_HEADER = 64 << 20


class SnapshotError(RuntimeError):
    """A snapshot could not be sent or fetched (peer gone, hung, or has none)."""


# ---- trees ------------------------------------------------------------------------------
def flatten(tree: Any) -> tuple[Any, list[Tensor]]:
    """(the tree as JSON-able nodes with tensors as {"T": i}, the tensors in order)."""
    tensors: list[Tensor] = []

    def enc(x):
        if isinstance(x, Tensor):
            tensors.append(x)
            return {"T": len(tensors) - 1}
        if isinstance(x, dict):
            return {"D": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, list):
            return {"L": [enc(v) for v in x]}
        if isinstance(x, tuple):
            return {"U": [enc(v) for v in x]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"V": x}
        raise TypeError(f"a snapshot holds tensors, containers and scalars, not {type(x).__name__}")

    return enc(tree), tensors


def unflatten(node: Any, tensors: list[Tensor]) -> Any:
    if "T" in node:
        return tensors[node["T"]]
    if "D" in node:
        return {unflatten(k, tensors): unflatten(v, tensors) for k, v in node["D"]}
    if "L" in node:
        return [unflatten(v, tensors) for v in node["L"]]
    if "U" in node:
        return tuple(unflatten(v, tensors) for v in node["U"])
    return node["V"]


def layout(tensors: list[Tensor]) -> tuple[list[list], int]:
    """[[dtype, shape, offset, nbytes]] of each tensor in the payload, and its size."""
    out, off = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        out.append([str(t.dtype).removeprefix("torch."), list(t.shape), off, n])
        off += -(-n // ALIGN) * ALIGN
    return out, off


def tensors_of(payload: bytearray, specs: list[list]) -> list[Tensor]:
    """The tensors of a received payload: views of it (the caller owns the bytearray)."""
    out = []
    for dtype, shape, off, n in specs:
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise SnapshotError(f"unknown dtype {dtype!r} in a snapshot")
        if n == 0:
            out.append(torch.empty(shape, dtype=dt))
            continue
        flat = torch.frombuffer(payload, dtype=torch.uint8, count=n, offset=off)
        out.append(flat.view(dt).reshape(shape))
    return out


def byte_views(tensors: list[Tensor]) -> list[memoryview]:
    """Each (contiguous, CPU) tensor's bytes, without a copy."""
    return [memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
            for t in tensors]


# ---- messages ---------------------------------------------------------------------------
class Deadline:
    def __init__(self, seconds: float, peer: str):
        self.end, self.peer, self.seconds = time.monotonic() + seconds, peer, seconds

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise SnapshotError(f"{self.peer}: no answer within {self.seconds:g} s")
        sock.settimeout(left)


def send_header(sock: socket.socket, header: dict, deadline: Deadline) -> None:
    data = json.dumps(header).encode()
    _sendall(sock, _LEN.pack(len(data)) + data, deadline)


def send_payload(sock: socket.socket, views: list[memoryview], total: int, deadline: Deadline,
                 pause: Optional[Callable[[], None]] = None) -> None:
    """The tensors' bytes with the padding the layout gives them, in CHUNK pieces."""
    sent = 0
    for v in views:
        pad = -sent % ALIGN
        if pad:
            _sendall(sock, bytes(pad), deadline)
            sent += pad
        for k in range(0, len(v), CHUNK):
            _sendall(sock, v[k:k + CHUNK], deadline)
            if pause is not None:
                pause()
        sent += len(v)
    if total > sent:
        _sendall(sock, bytes(total - sent), deadline)


def send_bytes(sock: socket.socket, data: bytearray, deadline: Deadline) -> None:
    view = memoryview(data)
    for k in range(0, len(view), CHUNK):
        _sendall(sock, view[k:k + CHUNK], deadline)


def recv_header(sock: socket.socket, deadline: Deadline) -> dict:
    (n,) = _LEN.unpack(bytes(recv_exact(sock, _LEN.size, deadline)))
    if n > MAX_HEADER:
        raise SnapshotError(f"{deadline.peer}: header of {n} bytes is not a snapshot's")
    try:
        return json.loads(bytes(recv_exact(sock, n, deadline)))
    except ValueError as exc:
        raise SnapshotError(f"{deadline.peer}: bad header ({exc})") from None


def recv_exact(sock: socket.socket, n: int, deadline: Deadline,
               progress: Optional[Callable[[int, int], None]] = None) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        deadline.arm(sock)
        try:
            k = sock.recv_into(view[got:got + CHUNK])
        except socket.timeout:
            raise SnapshotError(f"{deadline.peer}: no data for {deadline.seconds:g} s "
                                f"({got} of {n} bytes in)") from None
        except OSError as exc:
            raise SnapshotError(f"{deadline.peer}: {exc} ({got} of {n} bytes in)") from None
        if k == 0:
            raise SnapshotError(f"{deadline.peer}: connection closed after {got} of {n} bytes")
        got += k
        if progress is not None:
            progress(got, n)
    return buf


def _sendall(sock: socket.socket, data, deadline: Deadline) -> None:
    deadline.arm(sock)
    try:
        sock.sendall(data)
    except socket.timeout:
        raise SnapshotError(f"{deadline.peer}: could not send for {deadline.seconds:g} s") from None
    except OSError as exc:
        raise SnapshotError(f"{deadline.peer}: {exc}") from None


def connect(addr: tuple[str, int], deadline: Deadline) -> socket.socket:
    left = deadline.end - time.monotonic()
    try:
        sock = socket.create_connection(addr, timeout=max(left, 0.001))
    except OSError as exc:
        raise SnapshotError(f"{deadline.peer} at {addr[0]}:{addr[1]}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def held_state(held) -> dict:
    """A held snapshot's state, in tensors of its own. The payload's views would do for a
    read, but `Optimizer.load_state_dict` keeps a tensor whose dtype and device already
    match: Adam's moments would be the held snapshot, and every step would overwrite the
    copy the next restore of that stage reads (a trace replay trained inexact so)."""
    tensors = [t.clone() for t in tensors_of(held.payload, held.header["tensors"])]
    return unflatten(held.header["tree"], tensors)
