"""ReCycle with roles (docs/design.md section 5, "Roles and moves"): the simulator's
`recycle-roles` policy, and the base of `recycle`, which adds shapes (shaped.py).

Live workers are named by their home slot ("r.s": the slot a trace event names); each
fills the slot its role gives it (planner/control/roles.py). After every event the roles are
chosen again: a failure empties slots, a repair brings fresh workers (no state), and the
planner may move workers between stages when what that gains before the next event
(`Context.horizon_s`) is worth the stall of loading a stage's state. What each event costs:
  - a failure: detection and the iteration in flight (as fixed-role ReCycle), plus the
    stall of the moves it prompts;
  - a stage whose every holder died: a worker moves there and loads the stage from its
    peer-memory snapshot (kept in host memory on a node that holds no worker of that
    stage, refreshed every `snapshot_every` iterations) and replays the iterations since
    from its neighbours' boundary logs while the others wait (the stage's F+I+W over its
    new workers per micro-batch since the snapshot; executor/runtime/replay/). Two lost
    stages side by side (or `Params.replay` off) cannot replay: the job rolls back to the
    snapshot (the work since it is lost). Either way it stalls for the load. If the
    snapshot's node died in the same event, the stage is gone: restore from the checkpoint;
  - a repair: the fresh workers load from live peers while the others train (a rejoin
    costs no one), plus the stall of any move it prompts;
  - fewer live workers than stages: paused (the iteration in flight is lost) until a
    repair; every stage's state is still in memory (its live holders, or its snapshot), so
    training resumes from there, unless some stage lost every copy meanwhile: then from
    the checkpoint.
"""
from __future__ import annotations

from typing import Optional

from planner.control.roles import NoRolesError, choose_roles
from planner.simulation.engine import Decision
from planner.simulation.base import Policy

Worker = tuple[int, int]


def _wid(w: Worker) -> str:
    return f"{w[0]}.{w[1]}"


def _moves(stall_s: float) -> tuple:
    """A stall's part spent loading state (report.remainder itemises it)."""
    return (("state moves", stall_s),) if stall_s > 0 else ()


