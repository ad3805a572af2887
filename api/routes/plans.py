"""Plans: the current one (with long-poll), any past version, one worker's share."""
from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from api.hotpath.views import superseded, worker_view
from api.hotpath.encode import whole_plan
from api.models import MAX_INCARNATION, Error, WorkerPlanOut
from api.security import JOB, AuthRoute, bearer
from api.jobs.runtime import ApiError
from planner.plan import Plan

router = APIRouter(prefix="/v1/jobs/{job_id}", route_class=AuthRoute,
                   dependencies=[Depends(bearer)], tags=["plans"])

ERRORS = {c: {"model": Error} for c in (401, 403, 404, 410, 413, 422)}
NO_NEWER = {204: {"description": "no newer version within `wait` seconds"}}
AFTER = Query(None, ge=-1, le=2**53, description="return only a version newer than this")
WAIT = Query(0.0, ge=0, le=3600, description="seconds to wait for a newer version (long-poll; "
                                             "capped by the server's max wait)")


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


@router.get("/plan", response_model=Plan, openapi_extra=JOB,
            responses={**ERRORS, **NO_NEWER}, summary="Current plan; long-poll with after/wait")
async def current_plan(request: Request, job_id: str, after: Optional[int] = AFTER,
                       wait: float = WAIT):
    """Without `after`: the current plan at once. With `after=V`: the current plan as
    soon as its version is greater than V, or 204 after `wait` seconds. A halted job
    answers 410 with the reason (restore from checkpoint)."""
    _, job, newer = await _wait(request, job_id, after, wait)
    if not newer:
        return Response(status_code=204)
    return await _whole(request, job.plan_bytes, job.version)


@router.get("/plans/{version}", response_model=Plan, openapi_extra=JOB,
            responses=ERRORS, summary="A past or current plan version")
async def plan_version(request: Request, job_id: str,
                       version: int = Path(ge=0, le=2**53)):
    svc = request.app.state.service
    body = svc.job(job_id).recent.get(version)
    if body is None:
        row = svc.store.plan(job_id, version)
        if row is None:
            raise ApiError(404, f"job {job_id} has no plan version {version}")
        body = row["plan_json"].encode()
    return await _whole(request, body, version)


@router.get("/workers/{replica}/{stage}/plan", response_model=WorkerPlanOut,
            openapi_extra=JOB, responses={**ERRORS, **NO_NEWER, 409: {"model": Error}},
            summary="One worker's actions in the current plan (long-poll like /plan)")
async def worker_plan(request: Request, job_id: str, replica: int = Path(ge=0, le=1_000_000),
                      stage: int = Path(ge=0, le=1_000_000), after: Optional[int] = AFTER,
                      wait: float = WAIT,
                      incarnation: Optional[int] = Query(
                          None, ge=1, le=MAX_INCARNATION,
                          description="the caller's incarnation: an older one than the "
                                      "version admits is answered 409 (it must stop)")):
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
