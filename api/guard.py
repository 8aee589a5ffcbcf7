"""What a browser may do with a broker: Host, Origin, Content-Type and CORS checks.

Theory of operation
-------------------
A broker on 127.0.0.1 is reachable from every web page its operator opens. Three holes, three
checks, made once per request in front of every route (the fast path and FastAPI alike):

* **DNS rebinding**: a page on ``evil.example`` re-points its name to 127.0.0.1 and then talks
  to the broker as its own origin — only the ``Host`` header still says ``evil.example:8080``.
  So Host must name this broker: for a loopback bind ``127.0.0.1``, ``localhost`` or ``[::1]``
  with the port; for another address, that address; plus ``allowed_hosts``. (A wildcard bind,
  0.0.0.0, cannot know its names: any Host, unless ``allowed_hosts`` is set.) 400 otherwise.
* **Cross-origin requests**: a page may open a WebSocket or an EventSource to any origin, and
  send "simple" POSTs without asking. Browsers say who asks in ``Origin``; a request carrying one
  must come from this broker's own origin (its Host) or from ``allowed_origins``. 403 otherwise,
  for every method, before any work. Clients that are not browsers send no Origin.
* **No-cors bodies**: the only bodies a page can send without a CORS preflight are text/plain,
  form-encoded and multipart — or none typed at all, which FastAPI read as JSON. A body must be
  typed as one of :data:`BODY_TYPES` (415 otherwise), none of which a page can send unasked.

Origins in ``allowed_origins`` get CORS: a preflight ``OPTIONS`` is answered here (204 with the
``Access-Control-*`` headers), and answers carry ``Access-Control-Allow-Origin`` and expose the
``Logbus-*`` position headers. ``*`` in either list accepts anything (not for loopback brokers
on a desktop).

:class:`BrowserPolicy` is the decision (values in, :class:`Verdict` out); :func:`refuse` and
:func:`with_headers` are the ASGI side, called by :class:`api.fastpath.FastPath`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.types import Message, Scope, Send

from core_log.errors import ErrorCode, LogbusError

from .problems import PROBLEM_JSON, problem_bytes

JSON = "application/json"
NDJSON = "application/x-ndjson"
BATCH = "application/vnd.logbus.batch"
OCTETS = "application/octet-stream"
# Request body types: none is a CORS-safelisted type, so a page cannot send them unasked.
BODY_TYPES = (JSON, NDJSON, BATCH, OCTETS)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
CORS_METHODS = "GET, POST, PATCH, DELETE"
CORS_HEADERS = (
    "Authorization, Content-Type, Accept, Idempotency-Key, Last-Event-ID, Logbus-Key, "
    "Logbus-Producer-Id, Logbus-Producer-Epoch, Logbus-Sequence, Logbus-Route"
)
CORS_EXPOSE = (
    "Location, Retry-After, Logbus-Next-Offset, Logbus-High-Watermark, Logbus-Log-Start-Offset, "
    "Logbus-Lag, Logbus-Duplicate, Logbus-Record-Count, Logbus-Generation, Logbus-Rebalance"
)
CORS_MAX_AGE_S = 600  # browsers cap it (Chromium: 2 h); 10 min re-checks a changed allow-list
HOST_CACHE_MAX = 256  # distinct Host values remembered (a client sends the same one each time)
CLOSE_FORBIDDEN = 4403  # a WebSocket refused before accept: the client sees HTTP 403
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True)
class Verdict:
    """``status`` 0: go on (adding ``headers`` to the answer); else answer with ``error``
    (or, for a preflight, 204 with ``headers``)."""

    status: int = 0
    error: LogbusError | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


PASS = Verdict()


def _authority(host: str, port: int | None) -> str:
    host = host.lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return host if port is None else f"{host}:{port}"


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (``name``, ``name:port``, ``[v6]:port``) → (name, port); None if bad."""
    try:
        parts = urlsplit(f"//{value.strip()}")
        return (parts.hostname or "", parts.port) if parts.hostname else None
    except ValueError:
        return None


