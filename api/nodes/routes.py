"""Node agents: claim a node, heartbeat for all its workers at once, give the node back.

An agent long-polls its node's share of the plan once for all its workers
(GET .../nodes/{node}/plan; the fast path, api/fastpath.py, answers the well-formed ones
with the same bytes as this route); a local worker's death it posts as a failure event
(POST /v1/jobs/{id}/events with the worker's incarnation).
"""
from __future__ import annotations

import asyncio

from typing import Optional

from fastapi import APIRouter, Depends, Request, Response

from api.hotpath.endpoints import (AFTER, NODE, NODE_BEAT, NODE_PLAN, PER_NODE, WAIT, path,
                                   query)
from api.hotpath.views import node_view
from api.models import Error
from api.routes.plans import _json, _wait
from api.nodes.beat import node_beat
from api.nodes.models import DetachOut, NodeBeatIn, NodeBeatOut, NodeClaimIn, NodeOut
from api.security import JOB, AuthRoute, bearer
from api.jobs.runtime import ApiError
from planner.control import routes as R

router = APIRouter(prefix="/v1/jobs/{job_id}/nodes/{node}", route_class=AuthRoute,
                   dependencies=[Depends(bearer)], tags=["nodes"])
ERRORS = {c: {"model": Error} for c in (401, 403, 404, 409, 410, 413, 422)}
Node = path(NODE)


def _claim(request: Request, job_id: str, node: int, body: NodeClaimIn):
    svc = request.app.state.service
    job = svc.job(job_id)
    if job.state == "halted":
        raise job.halted_error()
    cells = request.app.state.nodes.claim(job, node, body.agent_id, body.workers_per_node)
    return svc, job, cells


@router.post(R.NODE_ATTACH.under(router.prefix), response_model=NodeOut, openapi_extra=JOB, responses=ERRORS,
             summary="An agent claims a node")
async def attach(job_id: str, body: NodeClaimIn, request: Request, node: int = Node):
    """The node's workers are ranks `node * workers_per_node` onwards. 409 while another
    agent holds the node (its lease lasts the heartbeat timeout after its last heartbeat)
    or when the job's nodes were claimed with another `workers_per_node`; 422 for a node
    rank outside the job."""
    svc, job, cells = _claim(request, job_id, node, body)
    return {"job_id": job.id, "node_rank": node, "agent_id": body.agent_id,
            "workers": [{"replica": r, "stage": s} for r, s in cells], "state": job.state,
            "plan_version": job.version, "timeout_s": svc.config.heartbeat_timeout_s}


@router.post(NODE_BEAT.under(router.prefix), response_model=NodeBeatOut,
             openapi_extra=NODE_BEAT.openapi_extra, responses=NODE_BEAT.responses(),
             summary="Heartbeats of a node's workers, in one request")
async def heartbeats(job_id: str, body: NodeBeatIn, request: Request,  # = NODE_BEAT.body
                     node: int = Node):
    """Each entry counts as that worker's own heartbeat (POST /heartbeats), including the
    straggler detector's compute times. Renews the agent's lease (and claims the node if
    nobody holds it, e.g. after a service restart). A worker the job has failed, or an
    incarnation other than the plan's, is listed in `refused`; a worker not on this node
    is a 422 for the whole request."""
    svc = request.app.state.service
    return await node_beat(svc, request.app.state.nodes, svc.job(job_id), node, body)


@router.post(R.NODE_DETACH.under(router.prefix), response_model=DetachOut, openapi_extra=JOB, responses=ERRORS,
             summary="An agent gives its node back")
async def detach(job_id: str, body: NodeClaimIn, request: Request, node: int = Node):
    """Another agent may claim the node at once. The workers' own state is not touched
    (a worker that stopped heartbeating is still declared failed by its timeout)."""
    request.app.state.service.job(job_id)
    if request.app.state.nodes.release(job_id, node, body.agent_id):
        return {"released": True}
    holder = request.app.state.nodes.holder(job_id, node)
    return {"released": False, "reason": "not held" if holder is None
            else f"held by agent {holder.agent_id}"}


@router.get(NODE_PLAN.under(router.prefix), openapi_extra=NODE_PLAN.openapi_extra,
            responses=NODE_PLAN.responses(),
            summary="The node's share of the current plan (long-poll like /plan)")
async def node_plan(request: Request, job_id: str, node: int = Node,
                    after: Optional[int] = query(AFTER), wait: float = query(WAIT),
                    workers_per_node: int = query(PER_NODE)):
    """One long-poll for all the node's workers: the version, failed set, routes, metrics
    and solver once, and under `workers` each worker's entry as
    /workers/{replica}/{stage}/plan gives it (in_plan, incarnation, actions)."""
    svc = request.app.state.service
    request.app.state.nodes.workers(svc.job(job_id), node, workers_per_node)  # 422 outside
    _, job, newer = await _wait(request, job_id, after, wait)
    if not newer:
        return Response(status_code=204)
    return _json(node_view(job, node, workers_per_node), job.version)
