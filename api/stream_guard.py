"""Server-Sent Events streams end when their credential or their rights do.

An SSE response is one long request: the access check ran once, at its start. A WebSocket
re-checks on every security change (:meth:`api.ws.Session._recheck`); this does the same for
an SSE stream. :func:`guarded` wraps the stream's body: after every security snapshot the
broker applies (the metadata store's change reaches every broker within a poll, 250 ms) and
when a scoped token or JWT expires, it checks that the credential still holds and that every
resource the stream reads may still be read. If not, the stream sends one ``error`` event
carrying the 401 or 403 problem and ends. A browser's ``EventSource`` then reconnects with the
same credential, is answered 401/403 and stops for good (it reconnects only after a stream
that ended, not after an error status).

The wait for the next chunk and the revocation race each other, so a stream parked on a quiet
partition (up to ``KEEPALIVE_S``) is closed within the poll, not at its next record. Without
authentication the body is returned as it is: no task per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from auth_quotas.acl import Resource
from auth_quotas.credentials import Identity
from core_log.errors import LogbusError

from .problems import problem_body
from .security import Security, refusal
from .streams import sse_event


def guarded(
    body: AsyncIterator[bytes],
    security: Security | None,
    identity: Identity,
    reads: Callable[[], Iterable[Resource]],
) -> AsyncIterator[bytes]:
    """``body``, ended by an ``error`` event when ``identity`` may no longer read
    ``reads()`` (called after each security change)."""
    if security is None or not security.enabled:
        return body
    return _guarded(body, security, identity, reads)


async def _guarded(
    body: AsyncIterator[bytes],
    security: Security,
    identity: Identity,
    reads: Callable[[], Iterable[Resource]],
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[LogbusError] = loop.create_future()

    def recheck() -> None:
        if stopped.done():
            return
        refused = refusal(security, identity, reads())
        if refused is not None:
            stopped.set_result(refused)

    security.listeners.add(recheck)
    expiry: asyncio.TimerHandle | None = None
    if identity.expires_ms is not None:
        delay_s = max(0.0, (identity.expires_ms - security.now_ms()) / 1000)
        expiry = loop.call_later(delay_s + 0.001, recheck)
    step: asyncio.Task[bytes] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(body))
            await asyncio.wait((step, stopped), return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                yield sse_event("error", problem_body(stopped.result()))
                return
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield chunk
    finally:
        security.listeners.discard(recheck)
        if expiry is not None:
            expiry.cancel()
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
