"""`--model NAME[:FLAVOUR]`: which Workload (executor.compute.model) to train or profile.

NAME is a built-in family (`gpt`, `llama`; executor/models/families.py) with an optional
flavour (`llama:8b`), a Hugging Face config `hf:CONFIG[?key=value&...]`
(executor/models/hf.py), or an import path `package.module:factory`, where `factory` is a
Workload, a callable that takes no argument and returns one, or a plain nn.Module
factory (no argument, or the ModelConfig) with its pieces in order after `?split=`
(`package.module:MyModel?split=emb,blocks.0,blocks.1,head`; none for an nn.Sequential),
which executor/models/modules.py splits into stages. A built-in family's name
wins over a module of the same name. The name travels to every
worker through the coordinator's store, so workers, torchrun'd workers and the reference
all train the same model. Loaded like `python -m` does: the current directory is on the
import path (as are PYTHONPATH and installed packages).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
from typing import Optional

import torch

from executor.compute import draws
from executor.compute.model import ModelConfig, Workload
from executor.models.families import choices, split_name

DEFAULT_MODEL = "gpt"


def _factory(name: str):
    if name.startswith("hf:"):
        from executor.models.hf import workload as hf_workload
        return lambda: hf_workload(name)
    name, _, query = name.partition("?")
    if query:
        return _module_factory(name, query)
    family = split_name(name)  # ValueError for an unknown flavour of a built-in
    if family is not None:
        return family[0].workload
    mod_name, sep, attr = name.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"--model {name!r} is neither a built-in ({choices()}) "
                         f"nor an import path package.module:factory")
    if os.getcwd() not in sys.path:  # as `python -m` would: the current directory first
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # the user's module: any error means "does not load"
        hint = "" if "." in mod_name else f" (built-in: {choices()})"
        raise ValueError(f"--model {name}: cannot import {mod_name}: "
                         f"{type(exc).__name__}: {exc}{hint}") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ValueError(f"--model {name}: module {mod_name} has no {attr!r}") from None


def _module_factory(name: str, query: str):
    """`package.module:factory?split=a,b,c`: a plain nn.Module factory and its pieces."""
    key, sep, value = query.partition("=")
    if key != "split" or not sep or not value or "" in value.split(","):
        raise ValueError(f"--model {name}?{query}: after '?' give split=PIECE,PIECE,... "
                         f"(the model's submodules in forward order)")
    from executor.models.modules import module_workload
    target = _factory(name)
    if not callable(target):
        raise ValueError(f"--model {name}: {type(target).__name__} is not an nn.Module factory")
    return lambda: module_workload(target, value.split(","), reads_tokens=True)


def reshapes(name: str) -> bool:
    """Does workload NAME cut its stages at cfg.boundaries (Workload.reshapes), so that a
    run may change its pipeline's shape? Built-ins by name, without loading them."""
    if name.startswith("hf:"):
        return True
    if "?" in name:  # a module factory's pieces: cut by count, not at boundaries
        return False
    if split_name(name) is not None:
        return True
    try:
        return load_workload(name).reshapes
    except ValueError:
        return False


def load_workload(name: str) -> Workload:
    """The Workload NAME stands for; ValueError with one line if it cannot be had."""
    target = _factory(name)
    if isinstance(target, Workload):
        return target
    if not callable(target):
        raise ValueError(f"--model {name}: {type(target).__name__} is neither a Workload nor "
                         f"a factory returning one")
    try:
        wl = target()
    except Exception as exc:
        raise ValueError(f"--model {name}: the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(wl, Workload):
        raise ValueError(f"--model {name}: the factory returned a {type(wl).__name__}, not an "
                         f"executor.compute.model.Workload")
    return wl


def param_hash(module) -> str:
    """sha256 over every parameter's name, shape, dtype and bytes (on the CPU)."""
    h = hashlib.sha256()
    for n, p in module.named_parameters():
        t = p.detach().cpu().contiguous()
        h.update(f"{n}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _no_empty_stage(wl: Workload, name: str, cfg: ModelConfig, stages: int) -> None:
    """Every stage holds parameters (built on the meta device: no memory): a stage with
    none has nothing to train, and its optimizer refuses it when its worker starts (a
    worker crash the run took for a failure)."""
    for s in range(stages):
        try:
            with torch.device("meta"):
                built = wl.build_stage(cfg, s, stages)
        except Exception:  # noqa: BLE001 - the real builds below say what is wrong
            return
        if next(iter(built.parameters()), None) is None:
            raise ValueError(f"--model {name}: stage {s} of {stages} holds no parameters "
                             f"(--layers {cfg.n_layers} is too few for {stages} stages): "
                             f"give fewer -s or more --layers")


def check_workload(name: str, cfg: ModelConfig, stages: int,
                   notes: Optional[list] = None) -> Workload:
    """Load NAME twice and build every stage from each: the parameters must be identical,
    since every replica (and a rejoining worker, and the reference) builds its own.
    `notes` receives the line naming randomness the runtime cannot key, if any
    (executor/compute/draws.py: a module's own torch.Generator).
    Built-in families are deterministic by construction (tests/test_llama.py and
    test_executor_compute.py hold them to it): building llama:8b twice on the CPU would
    take 64 GB before a GPU profile even starts."""
    first = load_workload(name)
    _no_empty_stage(first, name, cfg, stages)
    if split_name(name) is not None:
        return first
    second = load_workload(name)
    unkeyable: list[str] = []
    for s in range(stages):
        try:
            built = first.build_stage(cfg, s, stages)
            a, b = param_hash(built), param_hash(second.build_stage(cfg, s, stages))
        except Exception as exc:
            raise ValueError(f"--model {name}: build_stage(cfg, {s}, {stages}) raised "
                             f"{type(exc).__name__}: {exc}") from None
        unkeyable += [f"stage {s} {n}" for n in draws.unkeyable(built)]
        if a != b:
            raise ValueError(f"--model {name}: two builds of stage {s} have different "
                             f"parameters; seed the initialisation so every replica builds "
                             f"the same")
    note = draws.unkeyable_note(unkeyable)
    if note and notes is not None:
        notes.append(f"--model {name}: {note}")
    return first
