"""Keyed randomness (docs/design.md section 7): every random draw a stage's forward makes
comes from generators seeded by (seed, iteration, global micro-batch g, unit).

A micro-batch then draws the same dropout mask on whichever worker, stage split or replay
runs it, and a recomputation (the I/W split's backward under activation checkpointing)
draws it again identically. "Unit" is a layer's index in the whole model
(executor/compute/units.py), so moving stage boundaries does not change the draws.

The generators keyed are torch's default ones a forward draws from: the CPU's, and on a
GPU that device's. They are saved before a stage's forward and restored after it (a
fork, as torch.random.fork_rng, without its 80 us: 1-2 us on the generators), so keyed forwards
never move the process's own random state.

Which stages are keyed: those that look random (a dropout module with p > 0 in training
mode, a float attribute or config field named like a drop rate above 0: Hugging Face's
`attention_dropout`, a DropPath's `drop_prob`), and any stage whose first forward, keyed
to find out, moved a generator (functional dropout, noise). A stage that draws nothing
pays nothing after its first forward. What cannot be keyed is named, not ignored: a
module holding its own torch.Generator (`unkeyable`); numpy or `random` draws cannot be
seen at all (docs/executor.md, "Randomness").
"""
from __future__ import annotations

import logging
from typing import NamedTuple, Optional

import torch
from torch import nn

from executor.compute.data import _MASK, _seed

log = logging.getLogger("recycle.compute")
_DOMAIN = 0xD207  # keeps these seeds apart from the data's and the initialisation's


class Key(NamedTuple):
    """Which forward draws: the run's seed, the iteration and the global micro-batch."""
    seed: int
    iteration: int
    g: int

    def base(self) -> int:
        """The seed of the forward, which each unit mixes its index into (unit_seed)."""
        return _seed(self.seed, _DOMAIN, self.iteration, self.g)


def unit_seed(base: int, unit: int) -> int:
    """_seed(seed, _DOMAIN, iteration, g, unit), its last step alone (per layer: 0.3 us)."""
    return ((base ^ (unit & _MASK)) * 0x100000001B3 + 0x632BE59BD9B4E019) & _MASK


def generators(device: torch.device) -> list[torch.Generator]:
    """The default generators a forward on `device` draws from."""
    gens = [torch.default_generator]
    if device.type == "cuda":
        torch.cuda.init()  # default_generators is filled at initialisation
        idx = device.index if device.index is not None else torch.cuda.current_device()
        gens.append(torch.cuda.default_generators[idx])
    return gens


def _drop_rate(name: str, value) -> bool:
    return isinstance(value, float) and value > 0 and "drop" in name.lower()


def random_parts(module: nn.Module) -> list[str]:
    """Submodules (by name) that draw in training mode: dropout modules with p > 0, and
    modules with a drop-rate attribute or config field above 0."""
    out = []
    for name, m in module.named_modules():
        if not m.training:
            continue
        if isinstance(m, nn.modules.dropout._DropoutNd):
            if m.p > 0:
                out.append(name or "(stage)")
            continue
        conf = getattr(m, "config", None)
        attrs = list(vars(m).items()) + (list(vars(conf).items()) if conf is not None
                                          and hasattr(conf, "__dict__") else [])
        if any(_drop_rate(k, v) for k, v in attrs):
            out.append(name or "(stage)")
    return out


def unkeyable(module: nn.Module) -> list[str]:
    """Attributes holding their own torch.Generator: draws the runtime cannot key."""
    return [f"{name}.{k}" if name else k for name, m in module.named_modules()
            for k, v in vars(m).items() if isinstance(v, torch.Generator)]


def unkeyable_note(names: list[str]) -> Optional[str]:
    """The one line that names them (None if there are none)."""
    if not names:
        return None
    return (f"randomness the runtime cannot key (a module's own torch.Generator): "
            f"{', '.join(names)}; its draws depend on which worker ran what, so runs with "
            f"and without failures may differ (draw from torch's default generator instead)")


class Draws:
    """The keying of one stage: its generators and whether its forwards are keyed."""

    def __init__(self, module: nn.Module, device: torch.device, where: str = "stage",
                 name_unkeyable: bool = True):
        self.device = device
        self.gens = generators(device)
        self.where = where
        self.keyed = bool(random_parts(module))
        # not known to draw: its first forward is keyed and watched (probe)
        self.probing = not self.keyed
        self._fresh: list = []  # the generators' states right after the last seeding
        self._moved = False
        note = unkeyable_note(unkeyable(module)) if name_unkeyable else None
        if note:
            log.warning("%s: %s", where, note)

    @property
    def seeds(self) -> bool:
        """Whether the forward starting now is keyed."""
        return self.keyed or self.probing

    def save(self) -> list:
        return [g.get_state() for g in self.gens]

    def restore(self, states: list) -> None:
        for g, st in zip(self.gens, states):
            g.set_state(st)

    def seed(self, base: int, unit: int) -> None:
        """Seed every generator for `unit` of the forward whose Key.base() is `base`."""
        if self.probing:
            self._check()
        s = unit_seed(base, unit)
        for g in self.gens:
            g.manual_seed(s)
        if self.probing:
            self._fresh = [g.get_state() for g in self.gens]

    def end_probe(self) -> None:
        """After the first forward: keyed from now on if it drew, else never again."""
        if not self.probing:
            return
        self._check()
        self.probing = False
        if self._moved:
            self.keyed = True
            log.info("%s draws random numbers in its forward: keyed by "
                     "(seed, iteration, micro-batch, unit)", self.where)

    def _check(self) -> None:
        if self._fresh and not self._moved:
            self._moved = any(not torch.equal(g.get_state(), st)
                              for g, st in zip(self.gens, self._fresh))
