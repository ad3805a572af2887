"""What a pending micro-batch keeps alive: the tensors its forward saved for backward.

The split backward keeps part of the autograd graph from I until W (split_backward.PendingW);
which saved tensors that part still references is autograd's business, so instead of
guessing, F records a weak reference to the storage of every tensor it saves, and the
bytes held at any moment are those storages still alive (parameters excluded: they live
anyway). A storage something else also holds (an activation buffer the agent still keeps)
counts as held: it cannot be freed by finishing this micro-batch either way."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef


class SavedLedger:
    def __init__(self, params: Iterable[Tensor] = ()):
        self._skip = {p.untyped_storage().data_ptr() for p in params}
        self._refs: dict[int, tuple[StorageWeakRef, int]] = {}  # data_ptr -> (ref, bytes)

    @contextmanager
    def recording(self) -> Iterator["SavedLedger"]:
        def pack(t: Tensor) -> Tensor:
            self.note(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield self

    def note(self, t: Tensor) -> None:
        """Count t's storage as held by the micro-batch (activation checkpointing notes the
        inputs it keeps and the tensors it recomputes: recompute.py)."""
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self._skip:
            return
        old = self._refs.get(key)
        if old is None or old[0].expired():  # (a freed storage's address may come back)
            self._refs[key] = (StorageWeakRef(st), st.nbytes())

    def alive_bytes(self) -> int:
        return sum(n for ref, n in self._refs.values() if not ref.expired())

    def saved_bytes(self) -> int:
        return sum(n for _, n in self._refs.values())
