"""Who holds which stage's peer-memory snapshot (docs/executor.md, "Peer-memory snapshots").

Every stage's parameters and optimizer state are also kept in the host memory of one live
worker elsewhere, so that the stage survives the death of all its own workers. A holder is
worth most on a node (machine) that holds no live worker of the stage: a machine that dies
takes its workers and the snapshots it holds together. Failing that, any live worker of
another stage; a worker of the stage itself is never a holder (its own copy dies with it).

Pure: roles (or identity roles when the plan has none) and a node-of-worker function in,
stage -> holder out. Deterministic, so every worker computes the same holders from the
same plan without talking to anyone. Load is spread: the busiest holder holds as few
snapshots as any assignment within the candidates allows (a small b-matching).
"""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional

from planner.control.roles import identity_roles
from planner.plan import Plan, Role

NodeOf = Callable[[str], Hashable]


def home_slot(worker: str) -> Optional[tuple[int, int]]:
    """The home slot (r, s) of a worker id "R.S"; None for another name (a new node's)."""
    parts = worker.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def node_of_workers(stages: int, gpus_per_node: Optional[int] = None) -> NodeOf:
    """The default node of a worker: its home replica r (locally each replica row stands
    for one machine), or with `gpus_per_node` G the machine of rank r*S+s, (r*S+s)//G.
    A worker whose id is not a home slot is a node of its own."""
    def node(worker: str) -> Hashable:
        home = home_slot(worker)
        if home is None:
            return ("named", worker)
        r, s = home
        return r if gpus_per_node is None else (r * stages + s) // gpus_per_node
    return node


def _order(worker: str) -> tuple:
    home = home_slot(worker)
    return (0, home, "") if home is not None else (1, (0, 0), worker)


def snapshot_holders(roles: Iterable[Role], stages: int, node_of: Optional[NodeOf] = None,
                     ) -> dict[int, Optional[str]]:
    """stage -> the live worker that holds its snapshot (None: no live worker can).

    A stage's candidates, best tier only: live workers on a node with no live worker of
    the stage; else live workers not of the stage. Among those, the assignment with the
    least load on the busiest holder (a b-matching: fewest snapshots per holder)."""
    node_of = node_of or node_of_workers(stages)
    stage_of = {r.worker: r.stage for r in roles}
    workers = sorted(stage_of, key=_order)
    nodes_of_stage: dict[int, set] = {s: set() for s in range(stages)}
    for w in workers:
        nodes_of_stage.setdefault(stage_of[w], set()).add(node_of(w))
    cands: dict[int, list[str]] = {}
    for s in range(stages):
        away = [w for w in workers if node_of(w) not in nodes_of_stage[s]]
        cands[s] = away or [w for w in workers if stage_of[w] != s]
    todo = sorted((s for s in range(stages) if cands[s]), key=lambda s: (len(cands[s]), s))
    out: dict[int, Optional[str]] = {s: None for s in range(stages)}
    if todo:
        cap = -(-len(todo) // len({w for s in todo for w in cands[s]}))
        while True:  # the least per-holder load that serves every stage
            got = _assign(todo, cands, cap, node_of)
            if got is not None:
                out.update(got)
                break
            cap += 1
    return out


def _assign(todo: list[int], cands: dict[int, list[str]], cap: int, node_of: NodeOf
            ) -> Optional[dict[int, str]]:
    """Each stage of `todo` to one of its candidates, none over `cap` stages; None if no
    such assignment exists. Augmenting paths found breadth first, the stage's own
    candidates tried on the least loaded node first, then the least loaded worker, then
    by id (deterministic; spread over machines as well as over workers)."""
    held: dict[str, list[int]] = {}
    where: dict[int, str] = {}
    for s in todo:
        on_node: dict = {}
        for c in where.values():
            on_node[node_of(c)] = on_node.get(node_of(c), 0) + 1
        first = sorted(cands[s], key=lambda c: (on_node.get(node_of(c), 0),
                                                len(held.get(c, ())), _order(c)))
        parent: dict[str, tuple[Optional[str], int]] = {}
        queue = []
        for c in first:
            if c not in parent:
                parent[c] = (None, s)
                queue.append(c)
        found = None
        k = 0
        while k < len(queue):
            c = queue[k]
            k += 1
            if len(held.get(c, ())) < cap:
                found = c
                break
            for s2 in held[c]:  # c is full: one of its stages moves on
                for c2 in cands[s2]:
                    if c2 not in parent:
                        parent[c2] = (c, s2)
                        queue.append(c2)
        if found is None:
            return None
        c = found
        while c is not None:  # shift the stages along the path
            prev, st = parent[c]
            held.setdefault(c, []).append(st)
            if prev is not None:
                held[prev].remove(st)
            where[st] = c
            c = prev
    return where


def plan_roles_or_identity(plan: Plan) -> list[Role]:
    """The plan's roles; identity roles (worker "r.s" in slot (r, s)) when it has none."""
    return list(plan.roles) if plan.roles is not None else identity_roles(plan.job, plan.failed)


def plan_holders(plan: Plan, node_of: Optional[NodeOf] = None,
                 gpus_per_node: Optional[int] = None) -> dict[int, Optional[str]]:
    """snapshot_holders for the plan in force (its roles, or identity roles)."""
    S = plan.job.stages
    return snapshot_holders(plan_roles_or_identity(plan), S,
                            node_of or node_of_workers(S, gpus_per_node))
