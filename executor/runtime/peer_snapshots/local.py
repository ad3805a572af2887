"""This worker's own stage state at its snapshot iterations, in host memory.

Taking a copy is the only work a snapshot puts on the training thread: one foreach copy of
the parameters, buffers and optimizer state into host buffers allocated once and reused
(pinned on CUDA, where the copy is queued on the current stream and the host does not
wait: whoever reads the copy waits for its event). Sending it to the holder happens
later, on a background thread, from these same buffers.

Which copies are kept: a live stage must be able to roll back to the iteration the job
restores, which is one of some dead stage's holder's snapshots. Holders report each
complete snapshot in the store (`snap/done/<stage>`: the newest iteration its holder has),
and every iteration at or above the lowest of those marks is kept, the newest always;
at most `max_copies` (a holder lagging further behind than that is not waited for).
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import torch
from torch import Tensor

from executor.runtime.peer_snapshots.wire import flatten, layout, unflatten


class HostCopy:
    """One state at one iteration, in host buffers."""

    def __init__(self, iteration: int, tree, bufs: list[Tensor], event=None):
        self.iteration, self.tree, self.bufs, self.event = iteration, tree, bufs, event
        self.spec, self.nbytes = layout(bufs)
        self.users = 0  # the keeper's hold and a transfer's each count one

    def ready(self) -> None:
        """Wait for the copy (CUDA: its event). The sender and the training thread may both
        ask at once: each waits on the event it read, and it is cleared only after."""
        event = self.event
        if event is not None:
            event.synchronize()
            self.event = None

    def state(self, clone: bool = True):
        """The tree with its tensors (clones by default: an optimizer's load_state_dict
        keeps CPU tensors it is given, and these buffers are reused)."""
        self.ready()
        return unflatten(self.tree, [b.clone() for b in self.bufs] if clone else self.bufs)


class LocalCopies:
    def __init__(self, max_copies: int = 3, log=None):
        self.max_copies = max_copies
        self.log = log or (lambda msg: None)
        self._lock = threading.Lock()
        self.copies: dict[int, HostCopy] = {}
        self.stage: Optional[int] = None  # the stage the copies are of
        self._free: list[list[Tensor]] = []
        self.copy_s: list[float] = []  # the training thread's time per take (critical path)

    def take(self, iteration: int, state, stage: Optional[int] = None) -> HostCopy:
        """Copy `state` (a tree of live tensors) into host buffers as iteration's copy of
        `stage` (a worker moved to another stage forgets the old stage's copies)."""
        t0 = time.perf_counter()
        if stage != self.stage:
            self.drop_after(-1)
            self.stage = stage
        tree, live = flatten(state)
        cuda = any(t.is_cuda for t in live)
        bufs = self._buffers(live, cuda)
        with torch.no_grad():
            if live:
                torch._foreach_copy_(bufs, [t.detach() for t in live], non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        copy = HostCopy(iteration, tree, bufs, event)
        with self._lock:
            old = self.copies.pop(iteration, None)
            if old is not None:
                self._release(old)
            copy.users += 1
            self.copies[iteration] = copy
            while len(self.copies) > self.max_copies:
                self._release(self.copies.pop(min(self.copies)))
        self.copy_s.append(time.perf_counter() - t0)
        return copy

    def _buffers(self, live: list[Tensor], cuda: bool) -> list[Tensor]:
        sig = [(t.shape, t.dtype) for t in live]
        with self._lock:
            for k, bufs in enumerate(self._free):
                if [(b.shape, b.dtype) for b in bufs] == sig:
                    return self._free.pop(k)
            if self._free:  # another layout (the optimizer's state appeared): regrow one
                self._free.pop()
        return [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in live]

    def _release(self, copy: HostCopy) -> None:
        """Under the lock: one user fewer; the buffers of an unused copy are reused."""
        copy.users -= 1
        if copy.users == 0 and len(self._free) < 2:
            copy.ready()
            self._free.append(copy.bufs)

    def use(self, copy: HostCopy) -> None:
        with self._lock:
            copy.users += 1

    def done_with(self, copy: HostCopy) -> None:
        with self._lock:
            self._release(copy)

    def keep_from(self, watermark: int) -> None:
        """Drop copies below `watermark`, except the newest."""
        with self._lock:
            newest = max(self.copies, default=None)
            for it in [i for i in self.copies if i < watermark and i != newest]:
                self._release(self.copies.pop(it))

    def drop_after(self, iteration: int) -> None:
        """Drop copies of iterations > `iteration` (undone by a rollback)."""
        with self._lock:
            for it in [i for i in self.copies if i > iteration]:
                self._release(self.copies.pop(it))

    # ---- reading ----------------------------------------------------------------------
    def iterations(self) -> list[int]:
        with self._lock:
            return sorted(self.copies)

    def get(self, iteration: int) -> Optional[HostCopy]:
        with self._lock:
            return self.copies.get(iteration)

    def state(self, iteration: int):
        """This stage's state at `iteration` ({"model", "optim"} for the agent), tensors
        freshly cloned; KeyError if no copy of it is kept."""
        copy = self.get(iteration)
        if copy is None:
            raise KeyError(f"no local snapshot of iteration {iteration}; kept: {self.iterations()}")
        return copy.state()

    def held_bytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self.copies.values())
