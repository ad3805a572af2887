"""Jobs and their failure/recovery events."""
from __future__ import annotations

import asyncio
import json
from typing import Literal, Optional

from fastapi import APIRouter, Depends, Query, Request, Response

from api.models import (Error, EventIn, EventOut, JobBrief, JobCreated, JobOut, NodeEventIn,
                        Precompute, SpeedIn, SpeedsOut)
from api.security import ADMIN, JOB, AuthRoute, bearer
from api.jobs.runtime import ApiError
from planner.control import routes as R
from planner.job import JobSpec

router = APIRouter(prefix="/v1/jobs", route_class=AuthRoute, dependencies=[Depends(bearer)],
                   tags=["jobs"])


def errors(*codes: int) -> dict:
    return {c: {"model": Error} for c in (401, 403, 413, 422, *codes)}


async def unless_client_leaves(request: Request, work, poll_s: float = 0.2):
    """Await `work`, cancelled if the client disconnects first: a registration nobody
    waits for must not go on to create a job whose token nobody received. (The greedy
    plan's thread runs to its end, bounded by the planning limits; its result is dropped.)"""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            try:
                return await task  # it was done already: the job stands
            except asyncio.CancelledError:
                raise ApiError(499, "client closed the request before the job was "
                                    "registered") from None


def plan_rows(rows) -> list[dict]:
    """Stored plan versions as the history shows them: `moves` for those that have some."""
    out = []
    for r in rows:
        row = dict(r)
        moves = row.pop("moves_json", None)
        if moves:
            row["moves"] = json.loads(moves)
        out.append(row)
    return out


def precompute_of(request: Request, job_id: str) -> dict:
    row = request.app.state.service.store.precompute(job_id)
    return {"state": row["state"], "done": row["done"], "total": row["total"],
            "sets": row["sets"], "max_failures": row["max_failures"],
            "solvers": json.loads(row["solvers"]), "error": row["error"]}


@router.post(R.JOBS.under(router.prefix), status_code=201, response_model=JobCreated, openapi_extra=ADMIN,
             responses=errors(), summary="Register a job (admin)")
async def create_job(spec: JobSpec, request: Request,
                     max_failures: Optional[int] = Query(
                         None, ge=0, le=64, description="precompute plans for every failed "
                         "set of up to this many workers (default: the service's)"),
                     shape: Literal["auto", "speed", "fixed"] = Query(
                         "auto", description="auto: when fewer workers are live than stages, "
                         "the service cuts the pipeline into fewer stages (its workers must "
                         "build stages of other layer ranges, as recycle's models do); speed: "
                         "at every failure and return it takes the shape that trains most "
                         "over the horizon (cut for speed, and back); fixed: it pauses for "
                         "workers to come back")):
    """Body: the job spec (docs/design.md section 5). Publishes plan version 0, starts
    precomputing plans for likely failed sets, and returns the job's worker token."""
    job, token = await unless_client_leaves(
        request, request.app.state.service.register(spec, max_failures, shape))
    return {"id": job.id, "token": token, "state": job.state, "plan_version": job.version,
            "max_failures": job.max_failures}


@router.get("", response_model=list[JobBrief], openapi_extra=ADMIN, responses=errors(),
            summary="List jobs (admin)")
async def list_jobs(request: Request):
    return [{"id": j.id, "state": j.state, "plan_version": j.version, "failed": j.failed}
            for j in request.app.state.service.jobs.values()]


@router.get(R.JOB.under(router.prefix), response_model=JobOut, openapi_extra=JOB, responses=errors(404),
            summary="A job: state, failed set, plan versions, precompute progress")
async def get_job(job_id: str, request: Request):
    svc = request.app.state.service
    job = svc.job(job_id)
    return {"id": job.id, "state": job.state, "reason": job.reason,
            "spec": job.spec.model_dump(mode="json"), "failed": job.failed,
            "plan_version": job.version, "incarnations": job.incarnations,
            "speeds": job.speeds,
            "max_failures": job.max_failures, "shape": job.shape,
            "created": job.created,
            "plans": plan_rows(svc.store.plan_history(job.id)),
            "precompute": precompute_of(request, job.id)}


@router.post(R.EVENTS.under(router.prefix), response_model=EventOut, openapi_extra=JOB,
             responses=errors(404, 409), summary="Report a failure or a recovery")
