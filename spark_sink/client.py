"""The connector's HTTP client: the few broker calls the source and the sink make.

One :class:`LogbusClient` wraps one ``httpx.Client`` (connection reuse, a timeout on every
request, ``Authorization: Bearer`` when a token is configured). It is created where it is used
— on the driver for metadata, inside ``read()``/``write()`` on executors — and never pickled.
Reads are retried on transport errors and retriable statuses; so are produces, which always
carry an ``Idempotency-Key`` and so cannot be appended twice.

The hot path of ``read()`` — binary fetches of a few MiB, one after the other — goes through
:class:`BinaryFetcher` instead, a keep-alive connection of the standard library's
``http.client`` with the same timeouts, retries and auth: it reads a 2 MiB body ~4x cheaper
than httpx (measured: 86 MB of fetch answers in 0.06 s against 0.25 s, the broker's side the
same), which was most of the source's own cost per record.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx

from . import limits
from .errors import BrokerError
from .options import Connection

log = logging.getLogger("logbus.spark")

BATCH = "application/vnd.logbus.batch"
_RETRIABLE_STATUSES = frozenset((429, 500, 502, 503, 504))


@dataclass(frozen=True)
class PartitionState:
    partition: int
    log_start_offset: int
    high_watermark: int


@dataclass(frozen=True)
class Fetched:
    """A binary fetch answer: whole batches (the first may start before the asked offset)."""

    data: bytes
    next_offset: int
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True)
class OutOfRange:
    """416: the offset is below the log start (deleted) or past the log end."""

    offset: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True)
class Produced:
    offsets: list[dict[str, int]]
    duplicate: bool


class LogbusClient:
    def __init__(
        self,
        connection: Connection,
        *,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"user-agent": "logbus-spark"}
        token = connection.auth_token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=connection.url,
            headers=headers,
            timeout=httpx.Timeout(connection.request_timeout_s, connect=limits.CONNECT_TIMEOUT_S),
            transport=transport,
        )
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LogbusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("LogbusClient holds sockets and is never pickled; create it in place")

    # -- metadata ----------------------------------------------------------------------------

    def topics(self) -> list[str]:
        doc = self._json("GET", "/v1/topics")
        return sorted(t["name"] for t in doc["topics"])

    def partitions(self, topic: str) -> list[PartitionState] | None:
        """Log start and high watermark of every partition; None if the topic does not exist."""
        r = self._request("GET", f"/v1/topics/{quote(topic, safe='')}/partitions")
        if r.status_code == 404:
            return None
        _raise_for(r)
        return [
            PartitionState(p["partition"], p["log_start_offset"], p["high_watermark"])
            for p in r.json()
        ]

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset with a timestamp >= ``timestamp_ms``, or None if there is none."""
        path = f"/v1/topics/{quote(topic, safe='')}/partitions/{partition}/offsets"
        doc = self._json("GET", path, params={"at": str(timestamp_ms)})
        offset: int | None = doc["offset"]
        return offset

    # -- records -----------------------------------------------------------------------------

    def produce(
        self, topic: str, body: bytes, content_type: str, idempotency_key: str, acks: str
    ) -> Produced:
        r = self._request(
            "POST",
            f"/v1/topics/{quote(topic, safe='')}/records",
            params={"acks": acks},
            content=body,
            headers={"content-type": content_type, "idempotency-key": idempotency_key},
        )
        _raise_for(r)
        return Produced(r.json()["offsets"], r.headers.get("logbus-duplicate") == "true")

    # -- plumbing ----------------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self._request(method, path, **kwargs)
        _raise_for(r)
        return r.json()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = limits.RETRY_BACKOFF_S
        for attempt in range(limits.MAX_RETRIES + 1):
            try:
                r = self._http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                if attempt == limits.MAX_RETRIES:
                    raise BrokerError(
                        f"{method} {path}: broker unreachable after {attempt + 1} attempts: {e}",
                        status=0,
                    ) from e
                log.warning("%s %s failed (%s); retrying in %.1fs", method, path, e, delay)
            else:
                if r.status_code not in _RETRIABLE_STATUSES or attempt == limits.MAX_RETRIES:
                    return r
                log.warning("%s %s: %s; retrying in %.1fs", method, path, r.status_code, delay)
            self._sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


