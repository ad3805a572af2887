"""Activations and gradients on the wire: what one hop between two stages carries.

An activation is a Tensor or a tuple of Tensors of any shape and dtype (bf16 hidden
states, int64 positions, a bool mask). Its gradient message is the tuple of the gradients
of its floating-point tensors, in order; a single Tensor when the activation is one
Tensor (the shared interface with executor/compute/stage.py).

The spec (shapes and dtypes) is agreed once per plan version and stage boundary
(World.activation_spec, runtime/transport/comm.py), so every hop is one message of raw bytes with no
header: a single tensor is sent as it is; several are packed into one uint8 buffer, each
at an offset aligned to 16 bytes, and unpacked on the receiver as views of that buffer
(no copy). A stage whose output no longer matches the agreed spec raises
ActivationSpecError with both specs in one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from planner.errors import UserError

Activation = Union[Tensor, tuple]
_ALIGN = 16


class ActivationSpecError(UserError):
    """A stage's output does not match the spec agreed for its boundary: the user's model
    is wrong, not the run, so training halts with this one line instead of re-planning."""


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ActivationSpecError(f"unknown dtype {name!r} in an activation spec")
    return dt


@dataclass(frozen=True)
class ActivationSpec:
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    is_tuple: bool  # a tuple of tensors (even of one), not a bare Tensor

    @classmethod
    def of(cls, act: Activation, what: str = "a stage's output") -> "ActivationSpec":
        ts = tuple(act) if isinstance(act, (tuple, list)) else (act,)
        if not ts or not all(isinstance(t, Tensor) for t in ts):
            kinds = ", ".join(type(t).__name__ for t in ts) or "nothing"
            raise ActivationSpecError(f"{what} must be a Tensor or a non-empty tuple of "
                                      f"Tensors, not ({kinds})")
        return cls(tuple(tuple(t.shape) for t in ts), tuple(t.dtype for t in ts),
                   isinstance(act, (tuple, list)))

    # ---- agreement (JSON in the store) -------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"shapes": [list(s) for s in self.shapes],
                           "dtypes": [str(d) for d in self.dtypes], "tuple": self.is_tuple})

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "ActivationSpec":
        d = json.loads(text)
        return cls(tuple(tuple(s) for s in d["shapes"]), tuple(_dtype(n) for n in d["dtypes"]),
                   bool(d["tuple"]))

    def __str__(self) -> str:
        parts = [f"{str(d).removeprefix('torch.')}{list(s)}" for s, d in zip(self.shapes, self.dtypes)]
        return f"({', '.join(parts)})" if self.is_tuple else parts[0]

    # ---- gradients ---------------------------------------------------------------------
    def grad(self) -> "ActivationSpec":
        """The gradient message's spec: the floating-point tensors only, same order."""
        keep = [i for i, d in enumerate(self.dtypes) if d.is_floating_point]
        return ActivationSpec(tuple(self.shapes[i] for i in keep),
                              tuple(self.dtypes[i] for i in keep), self.is_tuple)

    # ---- one message -------------------------------------------------------------------
    def _layout(self) -> tuple[list[int], int]:
        offsets, off = [], 0
        for s, d in zip(self.shapes, self.dtypes):
            offsets.append(off)
            n = _numel(s) * _itemsize(d)
            off += -(-n // _ALIGN) * _ALIGN
        return offsets, off

    def check(self, act: Activation, what: str) -> None:
        got = ActivationSpec.of(act, what)
        if got != self:
            raise ActivationSpecError(
                f"{what} is {got}, but {self} was agreed for this stage boundary under this "
                f"plan version: stages must exchange one shape and dtype per boundary")

    def pack(self, act: Activation) -> Tensor:
        """The one buffer to send (a bare single tensor is sent as it is)."""
        ts = tuple(act) if self.is_tuple else (act,)
        if len(ts) == 1:
            return ts[0].detach().contiguous()
        offsets, total = self._layout()
        buf = torch.empty(total, dtype=torch.uint8, device=ts[0].device)
        for t, off in zip(ts, offsets):
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buf[off:off + raw.numel()].copy_(raw)
        return buf

    def empty(self, device: torch.device) -> Tensor:
        """A buffer to receive one message into."""
        if len(self.shapes) == 1:
            return torch.empty(self.shapes[0], dtype=self.dtypes[0], device=device)
        return torch.empty(self._layout()[1], dtype=torch.uint8, device=device)

    def unpack(self, buf: Tensor) -> Activation:
        if len(self.shapes) == 1:
            return (buf,) if self.is_tuple else buf
        offsets, _ = self._layout()
        ts = tuple(buf[off:off + _numel(s) * _itemsize(d)].view(d).view(s)
                   for off, s, d in zip(offsets, self.shapes, self.dtypes))
        return ts

    @property
    def empty_message(self) -> bool:
        """Nothing to send (a gradient message of an activation without floating tensors)."""
        return not self.shapes


def grad_message(spec: ActivationSpec, grads: Optional[Activation]) -> Activation:
    """The gradient message as the interface defines it, from what I returned: a missing
    gradient of a floating tensor (it did not take part in the loss) is zeros, on the
    device of the others (a CPU tensor among CUDA ones broke the message's packing)."""
    if spec.is_tuple:
        gs = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    else:
        gs = (grads,)
    if len(gs) != len(spec.shapes):
        raise ActivationSpecError(f"the gradient message has {len(gs)} tensors, the spec "
                                  f"{spec} has {len(spec.shapes)} floating ones")
    out = []
    device = next((g.device for g in gs if g is not None), torch.device("cpu"))
    for g, s, d in zip(gs, spec.shapes, spec.dtypes):
        if g is None:
            g = torch.zeros(s, dtype=d, device=device)
        elif tuple(g.shape) != s:
            raise ActivationSpecError(f"a gradient of shape {list(g.shape)} for an activation "
                                      f"of shape {list(s)}")
        out.append(g if g.dtype == d else g.to(d))
    return tuple(out) if spec.is_tuple else out[0]


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize
