"""Ground truth: the same training in one process with plain autograd, and a comparison.

Iteration i trains on micro-batches g = 0..D*M-1 of data.microbatch(cfg, i, g), each loss
scaled by 1/(D*M), one AdamW per stage (AdamW is element-wise, so per-stage optimizers
equal one optimizer over the whole model), at the learning rate of iteration i
(optim/schedule.py), with gradients clipped by the global norm over all stages
(optim/clip.py: per-stage float64 sums added in stage order, as the workers do).
bf16: each stage's forward (and the loss) runs under autocast, as StageCompute does, so
the stage boundaries see the same dtypes. `device`: where it computes (the micro-batches
are made on the CPU and moved, as the workers do; `recycle train --reference --device cuda`).
Weights tied across stages (runtime/steps/tied.py) are separate copies here too, as on the
workers: before the step the owner's gradient becomes g_owner + g_mirror (stage order),
the mirror's copy is not stepped, and after the step it takes the owner's value. The layers run their native ops here (no
deferred W), so this also checks the I/W split of every distributed or local run against
ordinary autograd. Each stage's forward runs in its StageUnits (units.py), as on the
workers: the same keyed draws (dropout), the same layers recomputed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from executor.compute.config import TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig, Workload
from executor.compute.stage import autocast, boundary_cast
from executor.compute.units import StageUnits
from executor.optim.clip import coefficient, global_norm, scale_, stage_sq_norm
from executor.optim.schedule import IterationLR
from executor.runtime.steps.tied import check_tie_table, copy_from_owners, sum_into_owners, ties_of


@dataclass
class Summary:
    losses: list[float]  # per iteration: mean of the D*M micro-batch losses
    param_checksums: list[float]  # per stage: float64 sum of all its parameters
    # Final parameters per stage (name -> tensor), for per-parameter diffs; not serialised.
    state: Optional[list[dict[str, Tensor]]] = field(default=None, repr=False, compare=False)
    # Multi-process runs: seconds from each injected kill / restart to training under the
    # plan that follows it ({"kind", "worker", "iteration", "seconds"}); see launcher.py.
    recovery: Optional[list[dict]] = field(default=None, compare=False)
    # Multi-process runs: each plan version trained under (version, failed, speeds,
    # incarnations, first iteration, micro-batches per worker), so a run can be checked.
    plans: Optional[list[dict]] = field(default=None, compare=False)
    # The reference: global gradient norm per iteration (before clipping); not serialised.
    grad_norms: Optional[list[float]] = field(default=None, compare=False)
    # Multi-process runs: stage moves, snapshot restores and a replayed trace's counts.
    elastic: Optional[dict] = field(default=None, compare=False)

    def to_json(self) -> str:
        d = {"losses": self.losses, "param_checksums": self.param_checksums}
        if self.recovery is not None:
            d["recovery"] = self.recovery
        if self.plans is not None:
            d["plans"] = self.plans
        if self.elastic is not None:
            d["elastic"] = self.elastic
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "Summary":
        d = json.loads(text)
        return cls(losses=[float(x) for x in d["losses"]],
                   param_checksums=[float(x) for x in d["param_checksums"]],
                   recovery=d.get("recovery"), plans=d.get("plans"), elastic=d.get("elastic"))

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            fh.write(self.to_json())

    @classmethod
    def load(cls, path: str) -> "Summary":
        with open(path) as fh:
            return cls.from_json(fh.read())


def checksum(module: nn.Module) -> float:
    with torch.no_grad():
        return float(sum((p.detach().double().sum() for p in module.parameters()),
                         torch.zeros((), dtype=torch.float64)))


def snapshot(module: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().cpu().clone() for n, p in module.named_parameters()}


def compare(a: Summary, b: Summary, tol: float = 1e-5) -> list[str]:
    """Differences beyond tol (absolute, relative above magnitude 1); empty: they agree."""
    out = []
    close = lambda x, y: abs(x - y) <= tol * max(1.0, abs(x), abs(y))
    if len(a.losses) != len(b.losses):
        out.append(f"{len(a.losses)} vs {len(b.losses)} iterations")
    for i, (x, y) in enumerate(zip(a.losses, b.losses)):
        if not close(x, y):
            out.append(f"loss[{i}]: {x!r} vs {y!r} (diff {abs(x - y):.3g})")
    if len(a.param_checksums) != len(b.param_checksums):
        out.append(f"{len(a.param_checksums)} vs {len(b.param_checksums)} stages")
    for s, (x, y) in enumerate(zip(a.param_checksums, b.param_checksums)):
        if not close(x, y):
            out.append(f"checksum[stage {s}]: {x!r} vs {y!r} (diff {abs(x - y):.3g})")
    if a.state is not None and b.state is not None:
        for s, (sa, sb) in enumerate(zip(a.state, b.state)):
            if set(sa) != set(sb):
                out.append(f"stage {s}: parameter names differ")
                continue
            for name in sa:
                d = float((sa[name] - sb[name]).abs().max()) if sa[name].numel() else 0.0
                if d > tol:
                    out.append(f"stage {s} {name}: max abs diff {d:.3g}")
    return out


def train_reference(cfg: ModelConfig, replicas: int, microbatches: int, iterations: int,
                    stages: int, *, training: TrainingSettings = TrainingSettings(),
                    workload: Workload = DEFAULT_WORKLOAD,
                    after_step: Optional[Callable[[int, list, list], None]] = None,
                    device: torch.device | str = "cpu") -> Summary:
    """`after_step(it, modules, optimizers)`: called once iteration `it` has stepped (to
    read the whole state at an iteration: tests of snapshots)."""
    wl = workload
    dev = torch.device(device)
    # built on the CPU, then moved: the same initial weights on every device
    modules = [wl.build_stage(cfg, s, stages).to(dev) for s in range(stages)]
    # (randomness it cannot key is named by the command, workload_name.check_workload)
    units = [StageUnits(m, s, cfg.seed, dev, training.activation_checkpointing,
                        name_unkeyable=False) for s, m in enumerate(modules)]
    ties = sorted({t for m in modules for t in ties_of(m)}, key=lambda t: t.holders)
    check_tie_table(ties, modules)
    opts = [wl.make_optimizer(training, m.parameters()) for m in modules]
    lrs = [IterationLR(opt, training) for opt in opts]
    n = replicas * microbatches
    scale = 1.0 / n
    losses, norms = [], []
    for it in range(iterations):
        total = 0.0
        for g in range(n):
            x, targets = wl.microbatch(cfg, it, g)
            x = tuple(t.to(dev) for t in x) if isinstance(x, tuple) else x.to(dev)
            targets = targets.to(dev) if isinstance(targets, Tensor) else targets
            for s, m in enumerate(modules):
                first = x[0] if isinstance(x, tuple) else x
                with autocast(training.precision, first.device), units[s].forward(it, g):
                    x = m(*x) if isinstance(x, tuple) else m(x)
                    if s == stages - 1:
                        x = wl.loss_fn(x, targets)
                    else:  # what the stage sends, as the workers send it
                        out = boundary_cast([x] if isinstance(x, Tensor) else list(x),
                                            training.precision)
                        x = out[0] if isinstance(x, Tensor) else tuple(out)
            loss = x
            (loss * scale).backward()
            total += float(loss.detach())
        losses.append(total / n)
        sum_into_owners(modules, ties)
        grads = [[p.grad for p in m.parameters()] for m in modules]
        norms.append(global_norm([stage_sq_norm(gs) for gs in grads]))
        c = coefficient(norms[-1], training.clip) if training.clip > 0 else 1.0
        for opt, lr, gs in zip(opts, lrs, grads):
            if c < 1.0:
                scale_(gs, c)
            lr.at(it)
            opt.step()
            opt.zero_grad(set_to_none=True)
        copy_from_owners(modules, ties)
        if after_step is not None:
            after_step(it, modules, opts)
    return Summary(losses=losses, param_checksums=[checksum(m) for m in modules],
                   state=[snapshot(m) for m in modules], grad_norms=norms)
