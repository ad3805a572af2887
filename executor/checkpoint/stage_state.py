"""One stage's parameters and optimizer state, saved and loaded with DCP.

The state dicts come from torch.distributed.checkpoint.state_dict (parameter names as
keys for the optimizer state too), so a part is readable without knowing how the
optimizer numbers its parameters, and without knowing which partition wrote it:
parameter names are the unsplit model's in every split, so `load_by_name` fills a stage
of any shape from the parts of a checkpoint written under any other (each key from the
part whose metadata lists it). Saving goes to a private temporary directory that is
renamed into place: a writer SIGKILLed mid-save leaves no half checkpoint under the
final name, and a second writer of the same part (a re-run iteration) keeps the first.
A part also names the run that wrote it (RUN_MARK), so that a restore never takes a
part another run left in the same directory for a copy of this run's state.
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


RUN_MARK = "recycle.run"  # in a part: the id of the run that wrote it


def run_of(path: str) -> Optional[str]:
    """The run that wrote the part at `path` (None: unknown, or written before marks)."""
    try:
        with open(os.path.join(path, RUN_MARK)) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def save_state(sd: dict, path: str, run: str = "") -> bool:
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
    if run:
        with open(os.path.join(tmp, RUN_MARK), "w") as fh:
            fh.write(run)
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


def part_keys(path: str) -> set[str]:
    """The flattened keys a part holds ("model.<name>", "optim.state.<name>.<entry>")."""
    return set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)


def load_by_name(module: torch.nn.Module, opt: torch.optim.Optimizer, parts: list[str],
                 lr: Optional[float] = None) -> None:
    """Fill `module` and `opt` (a stage of any shape) from the parts of one checkpoint
    written under any shape: every model entry (parameters, persistent buffers) and every
    optimizer entry of a parameter from the first part that holds it. A model entry no
    part holds is an error (another model); a parameter with no optimizer entries in any
    part never stepped there, and keeps none here either. The saved param_groups are not
    read: their hyper-parameters are the run's (the learning rate is set every step)."""
    msd, osd = get_state_dict(module, opt)
    want_model, want_optim = dict(msd), dict(osd["state"])
    got_optim: set[str] = set()
    ctx = _quiet()
    try:
        for path in parts:
            keys = part_keys(path)
            model = {n: t for n, t in want_model.items() if f"model.{n}" in keys}
            optim = {n: e for n, e in want_optim.items()
                     if all(f"optim.state.{n}.{k}" in keys for k in e)}
            if not model and not optim:
                continue
            dcp.load({"model": model, "optim": {"state": optim}}, checkpoint_id=path,
                     no_dist=True)
            msd.update(model)  # non-tensor values are replaced, not filled in place
            for n, e in optim.items():
                osd["state"][n].update(e)
            got_optim |= set(optim)
            for n in model:
                del want_model[n]
            for n in optim:
                del want_optim[n]
    finally:
        ctx.__exit__(None, None, None)
    if want_model:
        name = sorted(want_model)[0]
        raise KeyError(f"no part of the checkpoint holds {name} "
                       f"({len(want_model)} entries missing)")
    for n in want_optim:  # never stepped where it was saved: no moments to carry over
        osd["state"].pop(n, None)
    set_state_dict(module, opt, model_state_dict=msd, optim_state_dict=osd)
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
