"""Plans lowered to each worker's steps, communication included.

A plan's actions say what a worker computes (F, I, W, B, OPT) and `routes` say where each
micro-batch goes; `lower(plan, worker)` turns both into the one list of steps the worker
runs, with every receive, send and all-reduce explicit, as torch.distributed.pipelining
lowers its schedules to `_Action`s with SEND_F/RECV_F/... . A pure pass: the distributed
agent and the single-process executor interpret the same list (executor/runtime/
interpreter.py), and the CSV export reads its compute steps.

Order per action of stage s (S stages), for micro-batch g:
  F:   RECV fwd from (routes[g][s-1], s-1) if s > 0;  F;  SEND fwd to (routes[g][s+1], s+1) if s < S-1
  I/B: RECV bwd from (routes[g][s+1], s+1) if s < S-1; I/B; SEND bwd to (routes[g][s-1], s-1) if s > 0
  W:   W
  OPT: ALLREDUCE over the stage's live workers; OPT
`boundary` names the stage boundary a message crosses: b carries stage b's activations to
stage b+1 (fwd) and the gradient of stage b's output from b+1 back to b (bwd).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from planner.plan import Plan

Worker = tuple[int, int]


class Op(str, Enum):
    F = "F"
    I = "I"  # noqa: E741 - the input-gradient half of the backward, as in the papers
    W = "W"
    B = "B"
    OPT = "OPT"
    SEND = "SEND"
    RECV = "RECV"
    ALLREDUCE = "ALLREDUCE"


COMPUTE = frozenset((Op.F, Op.I, Op.W, Op.B, Op.OPT))
WORK = frozenset((Op.F, Op.I, Op.W, Op.B))  # the compute on one micro-batch
FWD, BWD = "fwd", "bwd"


@dataclass(frozen=True)
class Step:
    op: Op
    microbatch: Optional[int] = None
    peer: Optional[Worker] = None  # SEND: to, RECV: from
    direction: Optional[str] = None  # FWD or BWD (SEND/RECV)
    boundary: Optional[int] = None  # the stage boundary the message crosses (SEND/RECV)
    peers: tuple[Worker, ...] = ()  # ALLREDUCE: the stage's live workers, sorted
    index: int = -1  # the plan action this step belongs to (its position in the list)

    def label(self, stage: int) -> str:
        """torch.distributed.pipelining's action string: `1F3`, `0SEND_F2`, `2RECV_B0`."""
        if self.op in (Op.SEND, Op.RECV):
            return f"{stage}{self.op.value}_{'F' if self.direction == FWD else 'B'}{self.microbatch}"
        if self.op in (Op.OPT, Op.ALLREDUCE):
            return f"{stage}{self.op.value}"
        return f"{stage}{self.op.value}{self.microbatch}"


def lower(plan: Plan, worker: Worker) -> list[Step]:
    """The steps `worker` runs in one iteration of `plan`, in order."""
    wp = plan.worker(*worker)
    if wp is None:
        raise ValueError(f"worker {worker[0]}:{worker[1]} is not in plan v{plan.version}")
    S, s = plan.job.stages, worker[1]
    peers = tuple(sorted(w.key for w in plan.workers if w.stage == s))
    out: list[Step] = []
    for k, a in enumerate(wp.actions):
        op, g = Op(a.op), a.microbatch
        if op is Op.F:
            if s > 0:
                out.append(Step(Op.RECV, g, (plan.routes[g][s - 1], s - 1), FWD, s - 1, index=k))
            out.append(Step(op, g, index=k))
            if s < S - 1:
                out.append(Step(Op.SEND, g, (plan.routes[g][s + 1], s + 1), FWD, s, index=k))
        elif op in (Op.I, Op.B):
            if s < S - 1:
                out.append(Step(Op.RECV, g, (plan.routes[g][s + 1], s + 1), BWD, s, index=k))
            out.append(Step(op, g, index=k))
            if s > 0:
                out.append(Step(Op.SEND, g, (plan.routes[g][s - 1], s - 1), BWD, s - 1, index=k))
        elif op is Op.OPT:
            out.append(Step(Op.ALLREDUCE, peers=peers, index=k))
            out.append(Step(op, index=k))
        else:
            out.append(Step(op, g, index=k))
    return out


def lower_replay(stage: int, stages: int, microbatches: list[int],
                 replayers: tuple[Worker, ...]) -> list[Step]:
    """The steps one replayer of a stage lost whole runs per replayed iteration (the
    executor's runtime/replay/): its micro-batches' F and fused B in turn, as in a plan
    without the split (the same gradients, one traversal), the all-reduce over the
    stage's replayers, the step. Messages name no peer: a replay's RECV reads the
    boundary logs and its SEND logs what the stage sent, for a later loss."""
    s, S, out = stage, stages, []
    for k, g in enumerate(microbatches):
        if s > 0:
            out.append(Step(Op.RECV, g, None, FWD, s - 1, index=2 * k))
        out.append(Step(Op.F, g, index=2 * k))
        if s < S - 1:
            out += [Step(Op.SEND, g, None, FWD, s, index=2 * k),
                    Step(Op.RECV, g, None, BWD, s, index=2 * k + 1)]
        out.append(Step(Op.B, g, index=2 * k + 1))
        if s > 0:
            out.append(Step(Op.SEND, g, None, BWD, s - 1, index=2 * k + 1))
    n = 2 * len(microbatches)
    return out + [Step(Op.ALLREDUCE, peers=tuple(sorted(replayers)), index=n),
                  Step(Op.OPT, index=n)]
