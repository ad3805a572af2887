"""Activation checkpointing that recomputes a layer once per micro-batch, whatever splits
its backward.

`--activation-checkpointing none|full|selective[:N]` (torchtitan's meaning: full
recomputes every block's forward in backward, selective:N every N-th block, 1-based:
blocks N, 2N, ...; the embedding and the head are never recomputed). A recomputed layer
keeps only its inputs from F; its saved tensors are made again when backward first needs
one of them.

Why not torch.utils.checkpoint: its recomputation is keyed by the autograd graph task, so
under the I/W split the layer's forward would run in I and again in W (two backward
calls, two tasks). Here each tensor the layer saves is packed as a `_Slot` that the
autograd node holds; the first unpack of any of them (in I, or in W for the first stage,
whose I does nothing, or in a fused B) re-runs the layer's forward once and fills every
slot still alive. The recomputation draws what the forward drew: it seeds the layer from
the same key (executor/compute/draws.py) and runs under the same autocast.

After I, `trim` lets go of the recomputed tensors W will not read: W runs only the nodes
where the parameters' subgraphs meet the trunk and the parameters' side below them
(split_backward.PendingW.w_nodes), so the slots those nodes unpack are kept until W and
the rest (attention scores, activations of the trunk alone) are freed at once. Autograd
keeps the whole graph below the captured gradients alive until W, so without this a
recomputed layer would hold everything it saved from I to W. Should W ever read a slot
let go (a node W runs that the analysis missed), the layer is recomputed again, once,
and a warning says so: slower, never wrong.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
from torch import Tensor

log = logging.getLogger("recycle.compute")


@dataclass(frozen=True)
class Policy:
    every: int = 0  # recompute blocks N, 2N, ... (1: all of them); 0: none

    @property
    def on(self) -> bool:
        return self.every > 0

    def recomputes(self, block: int) -> bool:
        """block: 0-based number among the layers that may be recomputed."""
        return self.every > 0 and (block + 1) % self.every == 0

    @classmethod
    def parse(cls, text: str) -> "Policy":
        """none, full, selective (every 2nd block) or selective:N; ValueError otherwise."""
        name, sep, n = text.partition(":")
        if name == "none" and not sep:
            return cls(0)
        if name == "full" and not sep:
            return cls(1)
        if name == "selective":
            if not sep:
                return cls(2)
            if n.isdigit() and int(n) >= 1:
                return cls(int(n))
        raise ValueError(f"--activation-checkpointing must be none, full, selective or "
                         f"selective:N (N >= 1: every N-th block), not {text!r}")

    def __str__(self) -> str:
        return {0: "none", 1: "full"}.get(self.every, f"selective:{self.every}")


class _Slot:
    """What the autograd node holds for one saved tensor: filled when recomputed."""
    __slots__ = ("frame", "tensor", "trimmed", "__weakref__")

    def __init__(self, frame: "_Frame"):
        self.frame, self.tensor, self.trimmed = frame, None, False


class _Frame:
    """One layer's forward on one micro-batch: how to run it again."""

    def __init__(self, p, index: int, fn: Callable, args: tuple,
                 again: Callable[[], ContextManager]):
        self.fn, self.args, self.index, self.again = fn, args, index, again
        self.draws, self.key, self.seeded = p.draws, p.key, p.seeded
        self.ledger = p.ledger
        dev = p.draws.device.type
        self.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        self.slots: list = []  # weak references, in the order the forward saved
        self.done = False
        self.recomputations = 0

    def pack(self, t: Tensor) -> _Slot:
        slot = _Slot(self)
        self.slots.append(weakref.ref(slot))
        return slot

    def unpack(self, slot: _Slot) -> Tensor:
        if _marking is not None:  # trim asks which slots W reads: none is recomputed for it
            _marking.add(id(slot))
            return slot.tensor if slot.tensor is not None else _EMPTY
        if slot.tensor is None:
            if slot.trimmed:
                _warn_again(self.index)
            self.recompute()
        return slot.tensor

    def recompute(self) -> None:
        got: list[Tensor] = []

        def pack(t: Tensor):
            got.append(t.detach() if t.requires_grad else t)
            return None

        args = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, Tensor)
                     else a for a in self.args)
        saved = self.draws.save() if self.seeded else None
        dev, enabled, dtype = self.autocast
        try:
            with torch.enable_grad(), torch.autocast(dev, dtype=dtype, enabled=enabled), \
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None), \
                    self.again():
                if self.seeded:
                    self.draws.seed(self.key, self.index)
                self.fn(*args)
        finally:
            if saved is not None:
                self.draws.restore(saved)
        if len(got) != len(self.slots):
            raise RuntimeError(f"layer {self.index}: its recomputed forward saved {len(got)} "
                               f"tensors, the forward {len(self.slots)} (a forward that "
                               f"does not repeat cannot be recomputed)")
        for ref, t in zip(self.slots, got):
            slot = ref()
            if slot is not None and slot.tensor is None:
                slot.tensor, slot.trimmed = t, False
                if self.ledger is not None:
                    self.ledger.note(t)
        self.done = True  # (the inputs stay while a slot does: a recomputation after trim)
        self.recomputations += 1
        _COUNT[0] += 1


_COUNT = [0]  # recomputations in this process (tests and benchmarks read it)
_EMPTY = torch.empty(0)
_marking = None  # while trim marks: the ids of the slots W's nodes read
_warned: set = set()


def recomputations() -> int:
    return _COUNT[0]


def _warn_again(index: int) -> None:
    if index not in _warned:
        _warned.add(index)
        log.warning("layer %d recomputed again in W: W read a tensor let go after I", index)


_SAVED: dict = {}  # node type -> its saved-tensor attributes


def _touch(node) -> None:
    """Unpack everything `node` saved (what it reads when it runs)."""
    names = _SAVED.get(type(node))
    if names is None:
        names = _SAVED[type(node)] = [a for a in dir(node) if a.startswith("_saved_")
                                      and not a.endswith(("_sym_sizes", "_sym_strides"))]
        if hasattr(node, "saved_tensors"):  # a custom autograd.Function's
            names.append("saved_tensors")
    for a in names:
        try:
            getattr(node, a)
        except Exception:  # a field that is not a tensor, or was released: nothing to keep
            pass


def trim(frames: list, w_nodes: list) -> None:
    """After I: keep only the recomputed tensors the nodes W runs will read."""
    global _marking
    done = [f for f in frames if f.done]
    if not done:
        return
    _marking = marked = set()
    try:
        for node in w_nodes:
            _touch(node)
    finally:
        _marking = None
    for f in done:
        for ref in f.slots:
            slot = ref()
            if slot is not None and slot.tensor is not None and id(slot) not in marked:
                slot.tensor, slot.trimmed = None, True


def checkpoint(p, index: int, fn: Callable, args: tuple, again: Callable[[], ContextManager]):
    """fn(*args) keeping only args for backward: what it saves is recomputed on demand.
    p: the stage's pass (units.Pass); again(): the context its recomputation runs in."""
    frame = _Frame(p, index, fn, args, again)
    p.frames.append(frame)
    if p.ledger is not None:
        for a in args:
            if isinstance(a, Tensor):
                p.ledger.note(a)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return fn(*args)
