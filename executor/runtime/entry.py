"""Entering a plan version (docs/executor.md, "One iteration"): take the slot the plan's
roles give this worker, in the plan's shape; open the version's world; agree with its
members on the iteration to train next and hold the stage's state after the one before
(stage_state/sync.py); tell the coordinator.
"""
from __future__ import annotations

import time

from executor.compute.one_process.reference import checksum
from executor.protocol import Done
from executor.runtime.stage_handle import StageHandle
from executor.runtime.stage_state.shape import bounds_key, shaped_config
from executor.runtime.stage_state.sync import sync_state
from executor.runtime.transport.comm import World
from planner.plan import Plan


def enter(h: StageHandle, plan: Plan) -> None:
    st = h.state
    h.fence.seen(plan)
    st.entered = True
    if h.world is not None:
        h.world.close()
        h.world = None
    _take_slot(h, plan)
    live = [w.key for w in plan.workers]
    h.world = World(h.store, plan.version, st.me, live, h.conf.timeouts.comm, h.conf.device,
                    h.conf.local_workers, newer=h.newer_plan,
                    missing=lambda workers: _missing(h, workers),
                    incarnations={w: plan.incarnation(*plan.filler(*w)) for w in live},
                    state_timeout_s=h.conf.timeouts.state_io)
    h.world.on_idle = h.stage.stepper.idle
    synced = sync_state(h, plan)
    st.done = synced.iteration - 1
    st.writer = st.me == min(w for w in h.world.workers if w[1] == st.me[1])
    parts = h.stage.parts
    if st.writer and parts.due(st.done):  # the part a dead writer may not have finished
        parts.write(st.done, h.stage.module, h.stage.opt, only_if_missing=True)
    h.stage.compute.split = plan.solver.split_backward  # fused B: F prepares no I
    backward = "I/W split" if plan.solver.split_backward else "fused B"
    h.log(f"entered plan v{plan.version} ({len(live)} workers, failed {plan.failed}, "
          f"{backward}, {plan.solver.optimizer} optimizer) at iteration {synced.iteration}")
    h.source.send(Done(it=st.done, checksum=checksum(h.stage.module), sync=True,
                       at=time.time(), slot=list(st.me)))
    st.in_version = plan.version  # entered with the stage's state in place


def _take_slot(h: StageHandle, plan: Plan) -> None:
    """The slot the plan's roles give us, in the plan's shape: a worker with state of
    another shape keeps it until sync_state moves it by name (stage_state/reshape.py);
    one with none builds its new stage at once."""
    st, slot = h.state, plan.slot_of(h.state.name)
    target = shaped_config(h.base, plan)
    if bounds_key(target) == bounds_key(h.conf):
        h.conf = target  # the same shape (a cut run back on the job's own: its conf)
        return _move(h, slot, plan)
    if st.fresh:
        h.log(f"building stage {slot[1]} of {target.stages} (plan v{plan.version}'s shape)")
        h.take_stage(slot[1], target)
    st.me = slot


def _move(h: StageHandle, slot: tuple[int, int], plan: Plan) -> None:
    """Take the slot the plan's roles give us; a new stage is built empty (fresh)."""
    # the stage this process runs, not its last slot's: a plan of another shape gives
    # a worker with state its new slot before the state moves by name (reshape.py);
    # superseded before it entered, the worker still runs its old stage
    if slot[1] != h.stage.stage:
        h.log(f"moving from stage {h.stage.stage} to stage {slot[1]} (plan v{plan.version})")
        if h.stage.stepper.unsettled() is None:  # else it waits for a dead stage:
            h.stage.stepper.settle()  # the state left behind is not used anyway
        h.take_stage(slot[1])  # its state comes from a live holder, as on a rejoin
    h.state.me = slot


def _missing(h: StageHandle, workers: list) -> None:
    """Members that never came to this version's world within a timeout."""
    h.log(f"plan v{h.state.version}: still waiting for {workers} to join")
    for w in workers:
        h.source.report_suspect(*w, reason=f"{h.state.me}: {w} did not join world "
                                           f"v{h.state.version}")
