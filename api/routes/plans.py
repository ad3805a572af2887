"""Plans: the current one (with long-poll), any past version, one worker's share."""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Request, Response

from api.hotpath.encode import whole_plan
from api.hotpath.endpoints import (AFTER, INCARNATION, INDEX, JOB_PLAN, VERSION, WAIT,
                                   WORKER_PLAN, path, query)
from api.hotpath.views import superseded, worker_view
from api.models import Error, WorkerPlanOut
from api.security import JOB, AuthRoute, bearer
from api.jobs.runtime import ApiError
from planner.control import routes as R
from planner.plan import Plan

router = APIRouter(prefix="/v1/jobs/{job_id}", route_class=AuthRoute,
                   dependencies=[Depends(bearer)], tags=["plans"])

ERRORS = {c: {"model": Error} for c in (401, 403, 404, 410, 413, 422)}
# The long-polls' paths, bounds, auth and documented statuses are declared once, for them
# and for the fast path that answers most of their requests (api/hotpath/endpoints.py).


def _json(body: bytes, version: int) -> Response:
    return Response(body, media_type="application/json",
                    headers={"ETag": f'"v{version}"', "Cache-Control": "no-store"})


async def _whole(request: Request, body: bytes, version: int) -> Response:
    """A whole plan, gzip-compressed once per version for clients that accept it
    (api/hotpath/encode.py whole_plan; the fast path answers alike)."""
    body, headers = await whole_plan(body, version, request.headers.get("accept-encoding"))
    return Response(body, media_type="application/json", headers={
        k.decode(): v.decode() for k, v in headers if k not in (b"content-type",
                                                                 b"content-length")})


async def _wait(request: Request, job_id: str, after: Optional[int], wait: float):
    svc = request.app.state.service
    job = svc.job(job_id)
    newer = await svc.wait_newer(job, after, wait)
    if job.state == "halted":
        raise job.halted_error()
    return svc, job, newer


@router.get(JOB_PLAN.under(router.prefix), response_model=Plan,
            openapi_extra=JOB_PLAN.openapi_extra, responses=JOB_PLAN.responses(),
            summary="Current plan; long-poll with after/wait")
async def current_plan(request: Request, job_id: str, after: Optional[int] = query(AFTER),
                       wait: float = query(WAIT)):
    """Without `after`: the current plan at once. With `after=V`: the current plan as
    soon as its version is greater than V, or 204 after `wait` seconds. A halted job
    answers 410 with the reason (restore from checkpoint)."""
    _, job, newer = await _wait(request, job_id, after, wait)
    if not newer:
        return Response(status_code=204)
    return await _whole(request, job.plan_bytes, job.version)


@router.get(R.PLAN_VERSION.under(router.prefix), response_model=Plan, openapi_extra=JOB,
            responses=ERRORS, summary="A past or current plan version")
async def plan_version(request: Request, job_id: str,
                       version: int = path(VERSION)):
    svc = request.app.state.service
    body = svc.job(job_id).recent.get(version)
    if body is None:
        row = svc.store.plan(job_id, version)
        if row is None:
            raise ApiError(404, f"job {job_id} has no plan version {version}")
        body = row["plan_json"].encode()
    return await _whole(request, body, version)


@router.get(WORKER_PLAN.under(router.prefix), response_model=WorkerPlanOut,
            openapi_extra=WORKER_PLAN.openapi_extra, responses=WORKER_PLAN.responses(),
            summary="One worker's actions in the current plan (long-poll like /plan)")
async def worker_plan(request: Request, job_id: str, replica: int = path(INDEX),
                      stage: int = path(INDEX), after: Optional[int] = query(AFTER),
                      wait: float = query(WAIT),
                      incarnation: Optional[int] = query(INCARNATION)):
    """The worker's ordered actions plus the routes and the version. `in_plan: false`
    means the worker has been declared failed and must stop (fencing); `incarnation` is
    the process incarnation of this worker that the version admits."""
    svc = request.app.state.service
    job = svc.job(job_id)
    job.check_worker(replica, stage)
    err = superseded(job, (replica, stage), incarnation)
    if err is not None:
        raise err
    svc, job, newer = await _wait(request, job_id, after, wait)
    err = superseded(job, (replica, stage), incarnation)
    if err is not None:
        raise err
    if not newer:
        return Response(status_code=204)
    return _json(worker_view(job, replica, stage), job.version)
