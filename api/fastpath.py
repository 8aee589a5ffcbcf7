"""The lean route for produce and fetch: raw ASGI in front of FastAPI.

FastAPI costs ≈ 60-80 µs per request before any work (PERFORMANCE-NOTES); raw ASGI ≈ 20 µs.
Produce and fetch are the hot paths, so this middleware answers them itself and passes every
other request to FastAPI. The same paths are declared as FastAPI routes (for the OpenAPI
document, and as a fallback with ``fast_path=False``); both call :mod:`api.records`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from core_log.errors import ErrorCode, LogbusError

from . import records, streams
from .problems import PROBLEM_JSON, payload_too_large, problem_bytes
from .state import AppState

log = logging.getLogger("logbus.api")

_TOPIC_RECORDS = re.compile(r"^/v1/topics/([^/]+)/records$")
_PARTITION_RECORDS = re.compile(r"^/v1/topics/([^/]+)/partitions/(\d{1,9})/records$")


class ClientDisconnected(Exception):
    pass


async def body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


class FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: AppState | None = None  # set by the app's lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        if scope["type"] != "http" or state is None or not state.settings.fast_path:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        topic: str | None = None
        partition: int | None = None
        if m := _PARTITION_RECORDS.match(path):
            topic, partition = m[1], int(m[2])
        elif m := _TOPIC_RECORDS.match(path):
            topic = m[1]
        if (
            topic is None
            or method not in ("GET", "POST")
            or (method == "GET" and (partition is None or _wants_sse(scope)))
        ):
            await self.app(scope, receive, send)
            return
        await self._serve(state, scope, receive, send, method, topic, partition)

    async def _serve(
        self,
        state: AppState,
        scope: Scope,
        receive: Receive,
        send: Send,
        method: str,
        topic: str,
        partition: int | None,
    ) -> None:
        started = time.perf_counter()
        headers = _headers(scope)
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        route = "produce" if method == "POST" else "fetch"
        try:
            if method == "POST":
                length = headers.get("content-length")
                limit = state.settings.max_request_bytes
                if length is not None and length.isdigit() and int(length) > limit:
                    raise payload_too_large(limit)
                reply = await records.produce(
                    state.broker,
                    state.settings,
                    topic,
                    partition,
                    query,
                    headers,
                    body_chunks(receive),
                )
            else:
                assert partition is not None
                reply = await records.fetch(
                    state.broker, state.settings, topic, partition, query, headers.get("accept")
                )
        except ClientDisconnected:
            return
        except LogbusError as e:
            reply = records.Reply(e.http_status, problem_bytes(e), PROBLEM_JSON)
        except Exception:
            log.exception("unexpected error on %s %s", method, scope["path"])
            internal = LogbusError("internal error", code=ErrorCode.UNKNOWN_SERVER_ERROR)
            reply = records.Reply(500, problem_bytes(internal), PROBLEM_JSON)
        await send_reply(send, reply)
        state.metrics.observe(
            route,
            method,
            topic,
            reply.status,
            time.perf_counter() - started,
            reply.records,
            reply.size_bytes,
        )


def _wants_sse(scope: Scope) -> bool:
    """SSE streams are served by the FastAPI route (a streaming response)."""
    accept = next((v for k, v in scope["headers"] if k == b"accept"), None)
    return accept is not None and streams.wants_sse(accept.decode("latin-1"))


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def send_reply(send: Send, reply: records.Reply) -> None:
    assert isinstance(reply.body, bytes)
    raw: list[tuple[bytes, bytes]] = [
        (b"content-type", reply.content_type.encode()),
        (b"content-length", str(len(reply.body)).encode()),
    ]
    raw.extend((k.lower().encode(), v.encode()) for k, v in reply.headers.items())
    start: dict[str, Any] = {"type": "http.response.start", "status": reply.status, "headers": raw}
    await send(start)
    await send({"type": "http.response.body", "body": reply.body})
