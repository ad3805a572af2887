"""Does the model fit this machine? Checked before any worker starts, from parameter counts
on the meta device (nothing allocated): `--model llama:8b` on a laptop is one line and
exit 2, not a swap storm and an out-of-memory kill of the workers.

A stage's state is 16 bytes per parameter on the CPU (fp32 weights, gradients and
AdamW's two moments); activations come on top (a few MB for the small shapes people run
on a CPU), so the check only refuses what cannot fit at all.
"""
from __future__ import annotations

from typing import Optional

import torch

STATE_BYTES = 16  # per parameter: fp32 weight, gradient, AdamW exp_avg and exp_avg_sq


def stage_params(workload, cfg, stages: int) -> Optional[list[int]]:
    """Parameters per stage, counted on the meta device; None for a workload that cannot
    be built there (its stages were built on the CPU by check_workload anyway)."""
    try:
        with torch.device("meta"):
            return [sum(p.numel() for p in workload.build_stage(cfg, s, stages).parameters())
                    for s in range(stages)]
    except Exception:  # the user's code on meta tensors: no figure, no check
        return None


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GB"


def on_cpu(device: str) -> bool:
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def check_fits(model: str, workload, cfg, stages: int, *, replicas: int, device: str,
               mode: str, budget: Optional[int] = None) -> None:
    """ValueError (one line) when this machine's memory cannot hold the model's state.
    mode: "workers" (replicas x stages local worker processes), "reference" (every stage
    in one process, always on the CPU) or "profile" (one stage at a time). Workers and
    profiles on a GPU are not checked here (the device's memory is the profile's
    capacity)."""
    from executor.compute.measure.profile import machine_memory
    if mode != "reference" and not on_cpu(device):
        return
    counts = stage_params(workload, cfg, stages)
    if counts is None:
        return
    budget = machine_memory() if budget is None else budget
    need, what = {
        "workers": (replicas * sum(counts), f"{replicas * stages} worker processes need"),
        "reference": (sum(counts), "one process (--reference) needs"),
        "profile": (max(counts), "its largest stage needs"),
    }[mode]
    need *= STATE_BYTES
    if need > budget:
        raise ValueError(f"--model {model}: {what} {_gb(need)} for weights, gradients "
                         f"and AdamW state ({sum(counts):,} parameters in all), and this "
                         f"machine has {_gb(budget)}; use a GPU (--device cuda), more "
                         f"stages, or a smaller flavour")
