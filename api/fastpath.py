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
from collections.abc import Awaitable
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.forwarding import ROUTES, direct_route
from core_log.errors import ErrorCode, LogbusError

from . import guard, quota_gate, records, streams
from .access import IDENTITY_KEY, Access, require_transactional
from .admission import Admissions
from .budgets import RETRY_AFTER_S, BodyGuard, Budgets, ByteBudget, budget_exhausted
from .connections import (
    BUILT_FIELDS_KEY,
    WHOLE_ANSWERS_KEY,
    WHOLE_BODY_KEY,
    WholeCycle,
    field_passes,
)
from .guard import BrowserPolicy
from .params import PARTITION_MAX
from .problems import PROBLEM_JSON, payload_too_large, problem_bytes
from .records import BodyChunks, ClientDisconnected, WholeBody
from .settings import Settings
from .state import AppState

log = logging.getLogger("logbus.api")

_TOPIC_RECORDS = re.compile(r"^/v1/topics/([^/]+)/records$")
# Plain digits only (no sign, no leading zero); anything else goes to FastAPI, which says 400.
_PARTITION_RECORDS = re.compile(r"^/v1/topics/([^/]+)/partitions/(0|[1-9][0-9]{0,9})/records$")


# Answers larger than this are handed to the socket in slices of this size.
SEND_CHUNK_BYTES = 1024 * 1024


