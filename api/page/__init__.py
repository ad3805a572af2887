"""The operators' live cluster page (see api/page/routes.py and docs/operators.md)."""
from __future__ import annotations

from fastapi import FastAPI


def register(app: FastAPI) -> None:
    from api.page.routes import data, shell
    app.include_router(shell)
    app.include_router(data)
