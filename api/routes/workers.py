"""Worker liveness: heartbeats and suspect reports; the coordinator's training progress
(worker token or admin)."""
from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from api.hotpath.endpoints import WORKER_BEAT
from api.nodes.beat import worker_beat
from api.models import (Error, HeartbeatIn, HeartbeatOut, ProgressIn, ProgressOut, SuspectIn,
                        SuspectOut)
from api.security import JOB, AuthRoute, bearer
from api.jobs.runtime import ApiError
from planner.control import routes as R

router = APIRouter(prefix="/v1/jobs/{job_id}", route_class=AuthRoute,
                   dependencies=[Depends(bearer)], tags=["workers"])
ERRORS = {c: {"model": Error} for c in (401, 403, 404, 409, 410, 413, 422)}


@router.post(WORKER_BEAT.under(router.prefix), response_model=HeartbeatOut,
             openapi_extra=WORKER_BEAT.openapi_extra, responses=WORKER_BEAT.responses(),
             summary="A worker is alive")
async def heartbeat(job_id: str, hb: HeartbeatIn, request: Request):  # = WORKER_BEAT.body
    """Send one at least every `timeout_s / 5`. The answer carries the current plan
    version, so a worker can notice a new plan without polling for it. A worker marked
    failed gets 409 (it is fenced out); a halted job answers 410. With `incarnation`: one
    older than the plan's is superseded (409), a newer one must post its recovery event
    first (409); neither keeps the worker alive. With `compute_s_per_mb` (and
    `compute_iteration`): the straggler detector's input; a worker measured slower than its
    stage's peers gets a lower speed in a new plan version (docs/api.md, "Stragglers")."""
    svc = request.app.state.service
    return await worker_beat(svc, svc.job(job_id), hb)


@router.post(R.SUSPECTS.under(router.prefix), response_model=SuspectOut, openapi_extra=JOB, responses=ERRORS,
             summary="A peer stopped answering: check it now")
async def suspect(job_id: str, report: SuspectIn, request: Request):
    """Cuts the suspected worker's deadline to its last heartbeat plus the suspect grace
    (a quarter of the heartbeat timeout by default) and checks at once: a worker already
    silent that long is declared failed within milliseconds. `replica, stage` name the
    peer's slot (whom the reporter exchanges with): with roles, the worker filling it in
    the plan in force is the one suspected (an empty slot: nobody, `declared_failed`)."""
    svc = request.app.state.service
    job = svc.job(job_id)
    job.check_worker(report.replica, report.stage)
    if report.reporter is not None:
        job.check_worker(report.reporter.replica, report.reporter.stage)
    if job.state == "finished":  # its workers are exiting: nobody is declared failed
        return {"replica": report.replica, "stage": report.stage,
                "declared_failed": False, "deadline_s": None}
    version = job.version
    who = (report.replica, report.stage)
    if job.plan.roles is not None:
        if job.state == "halted":
            raise job.halted_error()
        who = job.plan.filler(*who)
    if report.reason and report.reporter is not None and job.plan.roles is None:
        # a peer out of reach while alive: both ends of a cut link say so (heartbeats.py)
        svc.monitor.link_down(job, (report.reporter.replica, report.reporter.stage),
                              report.reason)
    left = None if who is None else svc.monitor.suspect(job, *who)
    if left is not None:  # if it turns out alive, the reporter still needs a new plan
        svc.resync_later(job, version)
    return {"replica": report.replica, "stage": report.stage,
            "declared_failed": left is None, "deadline_s": left}


@router.post(R.PROGRESS.under(router.prefix), response_model=ProgressOut, openapi_extra=JOB, responses=ERRORS,
             summary="The coordinator's training progress")
async def progress(job_id: str, report: ProgressIn, request: Request):
    """The newest completed iteration, its mean loss and the measured tokens/s, sent by the
    coordinator at most about once a second; the live page shows the last one. Kept in
    memory with the job (a restarted service shows it again at the next report). Taken
    while the job runs and once it finished (the last report may cross the finish); a
    halted job answers 410. A report of snapshot_every 0 (the run keeps no peer-memory
    snapshots: off, or `auto` chose off) turns them off in the job's membership."""
    job = request.app.state.service.job(job_id)
    if job.state == "halted":
        raise job.halted_error()
    if report.iterations is not None and report.iteration >= report.iterations:
        raise ApiError(422, f"iteration {report.iteration} is not below iterations "
                            f"{report.iterations}")
    job.progress = {**report.model_dump(), "at": time.time()}
    if report.snapshot_every == 0 and job.members.snapshots:
        # the run keeps no peer-memory snapshots (off, or auto chose off within its memory
        # budget): plan no restore from one and count its one-copy stages as halt risks
        async with job.lock:  # after an event in flight (it stores the membership it read)
            job.members = job.members.with_snapshots(False)
    return {"state": job.state, "iteration": report.iteration}
