"""A stage's state as pieces named by parameter, and back (docs/executor.md, "Shapes").

A stage's state (StageRuntime.state) is its module's state dict, its optimizer's state
dict, whose per-parameter entries are numbered in the module's parameter order, and that
order's names. Parameter names are the unsplit model's in every split, so a piece, one
parameter with its optimizer entries (AdamW: step, exp_avg, exp_avg_sq), means the same
whichever stage holds it: a new shape's stage is assembled from pieces of the old
shape's stages, and one provider sends each taker only the pieces its new stage runs.
"""
from __future__ import annotations

from typing import Iterable

from torch import nn

Pieces = dict[str, dict]  # name -> {"param": tensor, "opt": optimizer entries or None}


def split(state: dict) -> Pieces:
    """The pieces of a stage state (StageRuntime.state's format)."""
    names, model, optim = state["names"], state["model"], state["optim"]
    order = [i for group in optim["param_groups"] for i in group["params"]]
    return {n: {"param": model[n], "opt": optim["state"].get(order[k])}
            for k, n in enumerate(names)}


def only(pieces: Pieces, names: Iterable[str]) -> Pieces:
    keep = set(names)
    return {n: p for n, p in pieces.items() if n in keep}


def assemble(module: nn.Module, opt, pieces: Pieces) -> dict:
    """The state of `module` and its optimizer `opt` (built for the new stage) made of
    `pieces`, which must hold every parameter of it; its buffers stay as built."""
    names = [n for n, _ in module.named_parameters()]
    missing = [n for n in names if n not in pieces]
    if missing:
        raise KeyError(f"no piece for {len(missing)} parameter(s), e.g. {missing[0]}")
    model = module.state_dict()
    for n in names:
        model[n] = pieces[n]["param"]
    optim = opt.state_dict()
    optim["state"] = {k: pieces[n]["opt"] for k, n in enumerate(names)
                      if pieces[n]["opt"] is not None}
    return {"names": names, "model": model, "optim": optim}
