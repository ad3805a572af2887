"""Carrying out a replay (replay_plan.py) when a version is entered: every member of the new
world takes part (docs/executor.md, "Replay of a lost stage").

1. decide: one all-gather of what each member's log holds for the lost stages' windows;
   every member computes the same ReplayPlan, or the same reason to roll back instead;
2. move: each logged boundary message goes from the member that logged it to the member
   that replays its micro-batch, one blob per (sender, receiver) pair, in one order;
3. replay (the lost stage's members): load the snapshot of iteration k, then per
   iteration k+1..r-1 F and B of its micro-batches on the logged inputs, the all-reduce
   over the stage's members, the step with the run's own clip norms;
4. the others wait for it on the store (a key per replayed iteration: a long replay is
   not a dead peer), then train on at r.
"""
from __future__ import annotations

import time
from typing import Optional

from executor.optim.clip import coefficient, global_norm, scale_
from executor.protocol import Replayed, replay_key, replay_progress_key
from executor.runtime.peer_snapshots import fetch
from executor.runtime.peer_snapshots.wire import held_state
from executor.runtime.replay.boundary_log import BWD, FWD, TIED_GRAD, TIED_VALUE
from executor.runtime.replay.replay_plan import (ReplayPlan, decode, encode, inputs_of,
                                                 plan_replay, windows_of)
from executor.runtime.steps.grad_sum import allreduce_grads
from executor.runtime.steps.tied import shared, tied_inputs
from executor.runtime.transport.waiting import DEADLINE, WaitEnded, wait_until


def decide(agent, lost: list[int], r: int, held: dict) -> tuple[Optional[ReplayPlan], str]:
    """The replay every member agrees on, or (None, why not: the job rolls back whole).
    `held`: stage -> iterations of its snapshots among the live workers (restore_plan
    reports)."""
    world, conf, log = agent.world, agent.conf, agent.boundaries
    S, M = conf.stages, conf.job.num_microbatches
    clip = conf.training.clip > 0
    wins = windows_of(lost, held, agent.state.origin, r)
    ties = agent.stage.stepper.tied.ties  # every stage carries the run's whole table
    inputs = {u: inputs_of(u, S, M, tied_inputs(ties, u)) for u in wins}
    rows = world.allgather_ints(encode(log, wins, inputs, S, M, clip) or [0])
    reports = {w: decode(row, wins, inputs, S, M, clip) for w, row in rows.items()}
    rp, why = plan_replay(lost, wins, inputs, reports, {w: w[1] for w in world.workers}, M,
                          clip)
    if rp is None and not log.on:
        why = "boundary logs are off (--log-memory off)"
    if rp is None:
        agent.log(f"cannot replay stage(s) {lost} from the boundary logs ({why}): "
                  f"the job rolls back to a snapshot")
    return rp, why


def carry_out(agent, plan, rp: ReplayPlan, held_by: dict) -> str:
    """Steps 2-4 for this member; where its state came from ("" for a survivor).
    `held_by`: (stage, iteration) -> the lowest member holding that snapshot."""
    world, st, conf = agent.world, agent.state, agent.conf
    me, M = st.me, conf.job.num_microbatches
    inbox: dict = {}
    for src, dst, keys in rp.transfers(M):
        if src == me:
            world.send_blob({k: agent.boundaries.get(*k) for k in keys}, dst)
        elif dst == me:
            inbox.update(world.recv_blob(src))
    u = me[1]
    source = ""
    if u in rp.windows:
        source = _replay_stage(agent, plan, rp, u, inbox, held_by)
    else:
        _await_replays(agent, plan, rp)
    return source


def _inputs(agent, inbox: dict, key):
    """A logged message: moved here for the replay, or kept here all along."""
    return inbox[key] if key in inbox else agent.boundaries.get(*key)


