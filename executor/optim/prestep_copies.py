"""Pre-step copies of one stage's state: what an exact rollback restores.

A rollback to "before step i" must give back, bit for bit, the parameters, the buffers and
the optimizer's per-parameter state (AdamW: step, exp_avg, exp_avg_sq), including "no
state yet" before the first step (AdamW creates its state lazily in the first step).

The former way, a state_dict clone plus a deepcopy of the optimizer state per step,
allocated ~3x the parameters anew every step and walked the state in Python's deepcopy.
Here each snapshot is a slot of buffers allocated once and refilled by one
torch._foreach_copy_ per step; slots are reused, and only iterations that may still be
rolled back (not yet committed by every worker) hold one, usually one or two.
Non-tensor state values (rare) are kept by value.

The snapshot of iteration i is taken AHEAD, as soon as step i-1 is final (or the state
was built, loaded or rolled back): that is the state iteration i starts from, buffers
included (a BatchNorm's running statistics move in the forward, so a copy taken at step
i would hold iteration i's forward twice after a re-run). On CUDA the slots are pinned
host memory (no GPU memory at all) and that copy runs on a side stream, overlapping
iteration i's forward and backward, which only read the parameters; step i's kernels
wait on the copy's event (a GPU-side wait, the host never blocks). On CPU it is one
synchronous foreach copy right after the step.

On CPU the parameters and the optimizer state cannot change between a final step and the
next step, so the (small) buffers are copied ahead at once and the rest when the worker
would otherwise sit idle: `copy_when_idle()`, which the worker's communication calls when a
receive is about to block (a pipeline stage waits for its first activation or gradient
every iteration). A step whose copy did not find such a moment copies at the step, as
before; either way into the slot that will hold it. On this machine the copy (2.8 MB,
llama:debug stage) took 0.7 ms of the step's critical path per iteration before. Peak
memory on CPU: one slot per uncommitted iteration (usually 1-2), each the size of the
parameters, buffers and optimizer state.

A copy ahead is tagged with the iteration it is for (None: the next step, whichever:
after a build or a load_state_dict, which hooks here).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


class _Slot:
    __slots__ = ("bufs", "sig", "layout", "extras", "event", "nbytes")

    def __init__(self, sig: tuple, bufs: list[Tensor]):
        self.sig, self.bufs = sig, bufs
        self.nbytes = sum(b.numel() * b.element_size() for b in bufs)
        self.layout: tuple = ()
        self.extras: dict = {}
        self.event = None  # CUDA: the copy's completion


class PreStepCopies:
    def __init__(self, module: nn.Module, opt: torch.optim.Optimizer):
        self.opt = opt
        self.params = [p for group in opt.param_groups for p in group["params"]]
        self.params_of_module = list(module.parameters())
        self.module_tensors = self.params_of_module + list(module.buffers())
        dev = self.module_tensors[0].device if self.module_tensors else torch.device("cpu")
        self.cuda = dev.type == "cuda"
        self.stream = torch.cuda.Stream(dev) if self.cuda else None
        self.held: dict[int, _Slot] = {}  # iteration -> its pre-step state
        self.free: list[_Slot] = []
        self.ahead: Optional[tuple[Optional[int], _Slot]] = None  # the next step's state
        self._buffer_slot: Optional[_Slot] = None  # CPU: the buffers copied ahead
        # CPU: the rest of the copy ahead, taken in an idle moment (copy_when_idle)
        self._idle_due = False  # the state is final: an idle moment may copy it
        self._idle_slot: Optional[_Slot] = None  # that copy, for self.ahead's iteration
        # State loaded from elsewhere (a peer, a checkpoint) is what the next step starts from.
        module.register_load_state_dict_post_hook(lambda *_: self.copy_ahead(None))
        opt.register_load_state_dict_post_hook(lambda *_: self.copy_ahead(None))
        self.copy_ahead(None)

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
            _copy(slot.bufs, tensors, non_blocking=self.cuda)
        slot.layout, slot.extras = layout, extras
        return slot

    # ---- taking ---------------------------------------------------------------------
    def capture(self, it: int) -> None:
        """Keep iteration `it`'s pre-step state (call right before step it): the copy made
        ahead for it, or, if there is none, a copy of the state now."""
        ahead = self.ahead if self.ahead is not None and self.ahead[0] in (it, None) else None
        if ahead is not None and self.cuda:
            slot = ahead[1]
            self.ahead = None
            self._wait(slot)  # the step's kernels wait for the copy, on the GPU
        else:
            slot = None
            if ahead is not None and self._idle_slot is not None:  # CPU: copied while idle
                slot, self._idle_slot = self._idle_slot, None
            if slot is None:
                slot = self._fill(*self._live())  # on CUDA: queued before the step's kernels
            if ahead is not None:  # CPU: the buffers as they were before this forward
                n_par = len(self.params_of_module)
                _copy(slot.bufs[n_par:len(self.module_tensors)], ahead[1].bufs)
            self.cancel_ahead()
        old = self.held.pop(it, None)
        if old is not None:
            self.free.append(old)
        self.held[it] = slot

    def copy_ahead(self, it: Optional[int]) -> None:
        """Copy the current state as the pre-step state of iteration `it` (None: of the
        next step). Call when the state is final: after a final step it-1, a load."""
        n_par = len(self.params_of_module)
        if not self.cuda:  # only the buffers, into a small slot of their own
            bufs = [t.detach() for t in self.module_tensors[n_par:]]
            keep = self._buffer_slot
            if keep is None or keep.sig != tuple((t.shape, t.dtype) for t in bufs):
                keep = self._buffer_slot = _Slot(tuple((t.shape, t.dtype) for t in bufs),
                                                 [torch.empty_like(t) for t in bufs])
            with torch.no_grad():
                _copy(keep.bufs, bufs)
            self.cancel_ahead()
            self.ahead = (it, keep)
            self._idle_due = True
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
            _copy(slot.bufs, tensors, non_blocking=True)
            slot.event = torch.cuda.Event()
            slot.event.record(self.stream)
        slot.layout, slot.extras = layout, extras
        self.ahead = (it, slot)

    @property
    def idle_copy_due(self) -> bool:
        return self._idle_due

    def copy_when_idle(self) -> None:
        """CPU: the worker is about to wait: copy the parameters and optimizer state for
        the next step now, off the critical path (nothing to do if it is done, or if the
        state is not final: an optimistic step not settled yet)."""
        if not self._idle_due:
            return
        self._idle_due = False
        self._idle_slot = self._fill(*self._live())

    def cancel_ahead(self) -> None:
        if self.ahead is not None and self.cuda:
            self.free.append(self.ahead[1])
        self.ahead = None
        self._idle_due = False
        if self._idle_slot is not None:
            self.free.append(self._idle_slot)
            self._idle_slot = None

    # ---- giving back ----------------------------------------------------------------
    def restore(self, it: int) -> None:
        """Put the pre-step state of `it` back, bit for bit; the re-run of `it` starts
        from it (it becomes the copy ahead for `it`)."""
        slot = self.held[it]
        self.cancel_ahead()
        self._put_back(slot)
        if self.cuda:
            self.ahead = (it, self.held.pop(it))
        else:
            self.copy_ahead(it)

    def redo_from(self, it: int) -> None:
        """Put back the parameters and optimizer state of before step `it` to take that
        step again (a clipped redo); buffers stay as iteration it's forward left them."""
        self._put_back(self.held[it], buffers=False)

    def restart(self, it: int) -> None:
        """Iteration `it` re-runs without this worker having stepped it: give the buffers
        back their state from before its aborted forward (parameters and optimizer state
        did not change), if a copy ahead for `it` holds it; drop a copy for another one."""
        if self.ahead is None or self.ahead[0] is None:
            return
        if self.ahead[0] != it:
            return self.cancel_ahead()
        slot = self.ahead[1]
        self._wait(slot)
        n_par = len(self.params_of_module)
        src = slot.bufs if not self.cuda else slot.bufs[n_par:len(self.module_tensors)]
        with torch.no_grad():
            _copy([t.detach() for t in self.module_tensors[n_par:]], src,
                                 non_blocking=self.cuda)

    def _wait(self, slot: _Slot) -> None:
        if slot.event is not None:
            torch.cuda.current_stream(self.stream.device).wait_event(slot.event)

    def _put_back(self, slot: _Slot, buffers: bool = True) -> None:
        self._wait(slot)
        n = len(self.module_tensors)
        k = n if buffers else len(self.params_of_module)
        dst, src = [t.detach() for t in self.module_tensors[:k]], list(slot.bufs[:k])
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
            _copy(dst, src, non_blocking=self.cuda)

    # ---- bookkeeping ----------------------------------------------------------------
    def drop(self, keep) -> None:
        """Free the snapshots of iterations for which keep(it) is false."""
        for it in [i for i in self.held if not keep(i)]:
            self.free.append(self.held.pop(it))

    def held_bytes(self) -> int:
        """Host or CPU memory the snapshots still needed hold."""
        return sum(s.nbytes for s in self.held.values())


def _copy(dst: list[Tensor], src: list[Tensor], non_blocking: bool = False) -> None:
    if dst:  # one foreach call per list (torch refuses empty ones)
        torch._foreach_copy_(dst, src, non_blocking=non_blocking)


