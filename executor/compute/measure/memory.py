"""What a pending micro-batch keeps alive: the tensors its forward saved for backward.

The split backward keeps part of the autograd graph from I until W (split_backward.PendingW);
which saved tensors that part still references is autograd's business, so instead of
guessing, F records a weak reference to the storage of every tensor it saves, and the
bytes held at any moment are those storages still alive (parameters excluded: they live
anyway). A storage something else also holds (an activation buffer the agent still keeps)
counts as held: it cannot be freed by finishing this micro-batch either way."""
from __future__ import annotations

import gc
import warnings
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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


def alive_storages() -> dict[int, StorageWeakRef]:
    """The storages of every tensor Python holds now (parameters, optimizer state, ...),
    by address, with a weak reference that tells the very storage from a later one that
    reuses its address."""
    out = {}
    with warnings.catch_warnings():  # (isinstance on some module objects warns)
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if isinstance(o, Tensor) and o.device.type != "meta":
                    st = o.untyped_storage()
                    out[st.data_ptr()] = StorageWeakRef(st)
            except Exception:  # a tensor subclass or a half-built object: not ours
                pass
    return out


def existed(before: dict, st) -> bool:
    """Whether storage st is one alive_storages() saw (not a new one at its address)."""
    ref = before.get(st.data_ptr())
    return ref is not None and not ref.expired() and ref.cdata == StorageWeakRef(st).cdata


class PeakBytes(TorchDispatchMode):
    """The most tensor bytes alive at once among those created while it is active: every
    storage an op outputs that was not alive before (`skip`: by default every storage
    Python holds at entry; an op's view of a parameter is no new memory) is held by weak
    reference and the live total sampled after each op (allocated tensor bytes, as
    torch.cuda.max_memory_allocated counts them, on any device). Slow (a Python call per
    op): for a profile's warm-up round and benchmarks."""

    def __init__(self, skip: Optional[dict] = None):
        super().__init__()
        self.skip = skip
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.at_peak: dict[int, tuple] = {}  # data_ptr -> (weak ref, bytes) alive at the peak

    def __enter__(self):
        if self.skip is None:
            self.skip = alive_storages()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if existed(self.skip, st):
                    continue
                old = self.live.get(st.data_ptr())
                if old is None or old[0].expired():
                    self.live[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
        for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[k]
        total = sum(n for _, n in self.live.values())
        if total > self.peak:
            self.peak = total
            self.at_peak = dict(self.live)
        return out

    def peak_without(self, tensors) -> int:
        """The peak less the given tensors' storages alive at it (parameter gradients:
        the state's, not the micro-batch's)."""
        out = self.peak
        for t in tensors:
            if t is None:
                continue
            st = t.untyped_storage()
            ref, n = self.at_peak.get(st.data_ptr(), (None, 0))
            # the very storage (alive since the peak), not a later one at a freed address
            if ref is not None and not ref.expired() and ref.cdata == StorageWeakRef(st).cdata:
                out -= n
        return out