def _replay_stage(agent, plan, rp: ReplayPlan, u: int, inbox: dict, held_by: dict) -> str:
    world, st, conf, stage, log = agent.world, agent.state, agent.conf, agent.stage, agent.boundaries
    S, M = conf.stages, conf.job.num_microbatches
    win, me = rp.windows[u], st.me
    state, source = _snapshot(agent, plan, u, win.k, held_by)
    stage.load_state(state)
    stage.stepper.reset(win.k + 1)
    mine = rp.mine(u, me, M)
    comp, last = stage.compute, u == S - 1
    comp.split = False  # fused B: the same gradients, one traversal
    t0 = time.perf_counter()
    writer = me == rp.replayers[u][0]
    losses: dict = {}
    for it in win.iterations:
        comp.begin(it)
        for g in mine:
            x, targets = (conf.workload.microbatch(conf.model, it, g)
                          if u in (0, S - 1) else (None, None))
            if u > 0:
                x = _inputs(agent, inbox, (u, FWD, it, g))
            out = comp.forward(g, x, targets if last else None)
            gx = comp.backward_full(g, None if last else _inputs(agent, inbox, (u, BWD, it, g)))
            if not last:  # what it sends, logged again: a later loss may need it
                log.keep(u + 1, FWD, it, g, out)
            if u > 0:
                log.keep(u - 1, BWD, it, g, gx)
            agent.store.add(replay_progress_key(plan.version, u), 1)  # alive, and busy
        got = allreduce_grads(stage.params, world, comp.losses() if last else None, M,
                              conf.device)
        if last:
            losses[it] = got
        tied = {(d, g): _inputs(agent, inbox, (u, d, it, g)) for d, gs in rp.inputs[u]
                if d in (TIED_GRAD, TIED_VALUE) for g in gs}
        _step(stage.stepper, u, it, rp.norms.get(it), conf.training.clip, tied)
        comp.reset()
        if writer:
            agent.store.set(replay_key(plan.version, u, it), "1")
    seconds = time.perf_counter() - t0
    st.fresh = False
    agent.log(f"replayed stage {u} iterations {win.k + 1}..{win.last} from the boundary logs "
              f"({len(mine)} of {M} micro-batches per iteration here, "
              f"{len(rp.replayers[u])} workers) in {seconds:.3f} s; state of iteration "
              f"{win.k} from {source}")
    if writer:
        agent.source.send(Replayed(stage=u, first=win.k + 1, last=win.last,
                                   seconds=round(seconds, 4), workers=len(rp.replayers[u]),
                                   losses={str(i): v for i, v in losses.items()}))
    return f"{source}, replayed {len(win.iterations)} iterations"


def _step(stepper, u: int, it: int, sums, clip: float, tied: dict) -> None:
    """The optimizer step of a replayed iteration of stage u, as StageStepper.step took it:
    the tied weights' shares added in (an owner) or left out (a mirror), the learning rate
    of `it`, the clip the run applied (every stage's norm as logged), the step; then a
    mirror copies the owner's stepped value in. What it would have published is logged
    again (the exchange's `on_publish`). `tied`: (TIED_GRAD, mirror stage) / (TIED_VALUE, owner stage) -> tensors."""
    ex = stepper.tied
    shares = ex.take_shares()  # a mirror's: sent to the owner, not stepped here
    if shares:
        ex.tell("grad", it, shares)
    blobs = lambda d: {s: dict(zip(shared(ex.ties, u, s), ts))  # noqa: E731
                       for (dd, s), ts in tied.items() if dd == d}
    ex.add_shares(blobs(TIED_GRAD))  # an owner's: g_owner + every mirror's share
    stepper.lr.at(it)
    if clip > 0:
        c = coefficient(global_norm(sums), clip)
        if c < 1.0:
            scale_([p.grad for p in stepper.params], c)
    stepper.opt.step()
    ex.copy_values(blobs(TIED_VALUE))
    if ex.owned:
        ex.tell("value", it, ex.values())


def _snapshot(agent, plan, u: int, k: int, held_by: dict) -> tuple[dict, str]:
    """Stage u's state after step k: from the run's start, or the snapshot a member holds."""
    holder = held_by.get((u, k))
    if holder is None:  # only the start has no holder: every member rebuilds it
        return agent.stage.initial_state(u), "the seed (the run's start)"
    if holder == agent.state.me:
        return held_state(agent.snaps.host.get(u, k)), "its own held snapshot"
    wid = plan.worker_id(*holder)
    _, state = fetch(agent.store, wid, u, k, timeout_s=agent.snaps.timeout_s)
    return state, f"the snapshot held by worker {wid}"


def _await_replays(agent, plan, rp: ReplayPlan) -> None:
    """A survivor waits for every lost stage's replay, an iteration at a time, as long as
    it makes progress: a replay of many iterations of a wide stage may take minutes, but
    not one of its micro-batches more than another stage's step may take (the replayers
    count them in the store). A newer plan (a replayer died) ends the wait."""
    limit = agent.conf.timeouts.other_stages
    for u, win in sorted(rp.windows.items()):
        progress = replay_progress_key(plan.version, u)
        for it in win.iterations:
            key, seen = replay_key(plan.version, u, it), -1
            while True:
                try:
                    wait_until(lambda: agent.store.check([key]), f"the replay of stage {u}, "
                               f"iteration {it}", limit_s=limit,
                               newer=lambda: agent.fence.next_plan(0))
                    break
                except WaitEnded as exc:
                    done = int(agent.store.add(progress, 0))
                    if exc.reason != DEADLINE or done == seen:
                        raise  # superseded, or not one micro-batch more in `limit`
                    seen = done
