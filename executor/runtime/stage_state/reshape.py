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
from executor.runtime.stage_state.entry_plan import (EntryOp, Has, ShapeMismatch, ShapeRow,
                                                     decode, encode, live_source, old_shape,
                                                     reshape_steps, restore_source)
from executor.runtime.stage_state.settled import NoCopy, settled
from executor.runtime.stage_state.shape import shape_id
from executor.runtime.steps.interpreter import run_steps
from executor.runtime.worker_config import WorkerConfig

from executor.runtime.stage_handle import StageHandle

__all__ = ["ShapeMismatch", "names_of", "needed", "reshape"]
NONE = -2


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
    None when every member with state holds the new shape already (plain sync then).
    Decided by entry_plan.py (old_shape, live_source, restore_source, reshape_steps),
    carried out here through the iteration's interpreter."""
    world, st = h.world, h.state
    t0 = time.perf_counter()
    old = h.conf
    # the same width on every member: a shape never has more stages than the job's own
    width = max(old.model.n_layers + 1, h.base.stages)
    row = [shape_id(old), old.stages, h.stage.stage, _settled(h), int(st.fresh),
           *_padded(old.model.boundaries, width)]
    rows = {w: ShapeRow(r[0], r[1], r[2], r[3], bool(r[4]), tuple(b for b in r[5:] if b != NONE))
            for w, r in world.allgather_ints(row).items()}
    first = old_shape(rows, shape_id(new))
    if first is None:
        return None  # nothing moves by name: the plain sync (fresh members load a peer's)
    S_old = first.stages
    src = live_source(rows, S_old)
    if src is None:
        rows_has = world.allgather_ints(encode(_has(h), S_old))
        members = {w: decode(r, S_old) for w, r in rows_has.items()}
        src = restore_source(members, S_old)
        if src is None:
            raise NoCopy("a stage lost whole before a change of shape and no iteration has a "
                         "copy of every stage in any tier (live workers, peer-memory "
                         "snapshots, this run's disk checkpoints, the seed): resume from a "
                         "checkpoint")
    old_conf = dataclasses.replace(old, model=dataclasses.replace(
        old.model, boundaries=first.boundaries))
    new_names = names_of(new, new.stages)
    steps = reshape_steps(src, st.me, rows[st.me], st.done, st.origin, world.workers,
                          names_of(old_conf, S_old), new_names)
    k, me = src.iteration, st.me
    pieces: by_name.Pieces = {}
    got: dict = {}

    def rollback(step) -> None:
        h.stage.stepper.rollback(step.it)
        h.log(f"rolled back iterations {step.it}..{st.done} to change shape")
        st.done = step.it - 1

    def keep(step) -> None:
        pieces.update(by_name.only(_split(step.stage), new_names[me[1]]))

    def send(step) -> None:
        world.send_blob(by_name.only(_split(step.stage), new_names[step.peer[1]]), step.peer)

    def _split(s: int) -> dict:
        if s not in got:
            got[s] = by_name.split(_state_of(h, s, k))
        return got[s]

    def build(step) -> None:
        got["new"] = h.new_stage(me[1], new)  # as at the run's start: the seed's state

    def tell(step) -> None:
        top = max(r.settled for r in rows.values())
        h.source.send(RolledBack(to=k, tier=src.tier, again=max(0, top - k), why=(
            "a stage lost whole before a change of shape: every stage goes back to the "
            "newest copy of all of them")))
    try:
        run_steps(steps, {
            EntryOp.ROLLBACK: rollback, EntryOp.SETTLE: lambda step: h.stage.stepper.settle(),
            EntryOp.KEEP_PIECES: keep, EntryOp.SEND_PIECES: send,
            EntryOp.RECV_PIECES: lambda step: pieces.update(world.recv_blob(step.peer)),
            EntryOp.BUILD_STAGE: build,
            EntryOp.LOAD_PIECES: lambda step: got["new"].load_state(
                by_name.assemble(got["new"].module, got["new"].opt, pieces)),
            EntryOp.LOAD_PARTS: lambda step: got["new"].load_parts(st.disk[step.it]),
            EntryOp.RESTART_AFTER: lambda step: got["new"].stepper.reset(step.it + 1),
            EntryOp.AGREE: lambda step: world.allgather_ints([1]),  # all have one: take
            EntryOp.TAKE_SHAPE: lambda step: h.take_shape(new, got.pop("new"), step.it),
            EntryOp.TELL_ROLLBACK: tell})
    except BaseException:
        if "new" in got:  # a member that fails before taking keeps the old shape
            got["new"].close()
        raise
    if not src.live:
        st.restored_at = k
    h.log(f"changed shape to {new.stages} stages (blocks from {list(new.model.boundaries)}) "
          f"at iteration {k + 1}: stage {me[1]} from {src.tier} in "
          f"{time.perf_counter() - t0:.3f} s")
    return synced_cls(k + 1, "reshaped", src.tier)


def _padded(values, width: int) -> list[int]:
    return list(values)[:width] + [NONE] * (width - len(values))


def _settled(h: StageHandle) -> int:
    return settled(h) if not h.state.fresh else -1


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
