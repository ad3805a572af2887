"""One stage's parameters and optimizer state, saved and loaded with DCP.

The state dicts come from torch.distributed.checkpoint.state_dict (parameter names as
keys for the optimizer state too), so a part is readable without knowing how the
optimizer numbers its parameters. Saving goes to a private temporary directory that is
renamed into place: a writer SIGKILLed mid-save leaves no half checkpoint under the
final name, and a second writer of the same part (a re-run iteration) keeps the first.
"""
from __future__ import annotations

import os
import shutil
import warnings
from typing import Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils._pytree import tree_map_only


def _quiet():
    # Workers build their groups without init_process_group: DCP warns that it saves and
    # loads in a single process, which is exactly what one stage part is.
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", message=".*single process.*")
    return ctx


def stage_state(module: torch.nn.Module, opt: torch.optim.Optimizer, copy: bool = True) -> dict:
    """{"model", "optim"} as get_state_dict gives them; `copy` clones the tensors, so the
    next step (which updates parameters and moments in place) may run during the save."""
    msd, osd = get_state_dict(module, opt)
    sd = {"model": msd, "optim": osd}
    if copy:
        sd = tree_map_only(torch.Tensor, lambda t: t.detach().clone(), sd)
    return sd


def save_state(sd: dict, path: str) -> bool:
    """Write `path` (a DCP directory); False if another writer got there first."""
    if os.path.isdir(path):
        return False
    tmp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    ctx = _quiet()
    try:
        dcp.save(sd, checkpoint_id=tmp, no_dist=True)
    finally:
        ctx.__exit__(None, None, None)
    try:
        os.rename(tmp, path)
    except OSError:  # the part exists already (same iteration, written by a peer)
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def save_stage(module: torch.nn.Module, opt: torch.optim.Optimizer, path: str) -> bool:
    return save_state(stage_state(module, opt, copy=False), path)


def load_stage(module: torch.nn.Module, opt: torch.optim.Optimizer, path: str,
               lr: Optional[float] = None) -> None:
    """Load a part into `module` and `opt` in place. `lr`, if given, replaces the saved
    learning rate (the run's own --lr is honoured on resume)."""
    msd, osd = get_state_dict(module, opt)
    sd = {"model": msd, "optim": osd}
    ctx = _quiet()
    try:
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    finally:
        ctx.__exit__(None, None, None)
    set_state_dict(module, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
