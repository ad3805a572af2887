"""Tokens and the checks every route runs before it reads a body.

Two kinds of bearer token: the operator's admin token (given at start-up) and one worker
token per job, `<job id>.<secret>`, handed out once at registration and stored hashed.
A route declares what it needs with `openapi_extra={"x-auth": "admin" | "job"}`;
`AuthRoute` checks it before FastAPI parses the body, so an unauthenticated request gets
401/403 whatever it carries. Missing or unknown token: 401. A valid token that may not do
this (a worker token on an admin route, or on another job): 403.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Callable, Optional

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer

bearer = HTTPBearer(auto_error=False, description="admin token, or the job's worker token")


def new_worker_token(job_id: str) -> str:
    return f"{job_id}.{secrets.token_urlsafe(24)}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(header: Optional[str]) -> Optional[str]:
    """The token of an Authorization header's value; None without one."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


class Auth:
    def __init__(self, admin_token: str, job_token_hash: Callable[[str], Optional[str]]):
        self._admin = admin_token
        self._job_token_hash = job_token_hash  # job id -> stored hash, None if unknown

    def is_admin(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._admin.encode())

    def worker_job(self, token: str) -> Optional[str]:
        """The job a worker token belongs to, if it is a valid one."""
        job_id, dot, _ = token.partition(".")
        if not dot:
            return None
        stored = self._job_token_hash(job_id)
        if stored is None or not hmac.compare_digest(stored, hash_token(token)):
            return None
        return job_id

    def check(self, request: Request, need: str) -> str:
        """Raise 401/403 unless the request's token may act; return "admin" or "worker"."""
        return self.role(bearer_token(request.headers.get("authorization")), need,
                         request.path_params.get("job_id"))

    def role(self, token: Optional[str], need: str, job_id: Optional[str]) -> str:
        """"admin" or "worker" if `token` may act on a route needing `need` ("admin" or
        "job") for job `job_id`, else HTTPException 401/403. The routes (AuthRoute) and
        the fast path (api/fastpath.py, which passes a refused request on) both ask here."""
        if token is None:
            raise HTTPException(401, "missing bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        if self.is_admin(token):
            return "admin"
        job = self.worker_job(token)
        if job is None:
            raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
        if need == "admin":
            raise HTTPException(403, "this needs the admin token; a worker token cannot do it")
        if job != job_id:
            raise HTTPException(403, "this token belongs to another job")
        return "worker"


class AuthRoute(APIRoute):
    """An APIRoute that checks `x-auth` before the body is read or validated."""

    def get_route_handler(self) -> Callable:
        inner = super().get_route_handler()
        need = (self.openapi_extra or {}).get("x-auth")
        if need is None:
            return inner

        async def handler(request: Request):
            request.state.role = request.app.state.auth.check(request, need)
            return await inner(request)

        return handler


ADMIN = {"x-auth": "admin"}
JOB = {"x-auth": "job"}
