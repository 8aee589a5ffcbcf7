"""A broker app in this process, served through httpx's ASGI transport with its lifespan.

For tests that inject faults into the broker's storage (a file layer that fails, a metadata
store that reports a full disk), which a child process cannot be made to do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from api.app import create_app
from api.settings import Settings
from api.state import AppState


@asynccontextmanager
async def app_client(
    data_dir: Path, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, AppState]]:
    """(client, app state) of a started app on ``data_dir``; stopped (cleanly) on exit."""
    config = Settings(data_dir=data_dir, **settings)
    fast = create_app(config)
    app = fast.app
    assert isinstance(app, FastAPI)
    async with app.router.lifespan_context(app):
        state: AppState = app.state.logbus
        transport = httpx.ASGITransport(app=fast, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url=f"http://127.0.0.1:{config.port}", timeout=30.0
        ) as client:
            yield client, state