async def post_event(job_id: str, ev: EventIn, request: Request, response: Response):
    """Idempotent by `event_id`: the same id and body get the same answer again; the same
    id with another body is a 409. Failing an already failed worker, or recovering a live
    one, is a 409. An event that leaves a stage with no live replica is accepted, and the
    job halts (`state: halted`, with a "restore from checkpoint" reason)."""
    svc = request.app.state.service
    return await _apply(svc.apply_event, svc.job(job_id), ev, request, response)


@router.post("/{job_id}/speeds", response_model=EventOut, openapi_extra=JOB,
             responses=errors(404, 409), summary="Set or clear a worker's speed (a straggler)")
async def post_speed(job_id: str, ev: SpeedIn, request: Request, response: Response):
    """A speed event: `speed` (0 < speed <= 100, 1.0 nominal, quantised to steps of 0.1) for
    worker (replica, stage), or null to clear the setting. The operator's setting takes
    precedence over the straggler detector's measurement until cleared. If the speeds in
    force change, a new plan version for them is published (answer: `plan_version`,
    `plan_source`, and the worker's `speed` in force). Idempotent by `event_id` like
    `/events` (same id, another body: 409); a halted or finished job answers 409."""
    svc = request.app.state.service
    return await _apply(svc.apply_speed, svc.job(job_id), ev, request, response)


@router.post(R.NODES.under(router.prefix), response_model=EventOut, openapi_extra=JOB,
             responses=errors(404, 409), summary="A node removed or added")
async def post_node(job_id: str, ev: NodeEventIn, request: Request, response: Response):
    """`kind: remove` (a spot preemption notice, an instance gone) with the node's
    `workers`: they fail at once, together, in one new plan version (a worker already
    failed, or named by a superseded incarnation, is left out; none left: 409). `kind: add`
    (a new instance) with `count`, or `workers_per_node` for a whole node: the job's grid
    is its capacity, so the new workers take the ids of dead workers; the answer's
    `workers` are the ids given (and `node_rank` the vacant node), and each joins by its
    own recovery event with an incarnation at least the one given (409: not that many
    vacant ids). Idempotent by `event_id` like `/events`, in the same id space."""
    svc = request.app.state.service
    return await _apply(svc.apply_node, svc.job(job_id), ev, request, response)


async def _apply(apply, job, ev, request: Request, response: Response) -> dict:
    """An event from an operator (admin token) or a worker; a replay is marked."""
    source = "operator" if request.state.role == "admin" else "worker"
    answer, replayed = await apply(job, ev, source)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return answer


@router.get("/{job_id}/speeds", response_model=SpeedsOut, openapi_extra=JOB,
            responses=errors(404), summary="Speeds in force, and where they come from")
async def get_speeds(job_id: str, request: Request):
    job = request.app.state.service.job(job_id)
    det = job.detector
    measured = ([list(row) for row in det.grid] if det is not None else
                [[1.0] * job.spec.stages for _ in range(job.spec.replicas)])
    return {"plan_version": job.version, "speeds": job.speeds,
            "operator": [{"replica": d, "stage": s, "speed": v}
                         for (d, s), v in sorted(job.operator.items())],
            "measured": measured}


@router.post(R.FINISH.under(router.prefix), response_model=JobBrief, openapi_extra=JOB,
             responses=errors(404, 410), summary="Training completed: stop failure detection")
async def finish_job(job_id: str, request: Request):
    """`state: finished`: the job's workers are no longer watched (they exit without being
    declared failed), events answer 409. Idempotent; a halted job answers 410."""
    svc = request.app.state.service
    job = svc.job(job_id)
    await svc.finish(job)
    return {"id": job.id, "state": job.state, "plan_version": job.version, "failed": job.failed}


@router.get(R.EVENT_LOG.under(router.prefix), response_model=list[EventOut], openapi_extra=JOB,
            responses=errors(404), summary="Accepted events, oldest first")
async def list_events(job_id: str, request: Request):
    svc = request.app.state.service
    svc.job(job_id)
    return [json.loads(r["response_json"]) for r in svc.store.events(job_id)]


@router.get("/{job_id}/precompute", response_model=Precompute, openapi_extra=JOB,
            responses=errors(404), summary="Progress of the background precompute")
async def get_precompute(job_id: str, request: Request):
    request.app.state.service.job(job_id)
    return precompute_of(request, job_id)