class FastPath:
    """The front door: the browser checks (:mod:`api.guard`) for every request, then every HTTP
    request passes its :class:`BodyGuard`; produce and fetch are served here, everything else
    in FastAPI."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        budgets: Budgets,
        policy: BrowserPolicy | None = None,
    ) -> None:
        self.app = app
        self.budgets = budgets
        self.policy = policy
        self.state: AppState | None = None  # set by the app's lifespan
        self.access = Access(settings.auth)  # its security is set by the app's lifespan
        self.admissions = Admissions()
        self._guarded = BodyGuard(self._route, budgets.body, settings.max_request_bytes)
        self._max_body = settings.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        served = scope["type"] in ("http", "websocket")  # not the lifespan
        if self.policy is not None and served:
            verdict = self.policy.check_scope(scope)
            if verdict.status:
                await guard.refuse(scope, send, verdict)
                return
            if verdict.headers:
                send = guard.with_headers(send, verdict.headers)
        state = self.state
        access = self.access
        # A repeated HTTP request is admitted by one lookup (api.admission) when auth or a
        # quota is on; the others, and every first sight, take the long way.
        known = None
        security = access.security if access.enabled else None
        remembers = (
            state is not None
            and scope["type"] == "http"
            and (security is not None if access.enabled else state.quotas.active)
        )
        if remembers:
            assert state is not None
            known = self.admissions.find(scope, security, state.quotas)
        if known is not None:
            if known.identity is not None:
                scope[IDENTITY_KEY] = known.identity
        elif (
            served
            and access.enabled
            and not access.admit(scope)
            and not await access.check(scope, receive, send)
        ):
            return
        route = _route_header(scope)
        if route not in ROUTES:
            await guard.refuse(scope, send, guard.Verdict(400, _bad_route(route)))
            return
        direct = route == "direct"
        # Set only when it changes: a request's task starts with it unset (False).
        token = direct_route.set(direct) if direct or direct_route.get() else None
        try:
            # HTTP requests pass the body guard; the others go to FastAPI as they are.
            inner = self._enter if scope["type"] == "http" else self.app
            if state is not None and served:
                quotas = state.quotas
                serving = None
                if known is not None:
                    serving = quota_gate.serve_known(
                        quotas, known.meter, known.produce, scope, receive, send, inner
                    )
                elif remembers:
                    self.admissions.learn(scope, security, quotas)
                if serving is None:
                    serving = quota_gate.serve(
                        quotas,
                        scope,
                        receive,
                        send,
                        inner,
                        partitions=state.partition_count,
                        default_fetch_bytes=state.settings.default_fetch_bytes,
                    )
                await serving
            else:
                await inner(scope, receive, send)
        finally:
            if token is not None:
                direct_route.reset(token)

    def _enter(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """An HTTP request's way in: the lean lane for a produce whose whole body came with its
        head, else the body guard and :meth:`_route`.

        The lean lane takes the body from the server's cycle (:class:`WholeCycle`) instead of
        through ``receive``, the body guard and :class:`BodyChunks`, after the guard's own
        checks (its size limit, the body budget, held until the answer is out): a request
        that fails one, or whose body is still coming, or whose ``receive`` something wraps
        (a quota counting the body), takes the guarded way, which answers as it always has.
        Not a coroutine: no frame of its own."""
        # The server's own receive (nothing wraps it) is its cycle's bound method.
        cycle = getattr(receive, "__self__", None)
        state = self.state
        if (
            type(cycle) is not WholeCycle
            or state is None
            or state.proxy is not None
            or scope["method"] != "POST"
            or not state.settings.fast_path
        ):
            return self._guarded(scope, receive, send)
        target = records_target(scope["path"])
        size = cycle.arrived()
        budget = self.budgets.body
        if target is None or not 0 <= size <= self._max_body or not budget.try_reserve(size):
            return self._guarded(scope, receive, send)
        body = WholeBody(cycle.take_body())
        return self._serve(state, scope, body, send, "POST", *target, reserved=size)

    def _route(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """What serves this request: forwarding to another broker, the lean route, or
        FastAPI. Not a coroutine (nor is :meth:`_local`): no frame of its own on the stack
        every step of a produce passes through."""
        state = self.state
        if state is not None and state.proxy is not None:
            return self._maybe_forwarded(state, scope, receive, send)
        return self._local(state, scope, receive, send)

    async def _maybe_forwarded(
        self, state: AppState, scope: Scope, receive: Receive, send: Send
    ) -> None:
        assert state.proxy is not None
        target = await state.proxy.target(scope, direct_route.get())
        if target is None:
            await self._local(state, scope, receive, send)
            return
        try:
            body = await records.read_body(BodyChunks(receive), state.settings.max_request_bytes)
        except ClientDisconnected:
            return
        await state.proxy.forward(scope, body, send, target)

    def _local(
        self, state: AppState | None, scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        if scope["type"] != "http" or state is None or not state.settings.fast_path:
            return self.app(scope, receive, send)
        method: str = scope["method"]
        target = records_target(scope["path"])
        if (
            target is None
            or method not in ("GET", "POST")
            or (method == "GET" and (target[1] is None or _wants_sse(scope)))
        ):
            return self.app(scope, receive, send)
        body = BodyChunks(receive) if method == "POST" else None  # a fetch reads none
        return self._serve(state, scope, body, send, method, *target)

    async def _serve(
        self,
        state: AppState,
        scope: Scope,
        body: records.Body | None,
        send: Send,
        method: str,
        topic: str,
        partition: int | None,
        reserved: int = 0,
    ) -> None:
        """Answer a produce or a fetch; ``reserved``: body-budget bytes the lean lane holds
        for the body (:meth:`_enter`), released once the answer is out."""
        started = time.perf_counter()
        headers = guard.request_headers(scope)
        query = parse_query(scope["query_string"])
        route = "produce" if method == "POST" else "fetch"
        try:
            try:
                if method == "POST":
                    assert body is not None
                    length = headers.get("content-length")
                    limit = state.settings.max_request_bytes
                    if length is not None and length.isdigit() and int(length) > limit:
                        raise payload_too_large(limit)
                    if records.TRANSACTIONAL_ID_HEADER in headers:
                        require_transactional(
                            state.security, scope, headers[records.TRANSACTIONAL_ID_HEADER]
                        )
                    reply = await records.produce(
                        state.broker,
                        state.settings,
                        topic,
                        partition,
                        query,
                        headers,
                        body,
                        state.transactions,
                    )
                else:
                    assert partition is not None
                    accept = headers.get("accept")
                    reply = await self._fetch(state, topic, partition, query, accept)
            except ClientDisconnected:
                return
            except LogbusError as e:
                reply = records.Reply(e.http_status, problem_bytes(e), PROBLEM_JSON)
                if e.code is ErrorCode.BROKER_BUSY or e.http_status == 503:
                    reply.headers["Retry-After"] = str(RETRY_AFTER_S)
            except Exception:
                log.exception("unexpected error on %s %s", method, scope["path"])
                internal = LogbusError("internal error", code=ErrorCode.UNKNOWN_SERVER_ERROR)
                reply = records.Reply(500, problem_bytes(internal), PROBLEM_JSON)
            budget = self.budgets.response
            assert isinstance(reply.body, bytes)  # the fast path's answers are whole
            size = len(reply.body)
            if WHOLE_ANSWERS_KEY in scope and size <= SEND_CHUNK_BYTES and budget.try_reserve(size):
                try:  # the server takes the whole answer in one message
                    await send(_whole_start(reply))
                finally:
                    budget.release(size)
            else:
                await send_budgeted(send, reply, budget)
        finally:
            if reserved:
                self.budgets.body.release(reserved)
        state.metrics.observe(
            route,
            method,
            topic,
            reply.status,
            time.perf_counter() - started,
            reply.records,
            reply.size_bytes,
        )

    async def _fetch(
        self,
        state: AppState,
        topic: str,
        partition: int,
        query: dict[str, str],
        accept: str | None,
    ) -> records.Reply:
        """A fetch that reads only if the answers in flight leave room for ``max_bytes``.

        A fetch that answers at once holds ``max_bytes`` of the budget while it reads (20
        clients asking for 64 MiB at the same moment must not all read it); a long-poll that
        will wait holds nothing while it waits (500 of them would otherwise fill the budget).
        """
        settings = state.settings
        budget = self.budgets.response
        wanted = records.int_param(
            query, "max_bytes", settings.default_fetch_bytes, 1, settings.max_fetch_bytes
        )
        hold = wanted if _answers_at_once(state, topic, partition, query) else 0
        if not budget.fits(wanted) or not budget.try_reserve(hold):
            raise budget_exhausted(budget)
        try:
            return await records.fetch(state.broker, settings, topic, partition, query, accept)
        finally:
            budget.release(hold)


def _answers_at_once(state: AppState, topic: str, partition: int, query: dict[str, str]) -> bool:
    """No wait asked for, or records already there at the offset."""
    if query.get("wait_ms", "0") == "0":
        return True
    offset = query.get("offset", "")
    try:
        hw = state.broker.reader(topic, partition).high_watermark
    except LogbusError:
        return True  # the fetch answers the error at once
    return offset.isdigit() and len(offset) < 20 and int(offset) < hw


def records_target(path: str) -> tuple[str, int | None] | None:
    """The topic and partition (None: the topic's records) of a records path, else None."""
    if (m := _PARTITION_RECORDS.match(path)) and int(m[2]) <= PARTITION_MAX:
        return m[1], int(m[2])
    if m := _TOPIC_RECORDS.match(path):
        return m[1], None
    return None


def _route_header(scope: Scope) -> str:
    """The request's Logbus-Route (``forward`` when absent)."""
    if scope["type"] not in ("http", "websocket"):
        return "forward"
    raw = guard.request_headers(scope).get("logbus-route")
    return "forward" if raw is None else raw.strip().lower()


def _bad_route(route: str) -> LogbusError:
    return LogbusError(
        f"Logbus-Route must be one of {', '.join(ROUTES)}; got {route[:64]!r}",
        code=ErrorCode.INVALID_REQUEST,
    )


def _wants_sse(scope: Scope) -> bool:
    """SSE streams are served by the FastAPI route (a streaming response)."""
    accept = next((v for k, v in scope["headers"] if k == b"accept"), None)
    return accept is not None and streams.wants_sse(accept.decode("latin-1"))


def parse_query(raw: bytes) -> dict[str, str]:
    """The query string as ``parse_qsl(keep_blank_values=True)`` reads it, the last of a
    repeated name winning; split by hand when nothing is escaped (``acks=1``: 1 µs, not 7)."""
    text = raw.decode("latin-1")
    if "%" in text or "+" in text:
        return dict(parse_qsl(text, keep_blank_values=True))
    query: dict[str, str] = {}
    for part in text.split("&"):
        if part:
            name, _, value = part.partition("=")
            query[name] = value
    return query


async def send_budgeted(send: Send, reply: records.Reply, budget: ByteBudget) -> None:
    """Send ``reply`` if the answers in flight leave room for it, else 503 + Retry-After."""
    assert isinstance(reply.body, bytes)
    size = len(reply.body)
    if not budget.try_reserve(size):
        error = budget_exhausted(budget)
        reply = records.Reply(
            503,
            problem_bytes(error),
            PROBLEM_JSON,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
        await send_reply(send, reply)
        return
    try:
        await send_reply(send, reply)
    finally:
        budget.release(size)


def _start(reply: records.Reply) -> dict[str, Any]:
    """The ``http.response.start`` message of ``reply``."""
    assert isinstance(reply.body, bytes)
    raw: list[tuple[bytes, bytes]] = [
        (b"content-type", reply.content_type.encode()),
        (b"content-length", str(len(reply.body)).encode()),
        *_own_fields(reply),
    ]
    return {"type": "http.response.start", "status": reply.status, "headers": raw}


def _own_fields(reply: records.Reply) -> list[tuple[bytes, bytes]]:
    """The fields ``reply`` names itself (Retry-After, Logbus-*), as ASGI's byte pairs."""
    if not reply.headers:
        return []
    return [(k.lower().encode(), v.encode()) for k, v in reply.headers.items()]


def _whole_start(reply: records.Reply) -> dict[str, Any]:
    """``reply`` as one start message that carries its body, for a server that takes whole
    answers (the broker's, :class:`WholeCycle`, which adds the Content-Length): its
    Content-Type among the fields the broker built."""
    raw = _own_fields(reply)
    built = _CONTENT_TYPES.get(reply.content_type)
    if built is None:
        built = _content_type_field(reply.content_type)
    if not built:
        raw.append((b"content-type", reply.content_type.encode()))  # uvicorn checks it
    return {
        "type": "http.response.start",
        "status": reply.status,
        "headers": raw,
        BUILT_FIELDS_KEY: [*built],
        WHOLE_BODY_KEY: reply.body,
    }


# An answer's Content-Type (the broker's own media types) → its field, checked once: at most
# this many remembered.
CONTENT_TYPES_MAX = 64
_CONTENT_TYPES: dict[str, tuple[tuple[bytes, bytes], ...]] = {}


def _content_type_field(content_type: str) -> tuple[tuple[bytes, bytes], ...]:
    """The Content-Type field of ``content_type`` as a built field (empty: it fails
    uvicorn's check, so it goes with the checked fields, to be refused there)."""
    value = content_type.encode()
    field = ((b"content-type", value),) if field_passes(b"content-type", value) else ()
    if len(_CONTENT_TYPES) >= CONTENT_TYPES_MAX:
        _CONTENT_TYPES.clear()
    _CONTENT_TYPES[content_type] = field
    return field


async def send_reply(send: Send, reply: records.Reply) -> None:
    """Send ``reply`` as ASGI's two messages (a large body in slices)."""
    await send(_start(reply))
    body = reply.body
    assert isinstance(body, bytes)
    if len(body) <= SEND_CHUNK_BYTES:
        await send({"type": "http.response.body", "body": body})
        return
    # In slices: the transport copies only what the socket does not take at once, and
    # uvicorn waits for it to drain between slices, so a slow reader never makes the broker
    # hold the answer twice.
    view = memoryview(body)
    for at in range(0, len(body), SEND_CHUNK_BYTES):
        piece = view[at : at + SEND_CHUNK_BYTES]
        more = at + SEND_CHUNK_BYTES < len(body)
        await send({"type": "http.response.body", "body": piece, "more_body": more})
