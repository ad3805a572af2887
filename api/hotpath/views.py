"""The bytes the plan long-polls answer: a worker's share and a node's share of the plan in
force, each serialised once per version and kept in `job.views` (the fast path,
api/fastpath.py, and the routes, api/routes/plans.py and api/nodes/routes.py, send the same
objects), and the 409 of a superseded worker process, which both check alike."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Optional

from api.hotpath.encode import PARTS
from api.jobs.runtime import ApiError
from planner.plan import home_of


def _parts(job) -> None:
    """Per version, from the Plan object in memory (no re-parse of its JSON): the fields
    every share carries, serialised once, each worker's actions by cell, and with roles
    the slot each worker fills."""
    if "_head" in job.views:
        return
    plan = job.plan
    head = {"job_id": job.id, "version": plan.version, "failed": plan.failed}
    tail = {"metrics": plan.metrics.model_dump(mode="json"),
            "solver": plan.solver.model_dump(mode="json")}
    job.views["_head"] = json.dumps(head, separators=(",", ":"))[1:-1].encode()
    job.views["_tail"] = json.dumps(tail, separators=(",", ":"))[1:-1].encode()
    job.views["_actions"] = {(w.replica, w.stage): w.actions for w in plan.workers}
    job.views["_slots"] = None if plan.roles is None else {
        home_of(r.worker): (r.replica, r.stage) for r in plan.roles}


def _slot(job, worker) -> tuple:
    """The slot `worker` fills (its own without roles; None when it fills none)."""
    slots = job.views["_slots"]
    return worker if slots is None else slots.get(worker)


def _microbatches(job, cells) -> list[int]:
    """The micro-batches the workers `cells` run an action of, in order."""
    acts = job.views["_actions"]
    slots = [_slot(job, c) for c in cells]
    return sorted({g for c in slots if c in acts for g in PARTS.microbatches(acts[c])})


def _routes(job, cells) -> str:
    """The route rows (every stage's replica) of the micro-batches `cells` touch, keyed by
    micro-batch: all a worker needs to know whom it exchanges activations with. The whole
    table (replicas x micro-batches rows) is in the plan (`/plan`), not in shares."""
    routes = job.plan.routes
    return json.dumps({str(g): routes[g] for g in _microbatches(job, cells)},
                      separators=(",", ":"))


def _entry(job, replica: int, stage: int) -> str:
    """One worker's own part of its share: identity, membership, incarnation, actions
    (with roles, those of the slot it fills, named by `slot`)."""
    slot = _slot(job, (replica, stage))
    actions = job.views["_actions"].get(slot)
    grid = job.plan.incarnations
    inc = grid[replica][stage] if grid else 1
    where = "" if job.views["_slots"] is None else \
        f',"slot":{"null" if slot is None else f"[{slot[0]},{slot[1]}]"}'
    return (f'{{"replica":{replica},"stage":{stage},"in_plan":{str(actions is not None).lower()},'
            f'"incarnation":{inc}{where},"actions":{PARTS.actions(actions) if actions else "[]"}}}')


def _share(job, entry: bytes, cells) -> bytes:
    """`entry` (an object's fields, no closing brace) plus the shared fields and the route
    rows of `cells`."""
    return b"".join((entry, b",", job.views["_head"], b',"routes":',
                     _routes(job, cells).encode(), b",", job.views["_tail"], b"}"))


def worker_view(job, replica: int, stage: int) -> bytes:
    """One worker's share of the current plan: its actions and the route rows of its
    micro-batches, with the fields every share has (serialised once per version)."""
    key = (replica, stage)
    if key not in job.views:
        _parts(job)
        job.views[key] = _share(job, _entry(job, replica, stage)[:-1].encode(), [key])
    return job.views[key]


def node_cells(job, node: int, per_node: int) -> Optional[list[tuple[int, int]]]:
    """The (replica, stage) cells of node `node` at `per_node` workers per node (ranks
    node*per_node onwards, rank = replica * stages + stage); None outside the job."""
    n, S = job.spec.replicas * job.spec.stages, job.spec.stages
    if not (1 <= per_node and node * per_node < n):
        return None
    return [divmod(rank, S) for rank in range(node * per_node, min(n, (node + 1) * per_node))]


def node_view(job, node: int, per_node: int) -> bytes:
    """A node's share (one long-poll per node agent): the entry of each of the node's
    workers (as in worker_view) under `workers`, the shared fields once, and the route rows
    of every micro-batch one of them touches (the agent cuts each worker's rows from them)."""
    key = ("node", node, per_node)
    if key not in job.views:
        _parts(job)
        cells = node_cells(job, node, per_node)
        entries = ",".join(_entry(job, r, s) for r, s in cells)
        job.views[key] = _share(job, f'{{"node_rank":{node},"workers":[{entries}]'.encode(),
                                cells)
    return job.views[key]


def prebuilt_views(job, plan, per_node: Optional[int]) -> dict:
    """What job.views will hold once `plan` is published: the shares of every node at
    `per_node` workers per node (None: no agent has claimed one; nothing is built), made
    from `plan` before it is in force (Service.apply_event builds them while the event's
    write waits for its fsync)."""
    draft = SimpleNamespace(id=job.id, spec=job.spec, plan=plan, views={})
    if per_node:
        for node in range(-(-job.spec.replicas * job.spec.stages // per_node)):
            node_view(draft, node, per_node)
    return draft.views


def superseded(job, worker, incarnation: Optional[int]):
    """The 409 for a worker process older than the incarnation the plan admits, else None.
    A newer one gets the plan: it learns the version to wait after (its recovery event
    makes the next one admit it)."""
    if worker is None or incarnation is None:
        return None
    have = job.incarnation(*worker)
    if incarnation >= have:
        return None
    return ApiError(409, f"worker {worker[0]}:{worker[1]} incarnation {incarnation} is "
                         f"superseded by incarnation {have}; it must stop")
