"""HTTP requests that another broker must answer, passed on to it: any broker serves them all.

A partition's produce and fetch are forwarded inside the cluster layer (:mod:`cluster.forwarding`,
record batches over the brokers' h2c link). Two kinds of calls belong to one broker as a whole
and are forwarded here instead, as the HTTP request they are:

* **group calls** (``/v1/groups/{group}/…``) go to the group's coordinator, the leader of the
  group's ``__consumer_offsets`` partition, which holds the group's members in memory;
* **admin changes** (create and delete a topic, add partitions, alter configs, reassign or
  cancel a partition's replicas, drain a broker) go to the broker holding the controller
  lease, which places replicas and drives the change on every broker.

The forwarded request carries ``Logbus-Forwarded-By``, so the target answers it itself and a
request never travels twice (a target that no longer coordinates the group answers 421
``NOT_COORDINATOR``, retriable, which the client receives); the partitions a group poll reads
are still reached through the cluster layer wherever they are led. The answer is streamed back as it
comes (a member's long-poll or SSE stream included). A client that routes itself sends
``Logbus-Route: direct`` and is answered where it asked.

Limits: the body is the front door's (already capped by :class:`api.budgets.BodyGuard`); the
answer is streamed, never held; a target that does not answer within ``max_wait_ms`` + 30 s is
given up (504), one that cannot be reached answers 503 (retriable).
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from starlette.types import Scope, Send

from cluster.broker import Broker
from cluster.interbroker import HEADER as CREDENTIAL_HEADER
from core_log.errors import ErrorCode, LogbusError

from . import guard
from .access import identity_of
from .security import PRINCIPAL_HEADER, PRINCIPAL_TOPICS_HEADER, Security

_GROUP = re.compile(r"^/v1/groups/([^/]+)(?:/.*)?$")
_MEMBER_SSE = re.compile(r"^/v1/groups/[^/]+/members/[^/]+/records/?$")
_ADMIN = (
    ("POST", re.compile(r"^/v1/topics/?$")),
    ("DELETE", re.compile(r"^/v1/topics/[^/]+/?$")),
    ("PATCH", re.compile(r"^/v1/topics/[^/]+/configs/?$")),
    ("POST", re.compile(r"^/v1/topics/[^/]+/partitions/?$")),
    ("PUT", re.compile(r"^/v1/topics/[^/]+/partitions/[^/]+/replicas/?$")),
    ("DELETE", re.compile(r"^/v1/topics/[^/]+/partitions/[^/]+/replicas/?$")),
    ("POST", re.compile(r"^/v1/cluster/brokers/[^/]+/drain/?$")),
)
# Request headers passed on (the rest are the hop's own or the front door's).
_PASSED = {
    b"content-type",
    b"accept",
    b"idempotency-key",
    b"last-event-id",
    b"user-agent",
    b"authorization",
}
# Answer headers not passed back: this hop frames the answer itself.
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"server", b"date"}
FORWARDED_BY = b"logbus-forwarded-by"
CONNECT_TIMEOUT_S = 5.0
READ_MARGIN_S = 30.0  # past the longest wait a client may ask for (max_wait_ms)
MAX_CONNECTIONS = 64  # to all other brokers together: forwarded calls are the rare kind
SSE_RESUME_S = 30.0  # a member stream waits this long for a new coordinator (a failover: ~2-10 s)
SSE_BACKOFF_S = (0.1, 1.0)
_ERROR_EVENT = b"event: error\ndata: "


@dataclass(frozen=True)
class Target:
    broker_id: int
    url: str
    role: str  # "coordinator" or "controller", for the error when it is unreachable


class Proxy:
    def __init__(
        self,
        broker: Broker,
        max_wait_ms: int,
        security: Security | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: how to reach peers whose client listener serves TLS (their CA, and this
        broker's certificate to present where they require one)."""
        self.broker = broker
        self.security = security
        self.client = httpx.AsyncClient(
            verify=tls if tls is not None else True,
            timeout=httpx.Timeout(
                CONNECT_TIMEOUT_S, read=max_wait_ms / 1000 + READ_MARGIN_S, pool=CONNECT_TIMEOUT_S
            ),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def target(self, scope: Scope, direct: bool) -> Target | None:
        """The broker that must answer this request, when it is another one."""
        broker = self.broker
        if direct or broker.replicas is None or _forwarded(scope):
            return None
        path: str = scope["path"]
        method: str = scope["method"]
        if m := _GROUP.match(path):
            coordinator = broker.coordinator_of(m[1])
            if coordinator < 0 and _MEMBER_SSE.match(path) and _wants_sse(scope):
                return Target(-1, "", "coordinator")  # none now: the stream waits for one
            return self._other(coordinator, "coordinator")
        if any(method == verb and rx.match(path) for verb, rx in _ADMIN):
            ctl = await asyncio.to_thread(broker.store.controller)
            return self._other(ctl.broker_id if ctl and ctl.alive else -1, "controller")
        return None

    def _other(self, broker_id: int, role: str) -> Target | None:
        replicas = self.broker.replicas
        if broker_id == self.broker.config.broker_id or replicas is None:
            return None
        meta = replicas.brokers.get(broker_id)
        if meta is None:  # none known now: answer here (the call itself says what is wrong)
            return None
        return Target(broker_id, meta.base_url, role)

    def inter_broker_headers(self, scope: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
        """With authentication on: the cluster credential and the principal asking (the
        target trusts the one only with the other; :mod:`api.access`)."""
        credential = self.security.credential if self.security is not None else None
        value = credential.value() if credential is not None else None
        if value is None:
            return []
        identity = identity_of(scope)
        headers = [
            (CREDENTIAL_HEADER.encode(), value.encode()),
            (PRINCIPAL_HEADER.encode(), identity.principal.encode()),
        ]
        if identity.topics is not None:  # a scoped token: the target limits it the same
            topics = ",".join(sorted(identity.topics)).encode()
            headers.append((PRINCIPAL_TOPICS_HEADER.encode(), topics))
        return headers

    async def ask(
        self,
        base_url: str,
        path: str,
        params: dict[str, str],
        timeout_s: float,
        scope: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """A GET answered by the broker at ``base_url`` itself (``Logbus-Route: direct``,
        marked forwarded so it never travels on), within ``timeout_s`` in all, on behalf of
        the principal of ``scope``; raises :class:`httpx.HTTPError`
        (:class:`httpx.TimeoutException` when it ran out)."""
        headers = {
            FORWARDED_BY.decode(): str(self.broker.config.broker_id),
            "logbus-route": "direct",
        }
        for k, v in self.inter_broker_headers(scope or {}):
            headers[k.decode()] = v.decode()
        async with asyncio.timeout(timeout_s):
            try:
                return await self.client.get(
                    base_url + path, params=params, headers=headers, timeout=timeout_s
                )
            except TimeoutError:
                raise httpx.TimeoutException(f"no answer within {timeout_s} s") from None

    async def forward(self, scope: Scope, body: bytes, send: Send, target: Target) -> None:
        if _MEMBER_SSE.match(scope["path"]) and scope["method"] == "GET" and _wants_sse(scope):
            await MemberStream(self, scope, send).run(target)
            return
        query = _without_token(scope.get("query_string", b""))
        url = target.url + scope["path"] + (f"?{query.decode('latin-1')}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k in _PASSED]
        headers.append((FORWARDED_BY, str(self.broker.config.broker_id).encode()))
        headers.extend(self.inter_broker_headers(scope))
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TimeoutException:
            await _refuse(scope, send, _unreachable(target, "did not answer in time"), 504)
            return
        except httpx.HTTPError as e:
            await _refuse(scope, send, _unreachable(target, str(e) or type(e).__name__), 503)
            return
        try:
            if target.role == "controller" and response.is_success:
                # The change is in the store: know it here before the client's next call.
                await self.broker.refresh_metadata()
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
            out.append((b"logbus-forwarded-to", str(target.broker_id).encode()))
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": out}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except httpx.HTTPError:
            pass  # the answer was under way: the client sees it cut short (no second status)
        finally:
            await response.aclose()


class MemberStream:
    """A member's SSE stream passed on from its coordinator, and resumed at the next one.

    When the coordinator dies (the stream is cut), hands the group over (its last event is a
    retriable ``error``, e.g. ``NOT_COORDINATOR``) or is not there yet (a connection refused,
    503 ``COORDINATOR_LOAD_IN_PROGRESS``, 421), the stream asks the coordinator named then,
    after 100 ms doubling to 1 s, and goes on in the same response: the client sees nothing
    of it (a retriable ``error`` event a stream ends with is not passed on). Membership is
    persisted with the offsets, so the new coordinator knows the member; it reads on from the
    committed offsets (at least once). Positions are not persisted, so the new coordinator
    delivers again what was not committed.
    It gives up, with an ``error`` event, after ``SSE_RESUME_S`` without a coordinator."""

    def __init__(self, proxy: Proxy, scope: Scope, send: Send) -> None:
        self.proxy = proxy
        self.scope = scope
        self.send = send
        self.group = _GROUP.match(scope["path"])[1]  # type: ignore[index]
        self.started = False

    async def run(self, target: Target) -> None:
        backoff = SSE_BACKOFF_S[0]
        failing_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            problem = await self._once(target)
            if problem is None:
                return  # ended as the coordinator ended it: with the client's last word
            now = loop.time()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= SSE_RESUME_S:
                await self._end(problem)
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, SSE_BACKOFF_S[1])
            target = self._coordinator() or target
            if problem.get("_answered"):
                failing_since = None  # it streamed a while: a new episode next time

    def _coordinator(self) -> Target | None:
        broker = self.proxy.broker
        cid = broker.coordinator_of(self.group)
        url = broker.broker_url(cid) if cid >= 0 else None
        return Target(cid, url, "coordinator") if url is not None else None

    async def _once(self, target: Target) -> dict[str, Any] | None:
        """One upstream stream; None when it ended for good, else why to try again."""
        if not target.url:
            return {"code": "COORDINATOR_NOT_AVAILABLE", "detail": "no coordinator now"}
        scope, client = self.scope, self.proxy.client
        query = _without_token(scope.get("query_string", b""))
        url = target.url + scope["path"] + (f"?{query.decode('latin-1')}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k in _PASSED]
        headers.append((FORWARDED_BY, str(self.proxy.broker.config.broker_id).encode()))
        headers.extend(self.proxy.inter_broker_headers(scope))
        try:
            request = client.build_request("GET", url, headers=headers)
            response = await client.send(request, stream=True)
        except httpx.HTTPError as e:
            return {"code": "COORDINATOR_NOT_AVAILABLE", "detail": str(e) or type(e).__name__}
        try:
            if response.status_code != 200:
                await response.aread()
                doc = _problem(response.content)
                if doc.get("retriable") is True:
                    return doc
                await self._pass_answer(response, target)
                return None
            if not self.started:
                self.started = True
                out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
                out.append((b"logbus-forwarded-to", str(target.broker_id).encode()))
                await self.send({"type": "http.response.start", "status": 200, "headers": out})
            held = b""  # a stream's error event is held until the stream goes on or ends
            async for chunk in response.aiter_raw():
                if held:
                    await self._body(held)
                    held = b""
                at = chunk.rfind(_ERROR_EVENT)
                if at >= 0:
                    chunk, held = chunk[:at], chunk[at:]
                if chunk:
                    await self._body(chunk)
            last = _last_error(held)
            if last is not None and last.get("retriable") is True:
                return {**last, "_answered": True}  # the client need not hear of it
            if held:
                await self._body(held)
            await self.send({"type": "http.response.body", "body": b""})
            return None
        except httpx.HTTPError as e:  # cut: the coordinator died under the stream
            return {
                "code": "COORDINATOR_NOT_AVAILABLE",
                "detail": str(e) or type(e).__name__,
                "_answered": True,
            }
        finally:
            await response.aclose()

    async def _body(self, chunk: bytes) -> None:
        await self.send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def _pass_answer(self, response: httpx.Response, target: Target) -> None:
        if self.started:  # an answer that is no stream, inside the stream: as an event
            await self._end(_problem(response.content))
            return
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
        out.append((b"logbus-forwarded-to", str(target.broker_id).encode()))
        await self.send(
            {"type": "http.response.start", "status": response.status_code, "headers": out}
        )
        await self.send({"type": "http.response.body", "body": response.content})

    async def _end(self, problem: dict[str, Any]) -> None:
        problem = {k: v for k, v in problem.items() if not k.startswith("_")}
        if not self.started:
            error = LogbusError(
                f"group {self.group!r}: no coordinator could serve the stream: "
                f"{problem.get('detail', '')}",
                code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
            )
            await _refuse(self.scope, self.send, error, 503)
            return
        event = b"event: error\ndata: %s\n\n" % orjson.dumps(problem)
        await self.send({"type": "http.response.body", "body": event})


def _problem(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _last_error(held: bytes) -> dict[str, Any] | None:
    """The problem of the ``error`` event a stream ended with, if it did."""
    if not held.startswith(_ERROR_EVENT):
        return None
    line = held[len(_ERROR_EVENT) :].split(b"\n", 1)[0]
    doc = _problem(line)
    return doc or None


def _wants_sse(scope: Scope) -> bool:
    accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
    return b"text/event-stream" in accept.lower()


def _without_token(query: bytes) -> bytes:
    """The query string without a scoped ``token``: this broker checked it, the target trusts
    the cluster credential, and a URL with a token must not reach any HTTP client's log."""
    if b"token=" not in query:
        return query
    return b"&".join(p for p in query.split(b"&") if not p.startswith(b"token="))


def _forwarded(scope: Scope) -> bool:
    return any(k == FORWARDED_BY for k, _ in scope["headers"])


def _unreachable(target: Target, why: str) -> LogbusError:
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if target.role == "controller":
        code = ErrorCode.NETWORK_EXCEPTION
    return LogbusError(
        f"the {target.role}, broker {target.broker_id} at {target.url}, could not be reached: "
        f"{why}; retry",
        code=code,
        broker_id=target.broker_id,
    )


async def _refuse(scope: Scope, send: Send, error: LogbusError, status: int) -> None:
    error.http_status_override = status  # the body says the status the answer has
    await guard.refuse(scope, send, guard.Verdict(status, error))
