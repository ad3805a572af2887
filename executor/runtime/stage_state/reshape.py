"""Entering a plan of another shape (docs/executor.md, "Shapes"): every member ends up
with its new stage's state after one agreed iteration, assembled by parameter name from
the old shape's stages.

One all-gather of (old shape, old stage, last settled iteration, needs state, old
boundaries) decides, the same on every member:
- every old stage has a live member with state: the job goes on at 1 + the lowest
  iteration such a member stepped (members ahead roll back with their pre-step copies),
  and the lowest member of each old stage provides it;
- some old stage has none (every holder died: what shrinks a shape most often): every
  old stage goes back to the newest iteration all of them have a copy of in some tier
  (entry_plan.py's plan_restore rule: own host copies, held peer-memory snapshots, this run's disk
  checkpoints, or the run's start), and the lowest member holding each provides it; at a
  disk checkpoint or the run's start every member builds its new stage from there itself
  (by name from the checkpoint's parts, or from the seed): nothing moves.
Each provider then sends every member whose new stage runs some of its stage's
parameters those pieces (one blob per pair, in one global order: no cycle of blocking
sends), each member builds its new stage (the model cut at the plan's partition), loads
what it received and, once all have (one more all-gather), takes it. A member that fails
before then keeps the old shape, so a later plan finds every member with state in one
shape. The old shape's snapshots and boundary logs go: their stage numbers mean other
units now (the next snapshot is of the new shape; until then a stage lost whole rolls the
job back to the newest disk checkpoint, or the run's start).
"""
from __future__ import annotations


import dataclasses
import time

import torch

from executor.protocol import RolledBack
from executor.runtime.peer_snapshots.wire import held_state
from executor.runtime.stage_state import by_name
from executor.runtime.stage_state.disk_tier import disk_copies
from executor.runtime.stage_state.entry_plan import Has, decode, encode, tier_of
from executor.runtime.stage_state.settled import NoCopy, settled
from executor.runtime.stage_state.shape import shape_id
from executor.runtime.worker_config import WorkerConfig

from executor.runtime.stage_handle import StageHandle

NONE = -2


class ShapeMismatch(RuntimeError):
    """Members hold state of different shapes (cannot happen: a change commits on all)."""


def names_of(conf: WorkerConfig, stages: int) -> list[set[str]]:
    """The parameter names of each stage of the model `conf` cut into `stages` stages
    (built on the meta device: no memory, no initialisation)."""
    wl = conf.workload
    with torch.device("meta"):
        return [{n for n, _ in wl.build_stage(conf.model, s, stages).named_parameters()}
                for s in range(stages)]


def needed(plan) -> bool:
    """Is entering `plan` a change of shape? Decided by all members alike: a plan with a
    partition asks every member (the one all-gather of `reshape`); one without keeps the
    job's own shape, which a run that changed shape never goes back to (the coordinator
    keeps a partition on every later plan)."""
    return plan.partition is not None


def reshape(h: StageHandle, plan, new: WorkerConfig, synced_cls):
    """Enter `plan` (its shape `new`); returns `synced_cls(iteration, how, source)`, or
    None when every member with state holds the new shape already (plain sync then)."""
    world, st = h.world, h.state
    t0 = time.perf_counter()
    old = h.conf
    # the same width on every member: a shape never has more stages than the job's own
    width = max(old.model.n_layers + 1, h.base.stages)
    row = [shape_id(old), old.stages, h.stage.stage, _settled(h), int(st.fresh),
           *_padded(old.model.boundaries, width)]
    info = world.allgather_ints(row)
    holders = {w: r for w, r in info.items() if not r[4]}
    ids = {r[0] for r in holders.values()}
    if len(ids) > 1:
        raise ShapeMismatch(f"members hold state of {len(ids)} shapes")
    if not holders or ids == {shape_id(new)}:
        return None  # nothing moves by name: the plain sync (fresh members load a peer's)
    first = next(iter(holders.values()))
    S_old = first[1]
    old_conf = dataclasses.replace(old, model=dataclasses.replace(
        old.model, boundaries=tuple(b for b in first[5:] if b != NONE)))
    served = {r[2] for r in holders.values()}
    if served == set(range(S_old)):
        k = min(r[3] for r in holders.values())
        providers = {s: min(w for w, r in holders.items() if r[2] == s) for s in range(S_old)}
        if not st.fresh:
            _settle_at(h, k)
        source = "live workers"
    else:
        k, providers, source = _restore_point(h, info, S_old)
    me = st.me
    old_names = names_of(old_conf, S_old)
    new_names = names_of(new, new.stages)
    pieces: by_name.Pieces = {}
    for s in range(S_old if providers is not None else 0):
        p = providers[s]
        src = by_name.split(_state_of(h, s, k)) if me == p else None
        for t in sorted(world.workers):
            if not old_names[s] & new_names[t[1]]:
                continue
            if t == p == me:
                pieces.update(by_name.only(src, new_names[t[1]]))
            elif me == p:
                world.send_blob(by_name.only(src, new_names[t[1]]), t)
            elif me == t:
                pieces.update(world.recv_blob(p))
    stage = h.new_stage(me[1], new)  # as at the run's start: the seed's state
    try:
        if providers is not None:
            stage.load_state(by_name.assemble(stage.module, stage.opt, pieces))
        elif k != st.origin:  # every member reads the checkpoint: its new stage by name
            stage.load_parts(st.disk[k])
        stage.stepper.reset(k + 1)
        world.allgather_ints([1])  # every member has its new stage: take them
    except BaseException:
        stage.close()
        raise
    h.take_shape(new, stage, k)
    if source != "live workers":
        st.restored_at = k
        if me == world.workers[0]:
            top = max(r[3] for r in info.values())
            h.source.send(RolledBack(to=k, tier=source, again=max(0, top - k), why=(
                "a stage lost whole before a change of shape: every stage goes back to the "
                "newest copy of all of them")))
    h.log(f"changed shape to {new.stages} stages (blocks from {list(new.model.boundaries)}) "
              f"at iteration {k + 1}: stage {me[1]} from {source} in "
              f"{time.perf_counter() - t0:.3f} s")
    return synced_cls(k + 1, "reshaped", source)