class BrowserPolicy:
    """The decision for one request, from the bound address and the two allow-lists."""

    def __init__(
        self,
        host: str,
        port: int,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.port = port
        hosts = [h.strip().lower() for h in allowed_hosts if h.strip()]
        self.any_host = "*" in hosts or (not hosts and _is_wildcard(host))
        names = list(LOOPBACK_NAMES) if _is_loopback(host) else [_authority(host, None)]
        if _is_wildcard(host):
            names = list(LOOPBACK_NAMES)
        self.hosts: set[str] = set()
        for name in [*names, *hosts]:
            parsed = split_host(name)
            if parsed is None:
                continue
            bare, explicit = parsed
            self.hosts.add(_authority(bare, explicit or port))
            if explicit is None and port == 80:
                self.hosts.add(_authority(bare, None))
        origins = [o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()]
        self.any_origin = "*" in origins
        self.origins = set(origins)
        self._seen: dict[str, bool] = {}  # Host header → allowed (parsing one costs ~2 µs)

    def check_scope(self, scope: Scope) -> Verdict:
        """:meth:`check` for an ASGI scope."""
        return self.check(scope["type"], scope.get("method", "GET"), request_headers(scope))

    def host_allowed(self, host: str | None) -> bool:
        if self.any_host:
            return True
        if not host:
            return False
        known = self._seen.get(host)
        if known is None:
            parsed = split_host(host)
            known = parsed is not None and _authority(*parsed) in self.hosts
            if len(self._seen) >= HOST_CACHE_MAX:
                self._seen.clear()
            self._seen[host] = known
        return known

    def origin_kind(self, origin: str, host: str | None) -> str:
        """``same`` (this broker's own origin), ``cors`` (allowed) or ``refused``."""
        origin = origin.strip().rstrip("/").lower()
        if host and _origin_authority(origin) == _normalized_host(host):
            return "same"
        if self.any_origin or origin in self.origins:
            return "cors"
        return "refused"

    def check(self, scope_type: str, method: str, headers: Mapping[str, str]) -> Verdict:
        host = headers.get("host")
        # host_allowed's remembered answer read here first: every request asks it.
        if not (self.any_host or (host and self._seen.get(host))) and not self.host_allowed(host):
            return Verdict(400, _refused_host(host))
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            kind = self.origin_kind(origin, host)
            if kind == "refused":
                return Verdict(403, _refused_origin(origin))
            if kind == "cors":
                cors = _cors_headers(origin)
                if method == "OPTIONS" and "access-control-request-method" in headers:
                    return Verdict(204, headers=cors + _preflight_headers())
        if (
            scope_type == "http"
            and method in BODY_METHODS
            and (
                length.strip() != "0"  # a body, declared or chunked
                if (length := headers.get("content-length")) is not None
                else "transfer-encoding" in headers
            )
        ):
            kind_ = media_type(headers.get("content-type"))
            if kind_ not in BODY_TYPES:
                return Verdict(415, _untyped_body(kind_), cors)
        return Verdict(0, None, cors) if cors else PASS


HEADERS_KEY = "logbus.headers"


def replace_headers(scope: Scope, headers: list[tuple[bytes, bytes]]) -> None:
    """Give the request ``headers`` instead of its own, and forget their decoded dict
    (:func:`request_headers` decodes them again when next asked)."""
    scope["headers"] = headers
    scope.pop(HEADERS_KEY, None)


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the last of a repeated one), decoded once per
    request and kept in its scope: the front door's checks and the handler all read them."""
    headers: dict[str, str] | None = scope.get(HEADERS_KEY)
    if headers is None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        scope[HEADERS_KEY] = headers
    return headers


_MEDIA_TYPES: dict[str, str] = {}  # Content-Type as sent → its media type (a client repeats one)
MEDIA_TYPE_CACHE_MAX = 64


def media_type(raw: str | None) -> str:
    """The media type of a Content-Type value, lower case, without parameters."""
    if raw is None:
        return ""
    kind = _MEDIA_TYPES.get(raw)
    if kind is None:
        kind = raw.split(";", 1)[0].strip().lower()
        if len(_MEDIA_TYPES) >= MEDIA_TYPE_CACHE_MAX:
            _MEDIA_TYPES.clear()
        _MEDIA_TYPES[raw] = kind
    return kind


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    return host.strip("[]") in ("0.0.0.0", "::", "")


def _origin_authority(origin: str) -> str | None:
    try:
        parts = urlsplit(origin)
        if not parts.hostname or parts.scheme not in _DEFAULT_PORTS:
            return None
        return _authority(parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme])
    except ValueError:
        return None


def _normalized_host(host: str) -> str | None:
    parsed = split_host(host)
    if parsed is None:
        return None
    name, port = parsed
    return _authority(name, port or 80)


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", CORS_EXPOSE.encode()),
        (b"vary", b"Origin"),
    ]


def _preflight_headers() -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-methods", CORS_METHODS.encode()),
        (b"access-control-allow-headers", CORS_HEADERS.encode()),
        (b"access-control-max-age", str(CORS_MAX_AGE_S).encode()),
        (b"content-length", b"0"),
    ]


def _refused_host(host: str | None) -> LogbusError:
    return LogbusError(
        f"Host {host!r} does not name this broker; add it to allowed_hosts "
        "(LOGBUS_ALLOWED_HOSTS) if it should",
        code=ErrorCode.INVALID_REQUEST,
    )


def _refused_origin(origin: str) -> LogbusError:
    return LogbusError(
        f"Origin {origin!r} may not use this broker; add it to allowed_origins "
        "(LOGBUS_ALLOWED_ORIGINS) if it should",
        code=ErrorCode.ORIGIN_NOT_ALLOWED,
    )


def _untyped_body(kind: str) -> LogbusError:
    return LogbusError(
        f"a request body needs a Content-Type of {', '.join(BODY_TYPES)}; got {kind or 'none'!r}",
        code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        supported=list(BODY_TYPES),
    )


async def refuse(scope: Scope, send: Send, verdict: Verdict) -> None:
    """Answer ``verdict`` instead of the app: a problem, a preflight, or a refused socket."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN})
        return
    if verdict.error is None:  # a preflight
        await send({"type": "http.response.start", "status": 204, "headers": verdict.headers})
        await send({"type": "http.response.body", "body": b""})
        return
    body = problem_bytes(verdict.error)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *verdict.headers,
    ]
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """``send`` that adds ``extra`` to the response start (CORS headers on an answer)."""

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sender
