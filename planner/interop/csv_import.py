"""Import: a torch.distributed.pipelining CSV and a job spec -> a timed, validated Plan.

Accepts torch's compute-only and compute+comms CSVs (`_dump_csv` of either format): one
row per rank, cells `{stage}{op}{microbatch}`; empty cells, CRLF line ends and the
communication and sharding actions (SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD,
REDUCE_GRAD) are ignored, since our model times messages by the spec's p2p delays. Each
rank's order is timed as soon as possible with the spec's costs (an action starts when its
worker is free and its dependencies of docs/design.md section 4 have arrived), every replica of
the spec runs the same pipeline, OPT is added as for every back-end, and the result is a
Plan like any other. What a one-stage-per-worker plan cannot express is refused with one
line (`CsvImportError`): a rank with two stages (interleaved, ZBV, DualPipeV), OVERLAP_F_B,
B mixed with I/W.
"""
from __future__ import annotations

import csv
import io
import re
import time
from collections import deque

from planner.job import JobSpec
from planner.plan import Plan
from planner.solvers.timeline import Mode, add_opt, finish_plan
from planner.errors import UserError

_CELL = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
COMPUTE = ("F", "I", "W", "B")


class CsvImportError(UserError):
    """The CSV cannot be read as a plan of this spec (one line: why)."""


def looks_like_csv(text: str) -> bool:
    """A pipelining CSV rather than a plan's JSON: its first cell is an action."""
    head = text.lstrip("\ufeff \t\r\n")
    if not head or head[0] == "{":
        return False
    first = re.split(r"[,\r\n]", head, maxsplit=1)[0].strip()
    return bool(_CELL.fullmatch(first)) or first.startswith("(") or head[0] == ","


def parse_csv(text: str) -> list[list[tuple[int, str, int]]]:
    """Per rank, its compute actions as (stage, op, microbatch), in order."""
    ranks = []
    for r, row in enumerate(csv.reader(io.StringIO(text, newline=""))):
        acts = []
        for c, cell in enumerate(row):
            cell = cell.strip()
            if not cell:
                continue
            if cell.startswith("(") or cell.endswith("OVERLAP_F_B"):
                raise CsvImportError(f"rank {r}, column {c}: {cell!r} overlaps F and B "
                                     f"(OVERLAP_F_B), which a ReCycle worker does not run")
            m = _CELL.fullmatch(cell)
            if m is None:
                raise CsvImportError(f"rank {r}, column {c}: {cell!r} is not a pipelining action "
                                     f"(expected e.g. 0F1, 2I0, 1W3, 0B2)")
            stage, op, mb = int(m[1]), m[2], m[3]
            if op not in COMPUTE:
                continue  # communication and sharding: timed by the spec's p2p delays instead
            if not mb:
                raise CsvImportError(f"rank {r}, column {c}: {cell!r} has no micro-batch index")
            acts.append((stage, op, int(mb)))
        ranks.append(acts)
    return ranks


def _stage_orders(ranks, job: JobSpec) -> tuple[list[list[tuple[str, int]]], bool]:
    """Per stage, its (op, microbatch) order; and whether backward is split."""
    S, M = job.stages, job.microbatches
    on_rank: dict[int, int] = {}
    orders: dict[int, list[tuple[str, int]]] = {}
    ops_seen = set()
    for r, acts in enumerate(ranks):
        stages = sorted({s for s, _, _ in acts})
        if len(stages) > 1:
            raise CsvImportError(
                f"rank {r} runs stages {', '.join(map(str, stages))}: a ReCycle worker holds one "
                f"stage (interleaved, ZBV and DualPipeV schedules cannot be imported)")
        if not stages:
            continue
        s = stages[0]
        if s in on_rank:
            raise CsvImportError(f"stage {s} is on ranks {on_rank[s]} and {r}; each stage must be "
                                 f"on one rank")
        on_rank[s] = r
        orders[s] = [(op, mb) for _, op, mb in acts]
        ops_seen.update(op for _, op, _ in acts)
    if "B" in ops_seen and ops_seen & {"I", "W"}:
        raise CsvImportError("the CSV mixes fused backward B with split I/W; a plan uses one or "
                             "the other")
    if sorted(orders) != list(range(S)):
        raise CsvImportError(f"the CSV has stages {sorted(orders)[:8]}, the spec has 0..{S - 1}")
    split = "B" not in ops_seen
    ops = ("F", "I", "W") if split else ("F", "B")
    for s in range(S):
        for op in ops:
            got = sorted(mb for o, mb in orders[s] if o == op)
            if got != list(range(M)):
                bad = _first_off(got, M)
                raise CsvImportError(f"stage {s} (rank {on_rank[s]}): {op} of micro-batches "
                                     f"0..{M - 1} must each appear once; {bad}")
    return [orders[s] for s in range(S)], split


def _first_off(got: list[int], M: int) -> str:
    seen = set()
    for mb in got:
        if mb in seen:
            return f"{mb} appears twice"
        if mb >= M:
            return f"{mb} is past the spec's {M} micro-batches"
        seen.add(mb)
    return f"{min(set(range(M)) - seen)} is missing"


def time_orders(job: JobSpec, orders: list[list[tuple[str, int]]], split: bool):
    """Each worker's fixed order timed as soon as possible; every replica runs `orders`.
    Raises CsvImportError if the orders deadlock."""
    D, S, M = job.replicas, job.stages, job.microbatches
    back = "I" if split else "B"
    end: dict[tuple[str, int, int], int] = {}  # (op, stage, g) -> end time
    out = {(d, s): [] for d in range(D) for s in range(S)}
    pos = {k: 0 for k in out}
    free = {k: 0 for k in out}
    waiting: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    ready = deque(out)

    def dep(op, s, g):
        if op == "F":
            return ("F", s - 1, g) if s > 0 else None
        if op == back:
            return ("F", s, g) if s == S - 1 else (back, s + 1, g)
        return ("I", s, g)  # W

    while ready:
        d, s = k = ready.popleft()
        seq = orders[s]
        while pos[k] < len(seq):
            op, m = seq[pos[k]]
            g = d * M + m
            need = dep(op, s, g)
            if need is not None and need not in end:
                waiting.setdefault(need, []).append(k)
                break
            t = free[k]
            if need is not None:
                arrive = end[need] + (job.p2p.intra if need[1] != s else 0)
                t = max(t, arrive)
            e = t + job.duration(op, d, s)
            out[k].append((op, g, t, e))
            end[(op, s, g)] = e
            free[k] = e
            pos[k] += 1
            ready.extend(waiting.pop((op, s, g), ()))
    for (d, s), p in pos.items():
        if p < len(orders[s]):
            op, m = orders[s][p]
            raise CsvImportError(f"the order deadlocks: stage {s}'s action {p} ({s}{op}{m}) "
                                 f"waits for an action that can never run before it")
    return out


def import_csv(text: str, job: JobSpec, staggered: bool = True, name: str = "csv") -> Plan:
    """The CSV's pipeline order, run by every replica of `job`, as a timed Plan (not yet
    validated: memory, say, is the order's and the spec's, and `validate` judges it)."""
    t0 = time.perf_counter()
    orders, split = _stage_orders(parse_csv(text), job)
    timeline = time_orders(job, orders, split)
    add_opt(job, timeline)
    M = job.microbatches
    routes = [[g // M] * job.stages for g in range(job.num_microbatches)]
    return finish_plan(job, [], routes, timeline, Mode(split_backward=split, staggered=staggered),
                       name, "IMPORTED", time.perf_counter() - t0)
