"""Carrying out a replay (replay_plan.py) when a version is entered: every member of the new
world takes part (docs/executor.md, "Replay of a lost stage").

1. decide: one all-gather of what each member's log holds for the lost stages' windows;
   every member computes the same ReplayPlan, or the same reason to roll back instead;
2. move: each logged boundary message goes from the member that logged it to the member
   that replays its micro-batch, one blob per (sender, receiver) pair, in one order;
3. replay (the lost stage's members): load the snapshot of iteration k, then per
   iteration k+1..r-1 the steps planner/lowering.py's lower_replay gives (F and B of its
   micro-batches on the logged inputs, the all-reduce over the stage's members, the
   step), run by the iteration's own interpreter, StageSteps and StageStepper: a
   change to how a stage computes or steps is a change to its replay too;
4. the others wait for it on the store (a key per replayed iteration: a long replay is
   not a dead peer), then train on at r.
"""
from __future__ import annotations


import time
from typing import Optional

from executor.protocol import Replayed, replay_key, replay_progress_key
from executor.runtime.peer_snapshots import fetch
from executor.runtime.peer_snapshots.wire import held_state
from executor.runtime.replay.boundary_log import BWD, FWD, TIED_GRAD, TIED_VALUE
from executor.runtime.replay.replay_plan import (ReplayPlan, decode, encode, inputs_of,
                                                 plan_replay, windows_of)
from executor.runtime.steps.grad_sum import allreduce_grads
from executor.runtime.steps.interpreter import StageSteps, run_steps
from executor.runtime.steps.stepper import Logged
from executor.runtime.steps.tied import shared, tied_inputs
from executor.runtime.transport.waiting import wait_until
from planner.lowering import FWD as STEP_FWD, Op, lower_replay

from executor.runtime.stage_handle import StageHandle


def decide(h: StageHandle, lost: list[int], r: int,
           held: dict) -> tuple[Optional[ReplayPlan], str]:
    """The replay every member agrees on, or (None, why not: the job rolls back whole).
    `held`: stage -> iterations of its snapshots among the live workers (entry_plan.py
    reports)."""
    world, conf, log = h.world, h.conf, h.boundary_log
    S, M = conf.stages, conf.job.num_microbatches
    clip = conf.training.clip > 0
    wins = windows_of(lost, held, h.state.origin, r)
    ties = h.stage.stepper.tied.ties  # every stage carries the run's whole table
    inputs = {u: inputs_of(u, S, M, tied_inputs(ties, u)) for u in wins}
    rows = world.allgather_ints(encode(log, wins, inputs, S, M, clip) or [0])
    reports = {w: decode(row, wins, inputs, S, M, clip) for w, row in rows.items()}
    rp, why = plan_replay(lost, wins, inputs, reports, {w: w[1] for w in world.workers}, M,
                          clip)
    if rp is None and not log.on:
        why = "boundary logs are off (--log-memory off)"
    if rp is None:
        h.log(f"cannot replay stage(s) {lost} from the boundary logs ({why}): "
                  f"the job rolls back to a snapshot")
    return rp, why


def carry_out(h: StageHandle, plan, rp: ReplayPlan, held_by: dict) -> str:
    """Steps 2-4 for this member; where its state came from ("" for a survivor).
    `held_by`: (stage, iteration) -> the lowest member holding that snapshot."""
    world, st, conf = h.world, h.state, h.conf
    me, M = st.me, conf.job.num_microbatches
    inbox: dict = {}
    for src, dst, keys in rp.transfers(M):
        if src == me:
            world.send_blob({k: h.boundary_log.get(*k) for k in keys}, dst)
        elif dst == me:
            inbox.update(world.recv_blob(src))
    u = me[1]
    source = ""
    if u in rp.windows:
        source = _replay_stage(h, plan, rp, u, inbox, held_by)
    else:
        _await_replays(h, plan, rp)
    return source


class LogTransport:
    """A replay's messages: a RECV reads the logged message (moved here, or logged here),
    a SEND logs what the stage sends again, for a later loss to replay from."""

    def __init__(self, log, inbox: dict, it: int):
        self.log, self.inbox, self.it = log, inbox, it

    def recv(self, st):
        key = self._key(st)
        return self.inbox[key] if key in self.inbox else self.log.get(*key)

    def send(self, st, value) -> None:
        self.log.keep(*self._key(st), value)

    def _key(self, st) -> tuple:
        """The log's key: the stage the message goes into, its direction, iteration and
        micro-batch (a boundary b's activation goes into b+1, its gradient into b)."""
        fwd = st.direction == STEP_FWD
        return st.boundary + fwd, FWD if fwd else BWD, self.it, st.microbatch


