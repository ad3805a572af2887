"""Weights tied across stages (a first-stage embedding that is also the last stage's head,
as GPT-2 and small Llamas do, and as Megatron splits them).

Each stage holds its own copy of a tied weight. One stage OWNS it (the lowest stage that
uses it: its optimizer state lives there); the others MIRROR it. Per iteration:

  mirror, at its step (after its own all-reduce, so the gradient is summed over its live
      peers): publishes that gradient under (plan version, iteration), leaves the weight
      out of its own step (grad None: AdamW skips it) and out of its clip norm;
  owner, at its step (after its own all-reduce): waits for every mirror's gradient, adds
      them to its own in stage order (g_owner + g_mirror...), so the clip norm counts the
      tied gradient once, steps, and publishes the updated weight once the step is final;
  mirror, at settle() (before the weight is next used, published or saved): waits for
      that value and copies it in. Only then is its step final (the snapshot of the next
      iteration is taken after it, and its final checksum includes it).

Why this way round: with the staggered optimizer the last stage steps first. It never
waits for stage 0 inside an iteration (stage 0's backward of this iteration depends on
its own all-reduce only); stage 0 waits for the last stage's gradient, which comes from
backward passes stage 0's own depend on anyway. The mirror waits for the new value only
before its next forward, which needs stage 0's next activation, sent after stage 0
stepped. So no barrier is added and the update is the sum a single model would apply.

Failures: everything is keyed by (plan version, iteration) in the run's c10d store, like
the clip norms (optim/clip.py): a rolled-back iteration re-runs under a newer version
with fresh keys, and waits leave for a newer plan (a member died before publishing). A
rejoining worker loads its copy with the rest of its stage's state from a live peer of
its own stage (a mirror peer has settled its copy before it sends it).

The exchange goes through the store as bytes: fine for the small tied weights of tests
and debug models (a vocab x d_model matrix); a large vocabulary would want the p2p world
(one gloo send per owner/mirror pair) instead, which is not built yet.

Declaring ties: a stage module built by executor/models (Hugging Face models, plain
module factories) carries `recycle_ties`, the run's whole tie table, so every stage knows
its role from its own module; `find_ties` derives the table from one full model.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from executor.protocol import tied_key

ATTR = "recycle_ties"


@dataclass(frozen=True)
class Tie:
    """One weight shared by several stages: (stage, parameter name in that stage's
    module) per holder, owner first, the others in stage order."""
    holders: tuple[tuple[int, str], ...]

    @property
    def owner(self) -> tuple[int, str]:
        return self.holders[0]

    @property
    def mirrors(self) -> tuple[tuple[int, str], ...]:
        return self.holders[1:]


def find_ties(stage_names: Sequence[dict[int, str]]) -> list[Tie]:
    """stage_names[s]: id(parameter) -> its name in stage s's module, for stage modules
    assembled from ONE full model. A parameter object in several stages is a tie."""
    where: dict[int, list[tuple[int, str]]] = {}
    for s, names in enumerate(stage_names):
        for pid, name in names.items():
            where.setdefault(pid, []).append((s, name))
    return [Tie(tuple(sorted(h))) for h in where.values() if len({s for s, _ in h}) > 1]


def declare(module: nn.Module, ties: Sequence[Tie]) -> nn.Module:
    setattr(module, ATTR, list(ties))
    return module


def ties_of(module: nn.Module) -> list[Tie]:
    return list(getattr(module, ATTR, ()) or ())


def shared(ties: Sequence[Tie], a: int, b: int) -> list[int]:
    """The ties between stages a and b, one the owner and the other a mirror: the order
    their exchanged tensors travel (and are logged) in."""
    out = []
    for k, tie in enumerate(ties):
        o, mirrors = tie.owner[0], {s for s, _ in tie.mirrors}
        if (o == a and b in mirrors) or (o == b and a in mirrors):
            out.append(k)
    return out


def tied_inputs(ties: Sequence[Tie], stage: int) -> tuple[list[int], list[int]]:
    """(the mirror stages whose gradient shares `stage` adds as an owner, the owner stages
    whose values it copies as a mirror)."""
    grads = sorted({s for t in ties if t.owner[0] == stage for s, _ in t.mirrors} - {stage})
    values = sorted({t.owner[0] for t in ties if stage in {s for s, _ in t.mirrors}} - {stage})
    return grads, values


def check_tie_table(ties: Sequence[Tie], modules: Sequence[nn.Module]) -> None:
    """Every holder names a parameter of its stage with the same shape (a wrong table
    would otherwise show as a silent divergence)."""
    for tie in ties:
        shapes = set()
        for s, name in tie.holders:
            params = dict(modules[s].named_parameters())
            if name not in params:
                raise ValueError(f"tie {tie.holders}: stage {s} has no parameter {name!r}")
            shapes.add(tuple(params[name].shape))
        if len(shapes) != 1:
            raise ValueError(f"tie {tie.holders}: shapes differ ({sorted(shapes)})")


# ---- the reference: the same sums in one process ---------------------------------------

def sum_into_owners(modules: Sequence[nn.Module], ties: Sequence[Tie]) -> None:
    """Before the step: owner.grad = owner.grad + mirror.grad (stage order); the mirrors'
    grads go (their copies are not stepped, and the clip norm counts the weight once)."""
    for tie in ties:
        (so, no), mirrors = tie.owner, tie.mirrors
        owner = dict(modules[so].named_parameters())[no]
        for sm, nm in mirrors:
            p = dict(modules[sm].named_parameters())[nm]
            if p.grad is not None:
                owner.grad = p.grad.clone() if owner.grad is None else owner.grad.add_(p.grad)
            p.grad = None


def copy_from_owners(modules: Sequence[nn.Module], ties: Sequence[Tie]) -> None:
    with torch.no_grad():
        for tie in ties:
            so, no = tie.owner
            owner = dict(modules[so].named_parameters())[no]
            for sm, nm in tie.mirrors:
                dict(modules[sm].named_parameters())[nm].copy_(owner)


# ---- the workers: the exchange through the store -----------------------------------------

def _pack(tensors: dict) -> bytes:
    bio = io.BytesIO()
    # a copy of its own: torch.save writes a view's whole storage (a gradient is a view of
    # the stage's flat all-reduce buffer)
    torch.save({k: t.detach().to("cpu", copy=True) for k, t in tensors.items()}, bio)
    return bio.getvalue()


def _unpack(b: bytes) -> dict:
    return torch.load(io.BytesIO(b), weights_only=True)


class TiedExchange:
    """One stage worker's side of its ties (none: every method is a no-op)."""

    def __init__(self, module: nn.Module, stage: int, store):
        self.stage, self.store = stage, store
        params = dict(module.named_parameters())
        self.owned: list[tuple[int, Tensor, tuple]] = []  # (tie index, param, mirrors)
        self.mirrored: list[tuple[int, Tensor, int]] = []  # (tie index, param, owner stage)
        for k, tie in enumerate(ties_of(module)):
            for s, name in tie.holders:
                if s != stage:
                    continue
                if (s, name) == tie.owner:
                    self.owned.append((k, params[name], tie.mirrors))
                else:
                    self.mirrored.append((k, params[name], tie.owner[0]))
        if (self.owned or self.mirrored) and store is None:
            raise ValueError("weights tied across stages need the run's store")
        self.pending: Optional[tuple[int, int]] = None  # mirror: (version, it) awaited
        self.published: list[str] = []  # our keys, deleted once every worker is past them
        # Told what is published, per stage it is for: (kind "grad"|"value", that stage,
        # iteration, its tensors in tie order); the agent's boundary log keeps them, so a
        # lost stage can be replayed (runtime/replay/)
        self.on_publish: Optional[Callable[[str, int, int, tuple], None]] = None
        self.ties = ties_of(module)

    @property
    def active(self) -> bool:
        return bool(self.owned or self.mirrored)

    @property
    def mirror_params(self) -> set[int]:
        return {id(p) for _, p, _ in self.mirrored}

    @staticmethod
    def key(kind: str, version: int, it: int, stage: int) -> str:
        """One blob per (kind, version, iteration, publishing stage): {tie index: tensor}."""
        return tied_key(version, it, kind, stage)

    def _publish(self, key: str, tensors: dict) -> None:
        # Every peer of the stage holds the same tensors (after the all-reduce, or after
        # the same step): the first one's write serves all; a race writes equal bytes.
        if not self.store.check([key]):
            self.store.set(key, _pack(tensors))
        self.published.append(key)

    # mirror
    def send_grads(self, version: int, it: int) -> None:
        """Publish the summed gradients of the mirrored weights and take them out of this
        stage's step (grad None)."""
        if not self.mirrored:
            return
        grads = self.take_shares()
        self._publish(self.key("grad", version, it, self.stage), grads)
        self.tell("grad", it, grads)
        self.pending = (version, it)

    def take_shares(self) -> dict:
        """{tie index: the mirrored weight's summed gradient (zeros where none)}, taken out
        of this stage's step (grad None)."""
        grads = {k: p.grad if p.grad is not None else torch.zeros_like(p)
                 for k, p, _ in self.mirrored}
        for _, p, _ in self.mirrored:
            p.grad = None
        return grads

    def receive_values(self, wait: Callable[[list[str]], None]) -> None:
        """Copy the owner's stepped value into each mirrored weight (the step it awaits)."""
        if self.pending is None:
            return
        version, it = self.pending
        keys = {so: self.key("value", version, it, so) for _, _, so in self.mirrored}
        wait(sorted(set(keys.values())))
        self.copy_values({so: _unpack(self.store.get(key)) for so, key in keys.items()})
        self.pending = None

    def copy_values(self, blobs: dict) -> None:
        """blobs: owner stage -> {tie index: its stepped value}, copied into the mirrors."""
        with torch.no_grad():
            for k, p, so in self.mirrored:
                p.copy_(blobs[so][k])

    # owner
    def add_grads(self, version: int, it: int, wait: Callable[[list[str]], None]) -> None:
        """g_owner + every mirror's gradient, in stage order, in place."""
        if not self.owned:
            return
        stages = sorted({s for _, _, mirrors in self.owned for s, _ in mirrors})
        keys = {s: self.key("grad", version, it, s) for s in stages}
        wait(list(keys.values()))
        self.add_shares({s: _unpack(self.store.get(key)) for s, key in keys.items()})

    def add_shares(self, blobs: dict) -> None:
        """blobs: mirror stage -> {tie index: its gradient share}, added to the owned
        weights' gradients in stage order."""
        for k, p, mirrors in self.owned:
            for s, _ in mirrors:
                g = blobs[s][k].to(p.device, p.dtype)
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)

    def send_values(self, version: int, it: int) -> None:
        if self.owned:
            values = self.values()
            self._publish(self.key("value", version, it, self.stage), values)
            self.tell("value", it, values)

    def values(self) -> dict:
        """{tie index: the owned weight's value}."""
        return {k: p.detach() for k, p, _ in self.owned}

    def tell(self, kind: str, it: int, tensors: dict) -> None:
        """`on_publish` what was (or, in a replay, would have been) published: for each
        stage it is for, the tensors of the ties the two share, in tie order."""
        if self.on_publish is None:
            return
        stages = ({so for _, _, so in self.mirrored} if kind == "grad"
                  else {s for _, _, ms in self.owned for s, _ in ms})
        for s in sorted(stages):
            ks = shared(self.ties, self.stage, s)
            self.on_publish(kind, s, it, tuple(tensors[k] for k in ks))

    def value_missing(self) -> bool:
        """A mirror's step awaits the owner's new value, and the owner has not published
        it (it died first): that step cannot be made final."""
        if self.pending is None:
            return False
        version, it = self.pending
        keys = sorted({self.key("value", version, it, so) for _, _, so in self.mirrored})
        return not self.store.check(keys)

    # both
    def drop_from(self, r: int) -> None:
        """Iterations >= r will be re-run: an awaited value of one of them is not."""
        if self.pending is not None and self.pending[1] >= r:
            self.pending = None

    def forget_before(self, committed: int) -> None:
        """Delete our keys of iterations every worker has settled."""
        keep = []
        for key in self.published:
            if int(key.split("/i", 1)[1].split("/", 1)[0]) < committed:
                self.store.delete_key(key)
            else:
                keep.append(key)
        self.published = keep
