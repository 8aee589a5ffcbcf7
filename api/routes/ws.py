"""``/v1/ws``: the WebSocket endpoint (protocol in :mod:`api.ws_protocol`, docs/api.md)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from ..ws import Session

router = APIRouter()


@router.websocket("/v1/ws")
async def websocket(ws: WebSocket) -> None:
    await Session(ws, ws.app.state.logbus).run()