def _replay_stage(h: StageHandle, plan, rp: ReplayPlan, u: int, inbox: dict,
                  held_by: dict) -> str:
    """Iterations k+1..r-1 of stage u through the iteration's own parts: its lowered steps
    (planner/lowering.py lower_replay) by the interpreter's StageSteps over the logs,
    the stage's all-reduce, and StageStepper.step with the logged norms and tied inputs."""
    world, st, conf, stage = h.world, h.state, h.conf, h.stage
    S, M = conf.stages, conf.job.num_microbatches
    win, me, mine = rp.windows[u], st.me, rp.mine(u, st.me, M)
    state, source = _snapshot(h, plan, u, win.k, held_by)
    stage.load_state(state)
    stage.stepper.reset(win.k + 1)
    comp, last = stage.compute, u == S - 1
    comp.split = False  # fused B: F prepares no I
    steps = lower_replay(u, S, mine, rp.replayers[u])
    t0 = time.perf_counter()
    writer = me == rp.replayers[u][0]
    losses: dict = {}

    def progress() -> None:  # alive, and busy: the survivors' wait counts these
        h.store.add(replay_progress_key(plan.version, u), 1)

    for it in win.iterations:
        comp.begin(it)
        compute = StageSteps(comp, u, S, lambda g, it=it: conf.workload.microbatch(
            conf.model, it, g), LogTransport(h.boundary_log, inbox, it))
        table = {**compute.table(),
                 Op.B: lambda s: (compute.backward(s), progress()),
                 Op.ALLREDUCE: lambda s, it=it: losses.__setitem__(it, allreduce_grads(
                     stage.params, world, comp.losses() if last else None, M, conf.device)),
                 Op.OPT: lambda s, it=it: stage.stepper.step(
                     it, plan.version, _logged(h, inbox, rp, u, it))}
        run_steps(steps, table)
        comp.reset()
        if writer:
            h.store.set(replay_key(plan.version, u, it), "1")
    seconds = time.perf_counter() - t0
    st.fresh = False
    h.log(f"replayed stage {u} iterations {win.k + 1}..{win.last} from the boundary logs "
              f"({len(mine)} of {M} micro-batches per iteration here, "
              f"{len(rp.replayers[u])} workers) in {seconds:.3f} s; state of iteration "
              f"{win.k} from {source}")
    if writer:
        h.source.send(Replayed(stage=u, first=win.k + 1, last=win.last,
                                   seconds=round(seconds, 4), workers=len(rp.replayers[u]),
                                   losses={str(i): v for i, v in losses.items()
                                           if last}))
    return f"{source}, replayed {len(win.iterations)} iterations"


def _logged(h: StageHandle, inbox: dict, rp: ReplayPlan, u: int, it: int) -> Logged:
    """Step `it` of stage u's inputs as the run had them: the clip norms, the mirrors'
    gradient shares (an owner) and the owner's stepped values (a mirror), by stage."""
    ties = h.stage.stepper.tied.ties
    blobs: dict = {TIED_GRAD: {}, TIED_VALUE: {}}
    for d, stages in rp.inputs[u]:
        for s in stages if d in blobs else ():
            key = (u, d, it, s)
            ts = inbox[key] if key in inbox else h.boundary_log.get(*key)
            blobs[d][s] = dict(zip(shared(ties, u, s), ts))
    return Logged(rp.norms.get(it), blobs[TIED_GRAD], blobs[TIED_VALUE])


def _snapshot(h: StageHandle, plan, u: int, k: int, held_by: dict) -> tuple[dict, str]:
    """Stage u's state after step k: from the run's start, or the snapshot a member holds."""
    holder = held_by.get((u, k))
    if holder is None:  # only the start has no holder: every member rebuilds it
        return h.stage.initial_state(u), "the seed (the run's start)"
    if holder == h.state.me:
        return held_state(h.snaps.host.get(u, k)), "its own held snapshot"
    wid = plan.worker_id(*holder)
    _, state = fetch(h.store, wid, u, k, timeout_s=h.snaps.timeout_s)
    return state, f"the snapshot held by worker {wid}"


def _await_replays(h: StageHandle, plan, rp: ReplayPlan) -> None:
    """A survivor waits for every lost stage's replay, an iteration at a time, as long as
    it makes progress: a replay of many iterations of a wide stage may take minutes, but
    not one of its micro-batches more than another stage's step may take (the replayers
    count them in the store). A newer plan (a replayer died) ends the wait."""
    limit = h.conf.timeouts.other_stages
    for u, win in sorted(rp.windows.items()):
        progress = replay_progress_key(plan.version, u)
        for it in win.iterations:
            key = replay_key(plan.version, u, it)
            wait_until(lambda: h.store.check([key]), f"the replay of stage {u}, iteration {it}",
                       limit_s=limit, newer=h.newer_plan,
                       progress=lambda: int(h.store.add(progress, 0)))
