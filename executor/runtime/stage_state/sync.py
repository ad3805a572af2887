"""Entering a plan version: every member of the new world agrees on the iteration to
train next and ends up with its stage's state after the one before (docs/executor.md,
"Failures and rollback", "Moves", "Peer-memory snapshots", "Replay of a lost stage").

Decided by one all-gather of (last settled iteration, needs state):
- every stage has a live member with state: training resumes at 1 + the lowest iteration
  such a member stepped; members ahead roll back with the stepper's pre-step copies, and
  members with no state (restarted, or moved in from another stage) receive it from a
  live member of their stage;
- some stage has none (every holder died): the survivors do as above, and the lost
  stage's new members load its newest snapshot and replay the iterations since from the
  boundary logs (executor/runtime/replay/), when the live workers logged every input
  they need; else the job rolls back to the newest iteration every stage has a copy of
  in some tier (entry_plan.py's plan_restore: own host copies and held peer-memory
  snapshots, this run's complete disk checkpoints, loaded by name, or the run's start,
  which every member rebuilds from the seed or from the checkpoint it resumed from), and
  re-trains from there. With snapshots off the disk checkpoints and the seed are the only tiers.
"""
from __future__ import annotations


from dataclasses import dataclass
from typing import Optional

from executor.protocol import RolledBack
from executor.runtime.peer_snapshots import fetch
from executor.runtime.peer_snapshots.wire import held_state
from executor.runtime.replay import replayer
from executor.runtime.stage_state import reshape
from executor.runtime.stage_state.disk_tier import disk_copies
from executor.runtime.stage_state.entry_plan import (EntryKind, EntryOp, Has, decode, encode,
                                                     plan_entry, plan_restore, restore_steps,
                                                     tier_of)
from executor.runtime.stage_state.settled import NoCopy, settled as _settled
from executor.runtime.stage_state.shape import shaped_config
from executor.runtime.steps.interpreter import run_steps

from executor.runtime.stage_handle import StageHandle


@dataclass(frozen=True)
class Synced:
    """What entering a version decided for this worker."""
    iteration: int  # the iteration the members train next
    how: str  # "kept" (its state as it was), "rolled back" (its own pre-step copies),
    #           "loaded" (from a live peer), "restored" (the job rolled back to snapshots),
    #           "replayed" (its stage was lost: snapshot + replay), "reshaped" (the plan
    #           changed shape: its new stage's state by name, reshape.py)
    source: str = ""  # where a loaded or restored state came from


def sync_state(h: StageHandle, plan) -> Synced:
    """Agree with the members of the new world on the iteration to train next; `h`
    holds its stage's state after the one before when this returns. The decision is
    entry_plan.py's (pure), its steps run here."""
    world, st = h.world, h.state
    if reshape.needed(plan):
        synced = reshape.reshape(h, plan, shaped_config(h.base, plan), Synced)
        if synced is not None:
            return synced
    rows = {w: (done, bool(fresh)) for w, (done, fresh) in
            world.allgather_ints([_settled(h), int(st.fresh)]).items()}
    d = plan_entry(rows, st.me, st.done, h.conf.stages)
    if d.kind is EntryKind.RESTORE:
        k, source = restore_from_snapshots(h, plan, top=d.top)
        return Synced(k + 1, "restored", source)
    if d.kind is EntryKind.RESUME:
        return Synced(d.iteration, *run_entry(h, d.steps))
    r, lost = d.iteration, list(d.lost)
    members = _holdings(h)
    rp, why = (replayer.decide(h, lost, r, _held(members)) if h.snaps is not None
               else (None, "snapshots are off"))
    if rp is None:
        k, source = restore_from_snapshots(h, plan, members, why, top=d.top)
        return Synced(k + 1, "restored", source)
    synced = Synced(r, *run_entry(h, d.steps)) if d.steps else None
    source = replayer.carry_out(h, plan, rp, _held_by(members))
    h.boundary_log.forget_from(r)
    if synced is None:
        h.stage.stepper.reset(r)
        return Synced(r, "replayed", source)
    return synced