def _padded(values, width: int) -> list[int]:
    return list(values)[:width] + [NONE] * (width - len(values))


def _settled(h: StageHandle) -> int:
    return settled(h) if not h.state.fresh else -1


def _settle_at(h: StageHandle, k: int) -> None:
    """Own (old) stage at its state after step k: rolled back if ahead, else settled."""
    st, stepper = h.state, h.stage.stepper
    if st.done > k:
        stepper.rollback(k + 1)
        h.log(f"rolled back iterations {k + 1}..{st.done} to change shape")
        st.done = k
    else:
        stepper.settle()


def _restore_point(h: StageHandle, info: dict, S_old: int):
    """The newest iteration every old stage has a copy of; a provider of each (None when
    every member builds its new stage itself: at the run's start or a disk checkpoint
    that every member reads); and the tier, in words."""
    world = h.world
    mine = _has(h)
    rows = world.allgather_ints(encode(mine, S_old))
    members = {w: decode(r, S_old) for w, r in rows.items()}
    have: dict[int, set[int]] = {s: set() for s in range(S_old)}
    for h in members.values():
        for s, its in h.copies.items():
            have.setdefault(s, set()).update(its)
    # a run from its seed has every stage's state before its first step anywhere, and a
    # disk checkpoint that every member reads holds every stage of any shape by name:
    # each member builds its new stage there (nothing moves)
    everywhere = set.intersection(*(set(h.disk) | ({h.origin} if h.origin is not None
                                                    else set()) for h in members.values()))
    for s in range(S_old):
        have[s] |= everywhere
    common = set.intersection(*have.values())
    if not common:
        raise NoCopy("a stage lost whole before a change of shape and no iteration has a "
                     "copy of every stage in any tier (live workers, peer-memory snapshots, "
                     "this run's disk checkpoints, the seed): resume from a checkpoint")
    k = max(common)
    if k in everywhere:
        return k, None, tier_of(members, k)
    providers = {s: min(w for w, h in members.items() if h.can_give(s, k))
                 for s in range(S_old)}
    return k, providers, "peer-memory snapshots"


def _has(h: StageHandle) -> Has:
    snaps, st = h.snaps, h.state
    stage = -1 if st.fresh else h.stage.stage
    out: dict[int, set] = {}
    if snaps is not None:
        if stage >= 0 and snaps.local.stage == stage:
            out[stage] = set(snaps.local.iterations())
        for s, its in snaps.host.held().items():
            out.setdefault(s, set()).update(its)
    st.disk = disk_copies(h.base)
    # a member with no state yet builds its new stage like any other: the seed and disk
    # checkpoints serve it as well (reported as its origin and disk copies)
    return Has(stage, {s: tuple(sorted(i)) for s, i in out.items() if i}, st.origin,
               tuple(st.disk))


def _state_of(h: StageHandle, s: int, k: int) -> dict:
    """Old stage s's state after step k, from this provider: its own stage (live, or its
    host copy), the seed at the run's start, or a snapshot it holds."""
    st, snaps = h.state, h.snaps
    own = not st.fresh and h.stage.stage == s
    if own and st.done == k:
        return h.stage.state()
    if own and snaps is not None and snaps.local.stage == s and k in snaps.local.iterations():
        return snaps.local.state(k)
    if own and k == st.origin:
        return h.stage.initial_state(s)
    if own and k in st.disk:
        return h.stage.initial_state(s, st.disk[k])
    return held_state(snaps.host.get(s, k))