class ElasticRecycle(Policy):
    """Re-routing plus roles on the job's own partition: every live worker trains,
    stages rebalanced by moves (the module docstring has the costs)."""
    name = "recycle-roles"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.live: dict[str, Optional[Worker]] = {}  # worker id -> slot (None: not placed)
        self.holder: dict[int, str] = {}  # stage -> worker holding its snapshot
        self.moves = 0
        self.snapshot_restores = 0
        self.replays = 0  # of those, stages replayed alone from the boundary logs
        self.lost_copy: Optional[bool] = None  # while paused: whether a stage lost every copy
        self._nodes: dict[str, object] = {}  # worker id -> its node (_node)

    # ---- helpers -------------------------------------------------------------------
    def _node(self, wid: str):
        node = self._nodes.get(wid)
        if node is None:  # parsed once per worker: at 2,048 workers this was most of an event
            r, s = (int(x) for x in wid.split("."))
            node = self._nodes[wid] = self.ctx.node_of((r, s))
        return node

    def _slot_speed(self, speed: dict) -> dict:
        """Speeds follow workers, the planner reads them per slot."""
        return {slot: speed[(int(w.split(".")[0]), int(w.split(".")[1]))]
                for w, slot in self.live.items()
                if slot is not None and (int(w.split(".")[0]), int(w.split(".")[1])) in speed}

    def _period(self, speed):
        sp = self._slot_speed(speed)
        return lambda failed: round(self.ctx.periods(frozenset(failed), sp) / self.ctx.unit_s)

    def _stages(self) -> int:
        """Stages of the partition the workers train on now."""
        return self.ctx.job.stages

    def _choose(self, speed):
        """(slots {slot: worker}, moves, period s, stall in time units) for the live set;
        NoRolesError if too few workers."""
        ctx = self.ctx
        a = choose_roles(ctx.job, self.live, ctx.horizon_s / ctx.unit_s, self._period(speed),
                         snapshots=ctx.params.snapshot_every > 0)
        return a.slots, a.moves, ctx.periods(frozenset(a.failed), self._slot_speed_of(
            speed, a.slots)), a.stall

    def _assign(self, speed) -> Optional[tuple[float, float, list]]:
        """The live set's slots: (period s, stall s, moves), None if too few workers."""
        try:
            slots, moves, P, stall = self._choose(speed)
        except NoRolesError:
            return None
        self.live = {w: slot for slot, w in slots.items()}
        self.moves += sum(1 for m in moves if m.from_stage is not None)
        self._pick_holders()
        p = self.ctx.params
        if p.replay:  # the boundary logs a replay needs cost a share of the throughput
            P = P / (1.0 - p.swift_log_overhead)
        return P, stall * self.ctx.unit_s, moves

    def _slot_speed_of(self, speed: dict, slots: dict) -> dict:
        """The speeds of the workers in `slots` ({slot: worker}), per slot."""
        out = {}
        for slot, w in slots.items():
            home = tuple(int(x) for x in w.split("."))
            if home in speed:
                out[slot] = speed[home]
        return out

    def _pick_holders(self) -> None:
        """Stage s's snapshot goes to a live worker on a node with no worker of s (spread
        over the candidates, so that one node does not hold every snapshot)."""
        S = self._stages()
        nodes_of = {s: set() for s in range(S)}
        for w, slot in self.live.items():
            nodes_of[slot[1]].add(self._node(w))
        ids = sorted(self.live)
        self.holder = {}
        for s in range(S):
            cands = [w for w in ids if self._node(w) not in nodes_of[s]] or \
                    [w for w in ids if self.live[w][1] != s]
            if cands:
                self.holder[s] = cands[s % len(cands)]

    # ---- the policy ----------------------------------------------------------------
    def start(self, failed, speed):
        D, S = self.ctx.job.replicas, self.ctx.job.stages
        # at the start nobody holds state yet: every live worker is placed freely
        self.live = {_wid((d, s)): None for d in range(D) for s in range(S)
                     if (d, s) not in failed}
        got = self._assign(speed)
        if got is None:  # too few workers to start: started (restart_s) when enough are up
            self.halted, self.lost_copy = True, "start"
            return Decision(0.0)
        P = got[0]
        return Decision(self.ctx.DM / P, P)

    def steady(self, failed, speed):  # not used: rates come from the roles
        raise NotImplementedError

    def _stage_job(self):
        """The job whose stages the workers train now (a shape's, in shaped.py)."""
        return self.ctx.job

    def _cut(self):
        """The cut points of the shape in force (None: the job's own, never changed)."""
        return None

    def _replay_s_per_mb(self, emptied: list[int], job) -> Optional[float]:
        """Seconds the replay of the lost stages takes per micro-batch trained since their
        snapshot (executor/runtime/replay/): each stage's F+I+W over the workers that now
        hold it, the slowest stage's; None when the logs cannot replay them (logging off,
        or two lost stages side by side: each one's inputs died with the other). `job`:
        the stages' job before the event (after a shape change, one worker a stage)."""
        if not self.ctx.params.replay or any(s + 1 in emptied for s in emptied):
            return None
        cost, same = job.cost, job is self._stage_job()
        n = {s: sum(1 for slot in self.live.values() if slot is not None and slot[1] == s)
             if same else 1 for s in emptied}
        return max((cost.F[s] + cost.I[s] + cost.W[s]) * self.ctx.unit_s / max(1, n[s])
                   for s in emptied)

    def _copies_left(self, gone: set) -> list[int]:
        """Stages with no copy left: no live worker holds them and their snapshot's holder
        is gone too."""
        held = {slot[1] for w, slot in self.live.items() if slot is not None and w not in gone}
        return [s for s in range(self._stages())
                if s not in held and (self.holder.get(s) is None or self.holder[s] in gone
                                      or self.holder[s] not in self.live)]

    def on_event(self, kind, workers, before, after, speed, run):
        ctx, p = self.ctx, self.ctx.params
        ids = {_wid(w) for w in workers}
        if kind == "speed":
            if self.halted:
                return None
            got = self._assign(speed)
            return Decision(ctx.DM / got[0], got[0], stall_s=got[1], parts=_moves(got[1]))
        if kind == "recover":
            for w in ids:
                self.live.setdefault(w, None)
            got = self._assign(speed)
            if got is None:
                return None
            P, stall, _ = got
            if self.halted:
                self.halted = False
                restart = (("restart", p.restart_s),) + _moves(stall)
                if self.lost_copy == "start":
                    return Decision(ctx.DM / P, P, stall_s=p.restart_s + stall, note="started",
                                    parts=restart)
                if self.lost_copy:
                    return Decision(ctx.DM / P, P, lose="checkpoint", stall_s=p.restart_s + stall,
                                    note="restored from checkpoint", parts=restart)
                # paused with every stage's state still in memory: resume from it
                return Decision(ctx.DM / P, P, stall_s=stall, note="resumed from memory",
                                parts=_moves(stall))
            return Decision(ctx.DM / P, P, stall_s=stall, parts=_moves(stall))
        # a failure
        gone = ids & set(self.live)
        if not gone:
            return None
        if self.halted:  # paused: note whether some stage's every copy is now gone
            if self.lost_copy != "start":
                self.lost_copy = self.lost_copy or bool(self._copies_left(gone))
            for w in gone:
                self.live.pop(w)
            return None
        dead_copy = self._copies_left(gone)
        emptied = sorted({self.live[w][1] for w in gone} - {
            slot[1] for w, slot in self.live.items() if w not in gone})
        for w in gone:
            self.live.pop(w)
        before, cut = self._stage_job(), self._cut()  # the stages the emptied ones are in
        got = self._assign(speed)
        if got is None:
            # fewer live workers than stages: pause; the state stays in memory unless some
            # stage lost every copy (then only the checkpoint is left)
            self.halted = True
            self.lost_copy = bool(dead_copy)  # the resume then restores from the checkpoint
            return Decision(0.0, 0.0, lose="inflight", note="paused: fewer live workers than stages")
        P, stall, _ = got
        detect = (("detection", p.detect_s),)
        if dead_copy:
            return Decision(ctx.DM / P, P, lose="checkpoint",
                            stall_s=p.detect_s + p.restart_s + stall,
                            note=f"stage(s) {dead_copy} and snapshot lost: restored from checkpoint",
                            parts=detect + (("restart", p.restart_s),) + _moves(stall))
        if emptied:
            self.snapshot_restores += 1
            # the runtime replays a lost stage only where the shape stays: a change of shape
            # cuts the new stages from copies of one iteration, so it rolls the whole job
            # back to the snapshot (executor/runtime/stage_state/entry_plan.py
            # restore_source)
            per_mb = (self._replay_s_per_mb(emptied, before) if self._cut() == cut
                      else None)
            if per_mb is not None:  # replayed alone: the others keep their work
                self.replays += 1
                return Decision(ctx.DM / P, P, lose="replay", stall_s=p.detect_s + stall,
                                replay_s_per_mb=per_mb,
                                note=f"stage(s) {emptied} replayed from snapshot and logs",
                                parts=detect + _moves(stall))
            return Decision(ctx.DM / P, P, lose="snapshot", stall_s=p.detect_s + stall,
                            note=f"stage(s) {emptied} restored from peer-memory snapshot",
                            parts=detect + _moves(stall))
        return Decision(ctx.DM / P, P, lose="inflight", stall_s=p.detect_s + stall,
                        parts=detect + _moves(stall))