def run_entry(h: StageHandle, steps, plan=None, rolled_back: Optional[dict] = None
              ) -> tuple[str, str]:
    """A member's entry steps (entry_plan.py), through the iteration's interpreter
    (steps/interpreter.py run_steps) with a handler per op: (how its state came, whence).
    A restore's steps also take its `plan` (whose worker holds a snapshot) and
    `rolled_back`, its words for the coordinator (why, tier, top)."""
    st, stage, world = h.state, h.stage, h.world
    got = {"how": "kept", "source": ""}

    def rollback(step) -> None:
        stage.stepper.rollback(step.it)
        h.log(f"rolled back iterations {step.it}..{st.done} (plan v{world.version})")
        got["how"] = "rolled back"

    def keep_before(step) -> None:
        stage.stepper.keep_before(step.it)
        h.boundary_log.forget_from(step.it)

    def receive(step) -> None:
        stage.load_state(world.recv_blob(step.peer))
        st.fresh = False
        if rolled_back is None:
            h.log(f"loaded stage {st.me[1]} state from worker {step.peer} at iteration "
                  f"{_before(steps)}")
        got.update(how="loaded", source=f"worker {step.peer}")

    def send(step) -> None:
        state = stage.state()
        for w in step.peers:
            world.send_blob(state, w)

    def restore_own(step) -> None:
        state, whence = _copy_of(h, st.me[1], step.it)
        stage.load_state(state)
        got["source"] = whence

    def fetch_snapshot(step) -> None:
        holder = plan.worker_id(*step.peer)
        _, state = fetch(h.store, holder, st.me[1], step.it, timeout_s=h.snaps.timeout_s)
        stage.load_state(state)
        got["source"] = f"the snapshot held by worker {holder}"

    def restart_after(step) -> None:
        k = step.it
        h.log(f"restored stage {st.me[1]} at iteration {k} from {got['source']}")
        stage.stepper.reset(k + 1)
        if h.snaps is not None:
            h.snaps.local.drop_after(k)
            h.snaps.host.forget(None, k)
        h.boundary_log.rolled_back_to(k)
        st.fresh, st.restored_at = False, k
        h.log(f"rolled back to iteration {k} from {rolled_back['tier']} (plan v{world.version})")
        got["how"] = "restored"

    def tell_rollback(step) -> None:
        h.source.send(RolledBack(to=step.it, tier=rolled_back["tier"],
                                 why=rolled_back["why"] or "no live worker kept any stage's state",
                                 again=max(0, rolled_back["top"] - step.it)))
    run_steps(steps, {EntryOp.ROLLBACK: rollback, EntryOp.KEEP_BEFORE: keep_before,
                      # our last step is the state we train on (and may send)
                      EntryOp.SETTLE: lambda step: stage.stepper.settle(),
                      EntryOp.RECV_STATE: receive, EntryOp.SEND_STATE: send,
                      EntryOp.RESTORE_OWN: restore_own, EntryOp.FETCH_SNAPSHOT: fetch_snapshot,
                      EntryOp.RESTART_AFTER: restart_after,
                      EntryOp.TELL_ROLLBACK: tell_rollback})
    return got["how"], got["source"]


def _before(steps) -> int:
    """The iteration whose state a member receives: the one before r."""
    return next(s.it for s in steps if s.op is EntryOp.KEEP_BEFORE) - 1


def _holdings(h: StageHandle) -> dict:
    """What each member can provide of every stage's state (one all-gather)."""
    world, st, S = h.world, h.state, h.conf.stages
    copies = _copies(h) if h.snaps is not None else {}
    st.disk = disk_copies(h.base)
    rows = world.allgather_ints(encode(Has(st.me[1], copies, st.origin, tuple(st.disk)), S))
    return {w: decode(row, S) for w, row in rows.items()}


def _held(members: dict) -> dict[int, set]:
    """stage -> iterations some member holds a snapshot of (own copies of a stage it
    trains are no use to a lost stage: it has none)."""
    out: dict[int, set] = {}
    for h in members.values():
        for s, its in h.copies.items():
            out.setdefault(s, set()).update(its)
    return out


def _held_by(members: dict) -> dict:
    """(stage, iteration) -> the lowest member holding that snapshot."""
    out: dict = {}
    for w in sorted(members, reverse=True):
        for s, its in members[w].copies.items():
            for i in its:
                out[(s, i)] = w
    return out


def _copies(h: StageHandle) -> dict[int, tuple[int, ...]]:
    """stage -> iterations this worker can provide: its own stage's host copies (when it
    holds trained state of the stage it fills now) and the snapshots it holds."""
    snaps, st = h.snaps, h.state
    out: dict[int, set] = {}
    if not st.fresh and snaps.local.stage == st.me[1]:
        out[st.me[1]] = set(snaps.local.iterations())
    for s, its in snaps.host.held().items():
        out.setdefault(s, set()).update(its)
    return {s: tuple(sorted(its)) for s, its in out.items() if its}


def _copy_of(h: StageHandle, stage: int, k: int) -> tuple[dict, str]:
    """The state of `stage` after step k from this worker's own copies (host copies, the
    seed at the run's start, a disk checkpoint) or a snapshot it holds; and whence."""
    snaps, st = h.snaps, h.state
    if snaps is not None and snaps.local.stage == stage and k in snaps.local.iterations():
        return snaps.local.state(k), "its own copy"
    if k == st.origin and stage == st.me[1]:
        return h.stage.initial_state(stage), "the seed (the run's start)"
    if k in st.disk and stage == st.me[1]:
        return (h.stage.initial_state(stage, st.disk[k]),
                f"the checkpoint on disk of iteration {k}")
    return held_state(snaps.host.get(stage, k)), "a snapshot it holds"


def restore_from_snapshots(h: StageHandle, plan, members=None, why: str = "",
                           top: int = -1) -> tuple[int, str]:
    """Roll every member back to the newest iteration k every stage has a copy of in
    some tier; (k, where this worker's state came from). `members`: what each holds, if
    gathered; `why`: why no replay (told to the coordinator, for the run's summary);
    `top`: the newest iteration a member had stepped (what is trained again). Decided by
    entry_plan.py's plan_restore and restore_steps, run by run_entry."""
    S = h.conf.stages
    members = members if members is not None else _holdings(h)
    rp = plan_restore(members, S)
    if rp is None:
        raise NoCopy("no iteration has a copy of every stage in any tier (live workers, "
                     "peer-memory snapshots, this run's disk checkpoints, the seed): "
                     "resume from a checkpoint")
    _, source = run_entry(h, restore_steps(rp, members, h.state.me), plan, rolled_back={
        "why": why, "tier": tier_of(members, rp.iteration), "top": top})
    return rp.iteration, source
