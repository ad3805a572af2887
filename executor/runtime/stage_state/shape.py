"""A plan's shape as the worker builds it (docs/executor.md, "Shapes"): the partition a
plan carries (planner/shapes/partition.py) turned into the model configuration whose
stages run those unit ranges, and the worker configuration of the shaped job.

Units and blocks. A partition's units are either the job's own stages (`stage`: unit k
is base stage k, its blocks `layer_range` of the base split) or the model's layers
(`layer`: [embedding, blocks..., head], the units `recycle profile --split balanced`
costs). Either way a stage of the shape holds a contiguous run of blocks, the embedding
when it is the first and the head when it is the last, which is what the models'
`cfg.boundaries` say (the first block of stages 1..S'-1; a stage may hold none): a shape
is a ModelConfig with other boundaries. Parameter names are the unsplit model's in every
split (blocks keep their global index), so a stage's state is moved by name.

Only workloads whose build_stage honours `cfg.boundaries` can change shape
(`Workload.reshapes`: the built-in GPT, the Llama decoder and Hugging Face models).
"""
from __future__ import annotations

import dataclasses
import zlib

import torch

from executor.checkpoint.store import shape_dir
from executor.compute.model import layer_range
from executor.runtime.worker_config import WorkerConfig
from planner.plan import Plan


class ShapeError(ValueError):
    """A plan's partition this run cannot build (one line)."""


def blocks_of(conf: WorkerConfig, unit_kind: str, lo: int, hi: int) -> tuple[int, int]:
    """Blocks [a, b) of units [lo, hi) of the base job `conf` (module doc)."""
    L, S = conf.model.n_layers, conf.job.stages
    if unit_kind == "stage":
        return layer_range(L, lo, S, conf.model.boundaries)[0], \
            layer_range(L, hi - 1, S, conf.model.boundaries)[1]
    return max(lo, 1) - 1, min(hi, L + 1) - 1


def shaped_config(base: WorkerConfig, plan: Plan) -> WorkerConfig:
    """The worker configuration for `plan`: `base` itself for the job's own partition,
    else the shaped job and the model cut at the partition's units."""
    part = plan.partition
    if part is None:
        return base
    if part.base != base.job.identity_hash():
        raise ShapeError(f"plan v{plan.version} is cut from job {part.base}, not this run's "
                         f"{base.job.identity_hash()}")
    if not base.workload.reshapes:
        raise ShapeError("this workload's stages do not follow cfg.boundaries: it cannot "
                         "change shape")
    L, S = base.model.n_layers, base.job.stages
    units = S if part.unit == "stage" else L + 2
    if part.bounds[-1] != units:
        raise ShapeError(f"plan v{plan.version}'s partition {part.bounds} does not cover the "
                         f"{units} {part.unit} units of this model")
    firsts = tuple(blocks_of(base, part.unit, lo, hi)[0] for lo, hi in part.ranges()[1:])
    model = dataclasses.replace(base.model, boundaries=firsts)
    shaped = dataclasses.replace(base, model=model, job=plan.job)
    # checkpoint parts go on at every shape, a cut's in a directory of its own (a resume
    # or a restore loads them by name into any shape: checkpoint/stage_state.py)
    return dataclasses.replace(shaped, part_shape=shape_dir(shaped.stages, shape_id(shaped)))


def shape_id(conf: WorkerConfig) -> int:
    """A number for the shape `conf` builds, the same on every worker."""
    return zlib.crc32(repr(bounds_key(conf)).encode()) & 0x7FFFFFFF


def bounds_key(conf: WorkerConfig) -> tuple:
    """What identifies the shape a configuration builds (equal: no state moves by name):
    the stage count and each stage's first block, spelled out (the job's own split may
    be given by count, its boundaries empty)."""
    L, S, b = conf.model.n_layers, conf.job.stages, conf.model.boundaries
    return S, tuple(layer_range(L, s, S, b)[0] for s in range(1, S))


def base_checksums(base: WorkerConfig, module) -> list[float]:
    """`module`'s parameters' checksum (reference.checksum's sum) per stage of the job's
    own split: after a change of shape, what the run's summary compares."""
    names = names_by_base_stage(base)
    out = [torch.zeros((), dtype=torch.float64) for _ in names]
    with torch.no_grad():
        # every name, a tensor tied within this stage under each (a tie split across base
        # stages, the embedding and the head, is one tensor once they share a stage)
        for n, p in module.named_parameters(remove_duplicate=False):
            s = next(i for i, ns in enumerate(names) if n in ns)
            out[s] += p.detach().double().sum()
    return [float(x) for x in out]


def names_by_base_stage(base: WorkerConfig) -> list[set[str]]:
    """The parameter names of each stage of the base job, built on the meta device (no
    memory, no initialisation): the summary reports checksums per base stage whatever
    shape the run ended in, so that they compare with the unreshaped reference."""
    S, wl = base.job.stages, base.workload
    with torch.device("meta"):
        return [{n for n, _ in wl.build_stage(base.model, s, S).named_parameters()}
                for s in range(S)]
