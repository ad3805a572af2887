"""One worker's compute: F, I, W and B of its stage on individual micro-batches.

Per micro-batch g the state moves F -> (graph kept) -> I -> (the graph below the captured
gradients kept) -> W -> gone; B is one plain backward. What a micro-batch holds from its F
until its W is what the planner's memory model charges (docs/design.md section 4, constraint 6),
and `pending()` lists those micro-batches. Communication is not done here: F returns the
activation to send, I returns the gradient to send.

Activations are a Tensor or a tuple of Tensors of any shape and dtype; a tuple reaches the
stage module as positional arguments (torch.distributed.pipelining's convention). The
gradient message of an activation is the tuple of gradients of its floating-point tensors
in order, or a single Tensor when the activation is one floating Tensor; non-floating
tensors (ids, masks) get none. Under precision="bf16" the floating activations a stage
sends are bf16, so their gradients come back in bf16 too.

Deferred W works on any autograd graph (executor/compute/backward/split_backward.py); a parameter
it cannot defer gets its gradient in I and is reported once, by name.

Randomness and recomputation: every forward runs inside its stage's `StageUnits.forward
(iteration, g)` (executor/compute/units.py), so its draws are keyed by (seed, iteration,
g, layer) and the layers activation checkpointing picks are recomputed in backward
(once, in I; executor/compute/backward/recompute.py). `begin(iteration)` says which iteration runs.

Loss scaling: the last stage back-propagates loss * loss_scale with loss_scale =
1/(D*M), so the SUM of gradients over all D*M micro-batches (all-reduced across live
peers) is the global-batch mean gradient, wherever each micro-batch was routed.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from executor.compute.backward import recompute, split_backward
from executor.compute.measure.memory import SavedLedger
from executor.compute.model import lm_loss
from executor.compute.units import StageUnits

log = logging.getLogger("recycle.compute")
Activation = Union[Tensor, tuple]


def autocast(precision: str, device: torch.device):
    """bf16: the forward (and so its backward) under torch.autocast; fp32 otherwise (no
    context at all: entering a disabled torch.autocast costs 2.7 us, a nullcontext 0.3)."""
    if precision != "bf16":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def boundary_cast(outs: list, precision: str) -> list:
    """What a stage sends: under bf16 its floating outputs in bf16 (half the bytes on the
    wire, as autocast computes them); the reference casts at the same places."""
    if precision != "bf16":
        return outs
    return [t.to(torch.bfloat16) if t.is_floating_point() else t for t in outs]


def _as_list(grad) -> list:
    return [grad] if isinstance(grad, Tensor) else list(grad)


@dataclass
class _AfterF:
    leaves: list[Tensor]  # the stage input's floating tensors, as leaves (not first stage)
    seeds: list[Tensor]  # first stage: trunk starts (split_backward.seeding_trunk)
    roots: list[Tensor]  # floating outputs (or the scaled loss) to back-propagate from
    floats: int  # floating tensors in the output: the gradient message's length
    bare: bool  # the input activation was one Tensor (its gradient message is one Tensor)
    ledger: Optional[SavedLedger] = field(default=None)
    frames: list = field(default_factory=list)  # its recomputed layers (recompute.py)


class StageCompute:
    def __init__(self, module: nn.Module, is_first: bool, is_last: bool, loss_scale: float,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] = lm_loss, precision: str = "fp32",
                 track_memory: bool = False, *, stage: int = 0, seed: int = 0,
                 checkpointing: str = "none"):
        self.module = module
        self.precision = precision  # bf16: forward under autocast, fp32 master weights
        self.is_first, self.is_last = is_first, is_last
        self.loss_scale = float(loss_scale)
        self.loss_fn = loss_fn
        self.track_memory = track_memory  # record saved tensors for held_bytes (profiling)
        # False under a plan of fused B: F then skips what only I needs (the first stage's
        # trunk seeds, a global module hook that slows every module call)
        self.split = True
        # The first stage sends no input gradient, so nothing waits for its I: by default
        # its I does nothing and its W is one plain backward (as torch's PipelineStage
        # does), all of it deferrable and as cheap as fused B. True: split it like the
        # other stages (the trunk seeded at its first modules; kept for measurement,
        # benchmarks/split_backward_ab.py, and the tests of that machinery)
        self.split_first = False
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._all_params = list(module.parameters())
        self._first = self._all_params[0] if self._all_params else None  # see device
        self._plans = split_backward.GraphPlans(self._params)  # the graph analysis, reused
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._reported: set[int] = set()  # parameters already reported as not deferred
        self._after_f: dict[int, _AfterF] = {}
        self._after_i: dict[int, tuple[split_backward.PendingW, Optional[SavedLedger]]] = {}
        self._losses: dict[int, Tensor] = {}  # g -> unscaled loss (kept as a tensor: no sync)
        # draws keyed by (seed, iteration, g, layer); layers recomputed in backward
        self.units = StageUnits(module, stage, seed, self.device, checkpointing)
        self.iteration = 0

    def begin(self, iteration: int) -> None:
        """The iteration whose micro-batches the next forwards compute (their draws' key)."""
        self.iteration = iteration

    @property
    def device(self) -> torch.device:
        # the kept parameter list, not module.parameters(): that walks the module tree,
        # three times per F and B
        return self._first.device if self._first is not None else torch.device("cpu")

    # ---- actions ----------------------------------------------------------------------
    def forward(self, g: int, x: Activation, targets: Optional[Tensor] = None) -> Activation:
        """F. x: the first stage's input, else the received activation (a Tensor or a tuple
        of Tensors). Returns the activation to send (detached), or on the last stage the
        detached unscaled loss."""
        if g in self._after_f or g in self._after_i:
            raise RuntimeError(f"F of micro-batch {g} twice without finishing its backward")
        bare = isinstance(x, Tensor)
        xs = [t.to(self.device) for t in ([x] if bare else x)]
        # fresh leaves: I stops here (reads their gradients); on the first stage a floating
        # input is a leaf too, only to mark the trunk for I (not under fused B): its
        # gradient is never computed
        mark = not self.is_first or (self.split and self.split_first)
        xs = [t.detach().requires_grad_(True) if mark and t.is_floating_point() else t.detach()
              for t in xs]
        leaves = [t for t in xs if t.requires_grad]
        ledger = SavedLedger(self._params) if self.track_memory else None
        # ids/masks have no autograd node: the modules they enter start the trunk instead
        ids = self.split and self.is_first and self.split_first and any(
            not t.is_floating_point() for t in xs)
        seeding = split_backward.seeding_trunk(xs) if ids else nullcontext([])
        with torch.enable_grad(), autocast(self.precision, self.device), seeding as seeds, \
                (ledger.recording() if ledger else nullcontext()), \
                self.units.forward(self.iteration, g, ledger) as unit_pass:
            out = self.module(*xs) if not bare else self.module(xs[0])
            if self.is_last:
                if targets is None:
                    raise ValueError("the last stage needs targets to compute the loss")
                loss = self.loss_fn(out, targets.to(self.device))
                self._losses[g] = loss.detach()
                roots, result, floats = [loss], loss.detach(), 0  # seeded with loss_scale
            else:
                outs = boundary_cast([out] if isinstance(out, Tensor) else list(out),
                                     self.precision)
                roots = [t for t in outs if t.is_floating_point()]
                floats = len(roots)
                result = outs[0].detach() if isinstance(out, Tensor) else \
                    tuple(t.detach() for t in outs)
        seeds = list(seeds) + (leaves if self.is_first else [])
        self._after_f[g] = _AfterF([] if self.is_first else leaves, seeds, roots, floats, bare,
                                   ledger, unit_pass.frames)
        return result

    def backward_input(self, g: int, grad=None):
        """I. grad: the gradient message for this stage's output (None on the last stage).
        Returns the gradient message for the stage input (None on the first stage), having
        computed no weight gradient that can be deferred to W."""
        if not self.split:
            raise RuntimeError(f"I of micro-batch {g} under a plan of fused backward (B only)")
        st = self._take_after_f(g, grad)
        roots, grads = self._roots(st, grad)
        if self.is_first and not self.split_first:  # all of it in W (see __init__)
            self._after_i[g] = (split_backward.PendingW([], (roots, grads)), st.ledger)
            return None
        gx, pending, stray = split_backward.backward_input(roots, grads, st.leaves, st.seeds,
                                                           self._plans)
        if st.frames:  # recomputed in I: keep only what W reads
            recompute.trim(st.frames, pending.w_nodes)
        pending.w_nodes = []
        self._report(stray)
        self._after_i[g] = (pending, st.ledger)
        return self._input_message(st, gx)

    def backward_weight(self, g: int) -> None:
        """W. Accumulates the weight gradients of micro-batch g into param.grad, from the
        gradients I captured, without re-running I's part of the graph."""
        if g not in self._after_i:
            raise RuntimeError(f"W of micro-batch {g} without a finished I")
        split_backward.backward_weight(self._after_i.pop(g)[0])

    def backward_full(self, g: int, grad=None):
        """B: one plain backward, weight and input gradients in one traversal."""
        st = self._take_after_f(g, grad)
        roots, grads = self._roots(st, grad)
        if roots:  # autograd accumulates into .grad itself, in C++, as a plain backward.
            # Naming `inputs` cost 6% of B here (the engine then walks the graph first), so
            # only when a leaf must be skipped: the first stage's floating input that a
            # split plan's F marked as a leaf (nobody needs its gradient).
            skip = self.is_first and any(t.requires_grad for t in st.seeds)
            torch.autograd.backward(roots, grads, inputs=self._params if skip else None)
        return self._input_message(st, [x.grad for x in st.leaves])

    # ---- helpers ----------------------------------------------------------------------
    def _take_after_f(self, g: int, grad) -> _AfterF:
        if g not in self._after_f:
            raise RuntimeError(f"backward of micro-batch {g} without a pending F")
        if self.is_last != (grad is None):
            raise ValueError("grad must be None exactly on the last stage")
        st = self._after_f[g]
        if not self.is_last and len(_as_list(grad)) != st.floats:
            raise ValueError(f"gradient message of micro-batch {g} has {len(_as_list(grad))} "
                             f"tensors; the activation has {st.floats} floating ones")
        return self._after_f.pop(g)

    def _roots(self, st: _AfterF, grad) -> tuple[list[Tensor], list]:
        if grad is None:  # the loss, back-propagated as loss * loss_scale
            return st.roots, [torch.full_like(r, self.loss_scale) for r in st.roots]
        pairs = [(r, gr.to(device=self.device, dtype=r.dtype))
                 for r, gr in zip(st.roots, _as_list(grad)) if r.requires_grad]
        return [r for r, _ in pairs], [gr for _, gr in pairs]

    def _input_message(self, st: _AfterF, gx: list):
        if self.is_first:
            return None
        grads = [gi if gi is not None else torch.zeros_like(x) for x, gi in zip(st.leaves, gx)]
        return grads[0] if st.bare else tuple(grads)

    def _report(self, stray: list[Tensor]) -> None:
        new = [p for p in stray if id(p) not in self._reported]
        if new:
            self._reported.update(id(p) for p in new)
            names = ", ".join(self._names.get(id(p), "?") for p in new)
            log.warning("weight gradient not deferred to W (computed in I): %s", names)

    # ---- state ------------------------------------------------------------------------
    def loss(self, g: int) -> float:
        """Unscaled loss of micro-batch g (last stage only)."""
        if g not in self._losses:
            raise KeyError(f"no loss for micro-batch {g} on this worker")
        return float(self._losses[g])

    def losses(self) -> dict[int, float]:
        return {g: float(v) for g, v in sorted(self._losses.items())}

    def pending(self) -> list[int]:
        """Micro-batches whose F ran but whose W (or B) has not: the activation memory held."""
        return sorted(set(self._after_f) | set(self._after_i))

    def held_bytes(self, g: int) -> int:
        """Bytes micro-batch g keeps alive now (needs track_memory=True): the tensors its F
        saved for backward that are still alive, plus on the way to W the gradients I
        captured for it."""
        if g in self._after_f:
            ledger, extra = self._after_f[g].ledger, 0
        elif g in self._after_i:
            pending, ledger = self._after_i[g]
            extra = pending.grad_bytes()
        else:
            return 0
        if ledger is None:
            raise RuntimeError("held_bytes needs StageCompute(track_memory=True)")
        return ledger.alive_bytes() + extra

    def zero_grad(self) -> None:
        for p in self._all_params:  # kept: module.parameters() walks the module tree
            p.grad = None

    def reset(self) -> None:
        """Abort the iteration: drop every micro-batch's graph, store and loss, and the
        partial gradients (docs/design.md section 6: they are discarded, the iteration re-runs)."""
        self._after_f.clear()
        self._after_i.clear()
        self._losses.clear()
        self.zero_grad()
