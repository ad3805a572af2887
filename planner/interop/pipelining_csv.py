"""Export: one replica's pipeline as torch.distributed.pipelining CSV.

The format says, per rank, the order of F/I/W (or F/B) actions of one pipeline of S stages
and M micro-batches. It cannot say re-routed work, so only a replica whose workers are all
alive and run exactly its own micro-batches can be written; anything else is refused with
one line (`ExportError`), never written half.

Torch's runtime needs two more things than our validator:
- the last stage runs F in micro-batch order 0..M-1 (losses are indexed by position);
- one micro-batch order along the pipeline: with `defer_pp_recv=True` its p2p receives are
  untagged and matched first in, first out, so stage s must receive micro-batches in the
  order stage s-1 (forward) or s+1 (backward) sent them.
So the export relabels: the k-th F of every stage runs micro-batch k (the last stage's F
order defines the labels), the k-th I (or B) of every stage runs the k-th micro-batch of
the last stage's backward order, and each stage's W follow its I order. This keeps every
time of the plan valid: the k-th F of stage s starts after k F's of stage s-1 have ended
(each of its first k F's needed a distinct one), so after the k-th; likewise for I along
the backward chain and W after I, and memory only counts F's started and W's ended. The
exported order is therefore exactly as fast as the plan.
"""
from __future__ import annotations

import os
from typing import Optional

from planner.lowering import WORK, lower
from planner.plan import Plan
from planner.errors import UserError


class ExportError(UserError):
    """The plan cannot be said in the CSV format (one line: why)."""


def _workers(plan: Plan) -> dict:
    return {w.key: w for w in plan.workers}  # plan.worker() scans: O(S^2) over a pipeline


def _why_not(plan: Plan, replica: int, workers: dict) -> Optional[str]:
    job = plan.job
    M = job.microbatches
    for s in range(job.stages):
        w = workers.get((replica, s))
        if w is None:
            return f"worker {replica}:{s} has failed"
        foreign = sorted({a.microbatch for a in w.actions
                          if a.microbatch is not None and job.owner(a.microbatch) != replica})
        if foreign:
            return (f"worker {replica}:{s} runs re-routed micro-batch {foreign[0]} of replica "
                    f"{job.owner(foreign[0])}")
    for g in range(replica * M, (replica + 1) * M):
        for s, d in enumerate(plan.routes[g]):
            if d != replica:
                return f"its micro-batch {g} runs stage {s} on replica {d}"
    return None


def exportable_replica(plan: Plan, replica: Optional[int] = None) -> int:
    """`replica` if it can be exported, else raise; None: the first replica that can."""
    D = plan.job.replicas
    workers = _workers(plan)
    if replica is not None:
        if not 0 <= replica < D:
            raise ExportError(f"--csv-replica {replica} is outside 0..{D - 1}")
        why = _why_not(plan, replica, workers)
        if why:
            raise ExportError(f"replica {replica} cannot be exported as a pipelining CSV: {why} "
                              f"(the format holds one pipeline running only its own micro-batches)")
        return replica
    reasons = []
    for d in range(D):
        why = _why_not(plan, d, workers)
        if why is None:
            return d
        reasons.append(f"replica {d}: {why}")
    more = f"; and {D - 2} more" if D > 2 else ""
    raise ExportError("no replica can be exported as a pipelining CSV, which holds one pipeline "
                      "running only its own micro-batches (" + "; ".join(reasons[:2]) + more + ")")


def pipeline_rows(plan: Plan, replica: int) -> list[list[str]]:
    """The relabeled action strings of `replica`'s pipeline, one list per stage (= rank).
    The replica must be exportable (`exportable_replica`)."""
    job = plan.job
    S, M = job.stages, job.microbatches
    back = "I" if plan.solver.split_backward else "B"
    # the same lowering the executors run (planner/lowering.py); its compute steps but OPT
    # (the step is outside torch's schedule; its RECV/SEND it derives itself)
    seqs = [[(st.op.value, st.microbatch - replica * M) for st in lower(plan, (replica, s))
             if st.op in WORK] for s in range(S)]
    last = seqs[S - 1]
    label = {m: k for k, m in enumerate(m for op, m in last if op == "F")}
    back_order = [label[m] for op, m in last if op == back]
    rows = []
    for s, seq in enumerate(seqs):
        nf = nb = nw = 0
        cells = []
        for op, _ in seq:
            if op == "F":
                k, nf = nf, nf + 1
            elif op == back:
                k, nb = back_order[nb], nb + 1
            else:  # W: in this stage's (new) I order
                k, nw = back_order[nw], nw + 1
            cells.append(f"{s}{op}{k}")
        rows.append(cells)
    return rows


def export_csv(plan: Plan, replica: Optional[int] = None) -> str:
    """The CSV text (one row per rank, no trailing OPT) of an exportable replica."""
    d = exportable_replica(plan, replica)
    return "".join(",".join(row) + "\n" for row in pipeline_rows(plan, d))


def check_target(path: str, flag: str = "--csv") -> None:
    """Refuse, before any planning, an output path that cannot be written."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path} is not writable")
