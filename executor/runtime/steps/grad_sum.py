"""A stage's gradients summed over its live workers: the ALLREDUCE step (lowering.py)."""
from __future__ import annotations

from typing import Optional

import torch


def allreduce_grads(params: list, world, losses: Optional[dict], microbatches: int,
                    device) -> dict:
    """Sum every parameter's gradient over the stage's live workers, in one flat buffer.
    On the last stage (`losses` given) the per-micro-batch losses ride along in the same
    all-reduce (each g has one contributor, so the sum is exact): every last-stage peer
    that stepped can report all of the iteration's losses, even if the peer that computed
    some of them dies right after; they are returned. A stage with one live worker has
    nothing to sum: no flattening, no copy back. Either way a parameter without a gradient
    steps on zeros, as it does with peers (the sum needs a tensor): the update must not
    depend on how many workers a stage has left."""
    if world.stage_size == 1:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return dict(losses or {})
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
             for p in params]
    if losses is not None:
        lv = torch.zeros(microbatches, device=device)
        for g, v in losses.items():
            lv[g] = v
        parts.append(lv)
    flat = world.allreduce_stage(torch.cat(parts))
    off = 0
    for p in params:  # views of the summed buffer: it is ours, no copy needed
        p.grad = flat[off:off + p.numel()].view_as(p)
        off += p.numel()
    return {g: float(v) for g, v in enumerate(flat[off:].tolist())} if losses is not None else {}
