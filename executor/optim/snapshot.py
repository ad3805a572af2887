"""Pre-step snapshots of one stage's state: what an exact rollback restores.

A rollback to "before step i" must give back, bit for bit, the parameters, the buffers and
the optimizer's per-parameter state (AdamW: step, exp_avg, exp_avg_sq), including "no
state yet" before the first step (AdamW creates its state lazily in the first step).

The former way, a state_dict clone plus a deepcopy of the optimizer state per step,
allocated ~3x the parameters anew every step and walked the state in Python's deepcopy.
Here each snapshot is a slot of buffers allocated once and refilled by one
torch._foreach_copy_ per step; slots are reused, and only iterations that may still be
rolled back (not yet committed by every worker) hold one, usually one or two.
Non-tensor state values (rare) are kept by value.

On CUDA the slots are pinned host memory (no GPU memory at all) and the copy runs
asynchronously: the pre-step state of iteration i is the final post-step state of i-1,
so it is copied on a side stream as soon as step i-1 is final, overlapping iteration i's
forward and backward, which only read the parameters; step i's kernels wait on the
copy's event (a GPU-side wait, the host never blocks).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


class _Slot:
    __slots__ = ("bufs", "sig", "layout", "extras", "event")

    def __init__(self, sig: tuple, bufs: list[Tensor]):
        self.sig, self.bufs = sig, bufs
        self.layout: tuple = ()
        self.extras: dict = {}
        self.event = None  # CUDA: the copy's completion


class StageSnapshots:
    def __init__(self, module: nn.Module, opt: torch.optim.Optimizer):
        self.opt = opt
        self.params = [p for group in opt.param_groups for p in group["params"]]
        self.module_tensors = list(module.parameters()) + list(module.buffers())
        dev = self.module_tensors[0].device if self.module_tensors else torch.device("cpu")
        self.cuda = dev.type == "cuda"
        self.stream = torch.cuda.Stream(dev) if self.cuda else None
        self.held: dict[int, _Slot] = {}  # iteration -> its pre-step state
        self.free: list[_Slot] = []
        self.ahead: Optional[tuple[int, _Slot]] = None  # CUDA: copy in flight, tagged

    # ---- what is copied -------------------------------------------------------------
    def _live(self) -> tuple[list[Tensor], tuple, dict]:
        """The stage's tensors in a fixed order, the optimizer state's layout (per
        parameter: its state keys, () for none yet) and its non-tensor values."""
        tensors = [t.detach() for t in self.module_tensors]
        layout, extras = [], {}
        for i, p in enumerate(self.params):
            st = self.opt.state.get(p)  # .get: the defaultdict must not grow an entry
            keys = tuple(sorted(st)) if st else ()
            layout.append(keys)
            for k in keys:
                v = st[k]
                if isinstance(v, Tensor):
                    tensors.append(v.detach())
                else:
                    extras[(i, k)] = v
        return tensors, tuple(layout), extras

    def _slot(self, tensors: list[Tensor]) -> _Slot:
        sig = tuple((t.shape, t.dtype, t.device) for t in tensors)
        for k, slot in enumerate(self.free):
            if slot.sig == sig:
                return self.free.pop(k)
        if self.free:  # a layout that changed (the optimizer's state appeared): regrow one
            self.free.pop()
        bufs = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.cuda)
                for t in tensors]
        return _Slot(sig, bufs)

    def _fill(self, tensors: list[Tensor], layout: tuple, extras: dict) -> _Slot:
        slot = self._slot(tensors)
        if slot.event is not None:
            slot.event.synchronize()  # a former asynchronous fill must be done first
            slot.event = None
        with torch.no_grad():
            torch._foreach_copy_(slot.bufs, tensors, non_blocking=self.cuda)
        slot.layout, slot.extras = layout, extras
        return slot

    # ---- taking ---------------------------------------------------------------------
    def capture(self, it: int) -> None:
        """Keep the current state as iteration `it`'s pre-step state (call right before
        step it). Uses the asynchronous copy made ahead for `it` if there is one."""
        if self.ahead is not None and self.ahead[0] == it:
            slot = self.ahead[1]
            self.ahead = None
            torch.cuda.current_stream(self.stream.device).wait_event(slot.event)
        else:
            self.cancel_ahead()
            slot = self._fill(*self._live())  # on CUDA: queued before the step's kernels
        old = self.held.pop(it, None)
        if old is not None:
            self.free.append(old)
        self.held[it] = slot

    def copy_ahead(self, it: int) -> None:
        """CUDA: start copying the current (final) state as iteration `it`'s pre-step
        state on the side stream; no-op on CPU, where capture() copies at the step."""
        if not self.cuda:
            return
        self.cancel_ahead()
        tensors, layout, extras = self._live()
        slot = self._slot(tensors)
        if slot.event is not None:
            slot.event.synchronize()
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream), torch.no_grad():
            for t in tensors:  # a tensor freed meanwhile must not be reused under the copy
                if t.is_cuda:
                    t.record_stream(self.stream)
            torch._foreach_copy_(slot.bufs, tensors, non_blocking=True)
            slot.event = torch.cuda.Event()
            slot.event.record(self.stream)
        slot.layout, slot.extras = layout, extras
        self.ahead = (it, slot)

    def cancel_ahead(self) -> None:
        """The state changed other than by a final step (rollback, state loaded from a
        peer): a copy made ahead no longer shows the pre-step state."""
        if self.ahead is not None:
            self.free.append(self.ahead[1])
            self.ahead = None

    # ---- giving back ----------------------------------------------------------------
    def restore(self, it: int) -> None:
        """Put the pre-step state of `it` back, bit for bit (the slot stays held)."""
        self.cancel_ahead()
        slot = self.held[it]
        if slot.event is not None:
            torch.cuda.current_stream(self.stream.device).wait_event(slot.event)
        n = len(self.module_tensors)
        dst, src = [t.detach() for t in self.module_tensors], list(slot.bufs[:n])
        bufs = iter(slot.bufs[n:])
        sig = iter(slot.sig[n:])
        for i, (p, keys) in enumerate(zip(self.params, slot.layout)):
            if not keys:  # no state before this step: the step created it, drop it
                self.opt.state.pop(p, None)
                continue
            st = self.opt.state[p]
            for k in [k for k in st if k not in keys]:
                del st[k]
            for k in keys:
                if (i, k) in slot.extras:
                    st[k] = slot.extras[(i, k)]
                    continue
                buf, (shape, dtype, device) = next(bufs), next(sig)
                cur = st.get(k)
                if not (isinstance(cur, Tensor) and cur.shape == shape and cur.dtype == dtype
                        and cur.device == device):
                    cur = st[k] = torch.empty(shape, dtype=dtype, device=device)
                dst.append(cur)
                src.append(buf)
        with torch.no_grad():
            torch._foreach_copy_(dst, src, non_blocking=self.cuda)

    # ---- bookkeeping ----------------------------------------------------------------
    def drop(self, keep) -> None:
        """Free the snapshots of iterations for which keep(it) is false."""
        for it in [i for i in self.held if not keep(i)]:
            self.free.append(self.held.pop(it))

    def held_bytes(self) -> int:
        """Host or CPU memory the snapshots still needed hold."""
        return sum(_nbytes(s) for s in self.held.values())

    def allocated_bytes(self) -> int:
        """All snapshot memory, the free slots kept for reuse included."""
        slots = list(self.held.values()) + self.free + ([self.ahead[1]] if self.ahead else [])
        return sum(_nbytes(s) for s in slots)


def _nbytes(slot: _Slot) -> int:
    return sum(b.numel() * b.element_size() for b in slot.bufs)
