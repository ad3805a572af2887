"""Built-in model families for `--model NAME[:FLAVOUR]`, and the architecture a name fixes.

A family is a Workload factory plus its flavours (executor/models/flavours.py). NAME alone
means the family's default flavour (gpt has none: its shape comes from the architecture
flags, defaults as before). With a flavour, an architecture flag may repeat the flavour's
value but not contradict it; --seq-len may differ (no parameter depends on it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from executor.models.flavours import LLAMA, Flavour

# The GPT's shape when no flag is given (what `recycle train` always used).
GPT_DEFAULTS = dict(d_model=32, n_layers=4, n_heads=2, seq_len=16, vocab=64)
# CLI flag of each architecture field, for the one-line reasons.
FLAGS = dict(d_model="--d-model", n_layers="--layers", n_heads="--heads",
             seq_len="--seq-len", vocab="--vocab")
FREE = {"seq_len"}  # fields a flavour sets by default only


def _gpt():
    from executor.compute.model import DEFAULT_WORKLOAD
    return DEFAULT_WORKLOAD


def _llama():
    from executor.models.llama import workload
    return workload()


@dataclass(frozen=True)
class Family:
    name: str
    workload: Callable  # () -> Workload
    flavours: dict[str, Flavour] = field(default_factory=dict)
    default: Optional[str] = None  # flavour meant by NAME alone


FAMILIES = {
    "gpt": Family("gpt", _gpt),
    "llama": Family("llama", _llama, LLAMA, default="debug"),
}


def split_name(name: str) -> Optional[tuple[Family, Optional[str]]]:
    """(family, flavour) if NAME[:FLAVOUR] names a built-in family, else None (an import
    path). ValueError with the choices for an unknown flavour."""
    head, sep, tail = name.partition(":")
    fam = FAMILIES.get(head)
    if fam is None:
        return None
    if not sep:
        return fam, fam.default
    if tail not in fam.flavours:
        have = ", ".join(f"{fam.name}:{f}" for f in fam.flavours) or f"none; use {fam.name}"
        raise ValueError(f"--model {name}: unknown flavour {tail!r} of {fam.name} "
                         f"(flavours: {have})")
    return fam, tail


def choices() -> str:
    """Every built-in name, for messages."""
    out = []
    for fam in FAMILIES.values():
        out.append(fam.name)
        out.extend(f"{fam.name}:{f}" for f in fam.flavours)
    return ", ".join(out)


def architecture(name: str, **given: Optional[int]) -> dict:
    """ModelConfig's architecture fields for --model NAME and the flags the user gave
    (None: not given). ValueError (one line) when a flag contradicts the flavour."""
    for key, value in given.items():
        if value is not None and value < 1:
            raise ValueError(f"{FLAGS[key]} must be at least 1, not {value}")
    resolved = split_name(name)
    flavour = None
    if resolved is not None and resolved[1] is not None:
        flavour = resolved[0].flavours[resolved[1]]
    if name.startswith("hf:"):  # the Hugging Face config fixes the shape
        from executor.models.hf import shape as hf_shape
        return _within(name, name, hf_shape(name), given)
    if flavour is None:  # gpt or an import path: the flags, else the GPT's defaults
        return {k: (given.get(k) if given.get(k) is not None else v)
                for k, v in GPT_DEFAULTS.items()}
    label = name if ":" in name else f"{name} (= {name}:{resolved[1]})"
    return _within(name, label, flavour.shape(), given)


def _within(name: str, label: str, shape: dict, given: dict) -> dict:
    """shape with the flags given: a free field takes the flag, another must agree."""
    for key, value in given.items():
        if value is None:
            continue
        if key in FREE:
            shape[key] = value
        elif value != shape[key]:
            raise ValueError(f"{FLAGS[key]} {value} contradicts --model {label}, whose "
                             f"{key} is {shape[key]}; leave {FLAGS[key]} out")
    return shape


def flag_values(name: str, d_model, layers, heads, seq_len, vocab) -> tuple[int, ...]:
    """The architecture flags as --model NAME fixes them (None: the flavour's or default),
    in the order given: for checks written against the flags."""
    a = architecture(name, d_model=d_model, n_layers=layers, n_heads=heads,
                     seq_len=seq_len, vocab=vocab)
    return a["d_model"], a["n_layers"], a["n_heads"], a["seq_len"], a["vocab"]
