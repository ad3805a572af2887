"""A worker's heartbeat and a node's: shared by the routes (api/routes/workers.py,
api/nodes/routes.py) and the fast path (api/fastpath.py), so both answer alike."""
from __future__ import annotations

import asyncio

from api.nodes.models import NodeBeatIn
from api.jobs.runtime import ApiError


async def node_beat(svc, nodes, job, node: int, body: NodeBeatIn) -> dict:
    """Count every listed worker's heartbeat; ApiError for the request as a whole."""
    if job.state == "halted":
        raise job.halted_error()
    cells = nodes.claim(job, node, body.agent_id, body.workers_per_node)
    mine = set(cells)
    for hb in body.workers:
        if (hb.replica, hb.stage) not in mine:
            raise ApiError(422, f"worker {hb.replica}:{hb.stage} is not on node {node} "
                                f"(ranks {node * body.workers_per_node}.."
                                f"{node * body.workers_per_node + len(cells) - 1})")
    refused, arming, incs = [], [], []
    for hb in body.workers:
        try:
            a = svc.monitor.beat(job, hb.replica, hb.stage, hb.incarnation)
        except ApiError as e:
            if e.status == 410:
                raise
            refused.append({"replica": hb.replica, "stage": hb.stage, "status": e.status,
                            "detail": e.detail})
        else:
            if a is not None:
                arming.append(a)
            if hb.entered_version is not None:
                job.note_entered((hb.replica, hb.stage), hb.entered_version)
            if hb.compute_s_per_mb is not None:
                it = hb.iteration if hb.compute_iteration is None else hb.compute_iteration
                await svc.observe_compute(job, (hb.replica, hb.stage),
                                          job.incarnation(hb.replica, hb.stage), it,
                                          hb.compute_s_per_mb)
        incs.append(job.incarnation(hb.replica, hb.stage))
    if arming:
        await asyncio.gather(*arming)
    return {"state": job.state, "plan_version": job.version,
            "timeout_s": svc.config.heartbeat_timeout_s, "incarnations": incs,
            "refused": refused}


async def worker_beat(svc, job, hb) -> dict:
    """One worker's own heartbeat (POST /heartbeats)."""
    job.check_worker(hb.replica, hb.stage)
    arming = svc.monitor.beat(job, hb.replica, hb.stage, hb.incarnation)
    if arming is not None:
        await arming
    if hb.entered_version is not None:
        job.note_entered((hb.replica, hb.stage), hb.entered_version)
    if hb.compute_s_per_mb is not None:
        it = hb.iteration if hb.compute_iteration is None else hb.compute_iteration
        await svc.observe_compute(job, (hb.replica, hb.stage),
                                  job.incarnation(hb.replica, hb.stage), it, hb.compute_s_per_mb)
    return {"state": job.state, "plan_version": job.version,
            "timeout_s": svc.config.heartbeat_timeout_s,
            "incarnation": job.incarnation(hb.replica, hb.stage)}