class _Timeouts:
    """Logbus's two timeouts for ``http.client``: connect, then every read and write."""

    sock: Any
    _request_s: float

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.sock.settimeout(self._request_s)


class _Connection(_Timeouts, http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, connect_s: float, request_s: float) -> None:
        super().__init__(host, port, timeout=connect_s)
        self._request_s = request_s


class _TLSConnection(_Timeouts, http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, connect_s: float, request_s: float) -> None:
        super().__init__(host, port, timeout=connect_s)
        self._request_s = request_s


class BinaryFetcher:
    """Binary fetches over one keep-alive connection (see the module doc for why not httpx).

    Same contract as :meth:`LogbusClient.fetch`: :class:`Fetched`, :class:`OutOfRange` for a
    416, :class:`BrokerError` otherwise; transport errors and 5xx/429 are retried with backoff.
    """

    def __init__(self, connection: Connection, *, sleep: Callable[[float], None] = time.sleep):
        parts = urlsplit(connection.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BrokerError(f"not an http(s) URL: {connection.url!r}", status=0)
        self._kind = _TLSConnection if parts.scheme == "https" else _Connection
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeouts = (limits.CONNECT_TIMEOUT_S, connection.request_timeout_s)
        self._headers = {"accept": BATCH, "user-agent": "logbus-spark"}
        token = connection.auth_token()
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None
        self._sleep = sleep

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> BinaryFetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("BinaryFetcher holds a socket and is never pickled; create it in place")

    def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> Fetched | OutOfRange:
        query = urlencode({"offset": offset, "max_bytes": max_bytes})
        path = f"{self._prefix}/v1/topics/{quote(topic, safe='')}/partitions/{partition}/records"
        status, headers, body = self._get(f"{path}?{query}")
        if status == 416:
            doc = json.loads(body)
            return OutOfRange(offset, doc["log_start_offset"], doc["log_end_offset"])
        if status >= 400:
            raise _error("GET", path, status, body)
        return Fetched(
            body,
            int(headers["logbus-next-offset"]),
            int(headers["logbus-high-watermark"]),
            int(headers["logbus-log-start-offset"]),
        )

    def _get(self, target: str) -> tuple[int, dict[str, str], bytes]:
        delay = limits.RETRY_BACKOFF_S
        for attempt in range(limits.MAX_RETRIES + 1):
            try:
                if self._conn is None:
                    self._conn = self._kind(self._host, self._port, *self._timeouts)
                self._conn.request("GET", target, headers=self._headers)
                r = self._conn.getresponse()
                body = r.read()
                headers = {k.lower(): v for k, v in r.getheaders()}
                if r.will_close:
                    self.close()
                if r.status not in _RETRIABLE_STATUSES or attempt == limits.MAX_RETRIES:
                    return r.status, headers, body
                log.warning("GET %s: %s; retrying in %.1fs", target, r.status, delay)
            except (OSError, http.client.HTTPException) as e:  # timeouts are OSErrors
                self.close()
                if attempt == limits.MAX_RETRIES:
                    raise BrokerError(
                        f"GET {target}: broker unreachable after {attempt + 1} attempts: {e}",
                        status=0,
                    ) from e
                log.warning("GET %s failed (%s); retrying in %.1fs", target, e, delay)
            self._sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def _error(method: str, path: str, status: int, body: bytes) -> BrokerError:
    code: str | None = None
    detail = body[:500].decode("utf-8", "replace")
    try:
        doc = json.loads(body)
        code = doc.get("code")
        detail = doc.get("detail") or doc.get("title") or detail
    except ValueError:
        pass
    return BrokerError(
        f"{method} {path}: {status} {code or ''}: {detail}", status=status, code=code
    )


def _raise_for(r: httpx.Response) -> None:
    if r.status_code >= 400:
        raise _error(r.request.method, r.request.url.path, r.status_code, r.content)
