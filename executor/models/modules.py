"""A plain `nn.Module` factory plus a split into stages: a Workload without writing one.

    from executor.models.modules import module_workload
    workload = module_workload(MyModel, ["emb", "blocks.0", "blocks.1", "norm", "head"])

or on the command line `--model package.module:MyModel?split=emb,blocks.0,blocks.1,norm,head`
(an nn.Sequential needs no split: its children are the pieces).

The model's forward must be its PIECES (named submodules, dotted paths) applied in order,
each to the previous one's output (a tuple output reaches the next piece as positional
arguments, and crosses a stage boundary as a tuple activation). `split` is either the
pieces in order (the stages then take contiguous runs of them, as even as possible,
earlier stages taking the remainder) or one list of pieces per stage (then only that many
stages). A stage module keeps its pieces under their full-model names, so its parameter
names are the full model's.

Initialisation: every stage builds the whole model under a private RNG seeded by cfg.seed
and keeps its pieces, so every replica, every split and the reference start from the same
parameters. A parameter the model shares between pieces of different stages (an
embedding reused as the output head) becomes a tie (executor/runtime/steps/tied.py): each stage
holds a copy, and the copies get one summed gradient and stay equal.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from executor.compute import data
from executor.compute.model import ModelConfig, Workload, layer_range, lm_loss
from executor.compute.units import layer
from executor.runtime.steps.tied import declare, find_ties

Split = Union[Sequence[str], Sequence[Sequence[str]]]


def seeded_build(cfg: ModelConfig, build: Callable[[], nn.Module]) -> nn.Module:
    """build() under a private RNG seeded by cfg.seed, whatever used the global RNG before."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(data._seed(cfg.seed, 0xF00D))
        return build()


def call_factory(factory: Callable, cfg: ModelConfig) -> nn.Module:
    """factory(cfg) if it takes an argument, else factory()."""
    try:
        takes = len(inspect.signature(factory).parameters) > 0
    except (TypeError, ValueError):
        takes = False
    model = factory(cfg) if takes else factory()
    if not isinstance(model, nn.Module):
        raise ValueError(f"the factory returned a {type(model).__name__}, not an nn.Module")
    return model


def stage_pieces(split: Split, stage: int, stages: int) -> tuple[int, list[str]]:
    """(the place of the stage's first piece in the whole split, its pieces)."""
    if split and not isinstance(split[0], str):
        if len(split) != stages:
            raise ValueError(f"the split lists {len(split)} stages, the run has {stages}")
        return sum(len(p) for p in split[:stage]), list(split[stage])
    if len(split) < stages:
        raise ValueError(f"{len(split)} pieces cannot fill {stages} stages")
    lo, hi = layer_range(len(split), stage, stages)
    return lo, list(split[lo:hi])


def _attach(root: nn.Module, dotted: str, piece: nn.Module) -> None:
    """Register `piece` under its dotted full-model path, creating empty containers."""
    parts = dotted.split(".")
    node = root
    for part in parts[:-1]:
        child = node._modules.get(part)
        if child is None:
            child = nn.Module()
            node.add_module(part, child)
        node = child
    node.add_module(parts[-1], piece)


class PiecesStage(nn.Module):
    """One stage: its pieces, applied in order. Each piece is a layer of the whole model
    (units.py), numbered by its place in the split: its draws are keyed by that number, and
    activation checkpointing may recompute any piece."""

    def __init__(self, full: nn.Module, names: Sequence[str], first: int = 0):
        super().__init__()
        self.piece_names = list(names)
        self.first = first
        self._order = []
        for name in names:
            try:
                piece = full.get_submodule(name)
            except AttributeError:
                raise ValueError(f"the model has no submodule {name!r}") from None
            _attach(self, name, piece)
            self._order.append(piece)

    def forward(self, *x):
        out = x if len(x) > 1 else x[0]
        for k, piece in enumerate(self._order, self.first):
            out = layer(k, piece, *out, block=k) if isinstance(out, tuple) else \
                layer(k, piece, out, block=k)
        return out


def _names(module: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in module.named_parameters()}  # a shared one: its first name


def build_pieces(full: nn.Module, split: Split, stage: int, stages: int) -> nn.Module:
    """Stage `stage` of `full`, with the run's tie table (from all stages of this build)."""
    mods = []
    for s in range(stages):
        first, names = stage_pieces(split, s, stages)
        mods.append(PiecesStage(full, names, first))
    held = {pid for m in mods for pid in _names(m)}
    left = [n for n, p in full.named_parameters() if id(p) not in held]
    if left:  # the forward would skip them: a split that does not name every piece
        raise ValueError(f"the split leaves out parameters of the model: {', '.join(left[:4])}"
                         f"{' ...' if len(left) > 4 else ''}")
    return declare(mods[stage], find_ties([_names(m) for m in mods]))


def module_workload(factory: Callable, split: Optional[Split] = None, *,
                    loss_fn: Callable[[Tensor, Tensor], Tensor] = lm_loss,
                    microbatch: Callable = data.microbatch, reads_tokens: bool = False,
                    **workload_kw) -> Workload:
    """A Workload from a module factory (no argument, or the ModelConfig) and a split.
    split None: the model must be an nn.Sequential (its children are the pieces)."""

    def build_stage(cfg: ModelConfig, stage: int, stages: int) -> nn.Module:
        full = seeded_build(cfg, lambda: call_factory(factory, cfg))
        pieces = split
        if pieces is None:
            if not isinstance(full, nn.Sequential):
                raise ValueError(f"{type(full).__name__} is not an nn.Sequential: name its "
                                 f"pieces (split=[...], or ?split=a,b,c after --model)")
            pieces = [n for n, _ in full.named_children()]
        return build_pieces(full, pieces, stage, stages)

    return Workload(build_stage=build_stage, loss_fn=loss_fn, microbatch=microbatch,
                    reads_tokens=reads_tokens, **workload_kw)
