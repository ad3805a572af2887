"""One worker's compute: F, I, W and B of its stage on individual micro-batches.

Per micro-batch g the state moves F -> (graph kept) -> I -> (weight-gradient store kept)
-> W -> gone; B is I and W back to back. What a micro-batch holds from its F until its W
is exactly what the planner's memory model charges (DESIGN section 4, constraint 6), and
`pending()` lists those micro-batches. Communication is not done here: F returns the
activation to send, I returns the gradient to send.

Loss scaling: the last stage back-propagates loss * loss_scale with loss_scale =
1/(D*M), so the SUM of gradients over all D*M micro-batches (all-reduced across live
peers) is the global-batch mean gradient, wherever each micro-batch was routed.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from executor.compute.model import lm_loss
from executor.compute.wgrad import deferring, run_store


def autocast(precision: str, device: torch.device):
    """bf16: the forward (and so its backward) under torch.autocast; fp32 otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


class StageCompute:
    def __init__(self, module: nn.Module, is_first: bool, is_last: bool, loss_scale: float,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] = lm_loss, precision: str = "fp32"):
        self.module = module
        self.precision = precision  # bf16: forward under autocast, fp32 master weights
        self.is_first, self.is_last = is_first, is_last
        self.loss_scale = float(loss_scale)
        self.loss_fn = loss_fn
        # g -> (stage input leaf or None, root to back-propagate from, weight-grad store)
        self._after_f: dict[int, tuple[Optional[Tensor], Tensor, list]] = {}
        self._after_i: dict[int, list] = {}  # g -> weight-gradient store awaiting W
        self._losses: dict[int, Tensor] = {}  # g -> unscaled loss (kept as a tensor: no sync)

    @property
    def device(self) -> torch.device:
        p = next(self.module.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    # ---- actions ----------------------------------------------------------------------
    def forward(self, g: int, x: Tensor, targets: Optional[Tensor] = None) -> Tensor:
        """F. x: tokens on the first stage, else the received activation. Returns the
        activation to send (detached), or on the last stage the detached unscaled loss."""
        if g in self._after_f or g in self._after_i:
            raise RuntimeError(f"F of micro-batch {g} twice without finishing its backward")
        x = x.to(self.device)
        if not self.is_first:  # a fresh leaf: I stops here and reads its .grad
            x = x.detach().requires_grad_(True)
        store: list = []
        with torch.enable_grad(), deferring(store), autocast(self.precision, self.device):
            out = self.module(x)
            if self.is_last:
                if targets is None:
                    raise ValueError("the last stage needs targets to compute the loss")
                loss = self.loss_fn(out, targets.to(self.device))
                self._losses[g] = loss.detach()
                root, result = loss * self.loss_scale, loss.detach()
            else:
                root, result = out, out.detach()
        self._after_f[g] = (None if self.is_first else x, root, store)
        return result

    def backward_input(self, g: int, grad: Optional[Tensor] = None) -> Optional[Tensor]:
        """I. grad: gradient w.r.t. this stage's output (None on the last stage). Returns
        the gradient w.r.t. the stage input (None on the first stage). Frees the graph;
        keeps only the (input, grad_output) pairs W needs."""
        if g not in self._after_f:
            raise RuntimeError(f"I of micro-batch {g} without a pending F")
        if self.is_last != (grad is None):
            raise ValueError("grad must be None exactly on the last stage")
        x, root, store = self._after_f.pop(g)
        if grad is None:
            torch.autograd.backward(root)
        else:
            torch.autograd.backward(root, grad.to(self.device))
        self._after_i[g] = store
        if x is None:
            return None
        return x.grad if x.grad is not None else torch.zeros_like(x)

    def backward_weight(self, g: int) -> None:
        """W. Accumulates the weight gradients of micro-batch g into param.grad from what
        I stored: one product per layer, no second traversal of the graph."""
        if g not in self._after_i:
            raise RuntimeError(f"W of micro-batch {g} without a finished I")
        run_store(self._after_i.pop(g))

    def backward_full(self, g: int, grad: Optional[Tensor] = None) -> Optional[Tensor]:
        """B = I then W."""
        gx = self.backward_input(g, grad)
        self.backward_weight(g)
        return gx

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

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None

    def reset(self) -> None:
        """Abort the iteration: drop every micro-batch's graph, store and loss, and the
        partial gradients (DESIGN section 6: they are discarded, the iteration re-runs)."""
        self._after_f.clear()
        self._after_i.clear()
        self._losses.clear()
        self.zero_grad()
