"""Health and metrics (no token: they reveal no job data beyond job ids in labels)."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.models import Health

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz(request: Request):
    return {"status": "ok", "jobs": len(request.app.state.service.jobs),
            "version": request.app.version}


@router.get("/metrics", summary="Prometheus text exposition",
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request):
    m = request.app.state.metrics
    return Response(m.render(), media_type=m.content_type)
