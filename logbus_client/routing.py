"""Client routing in a Logbus cluster: each partition request to its leader, bounded retries.

Theory of operation
-------------------
* **Bootstrap.** A client is given one or several broker URLs, comma-separated like Kafka's
  ``bootstrap.servers`` (``http://a:8080,http://b:8080``). Before its first request it asks
  whichever answers first for ``GET /v1/cluster``: every broker's advertised URL and whether
  its lease is live. One dead bootstrap broker therefore does not stop a client from starting,
  and a client given one URL still knows where else to go when that broker dies.
* **Direct.** A partition request (produce to a partition, fetch) goes to the leader's URL
  with ``Logbus-Route: direct``: one hop instead of two through a forwarding broker. Where the
  leader is not known yet the request goes to any broker, still with ``direct``: a broker that
  does not lead answers 421 ``NOT_LEADER_OR_FOLLOWER`` with ``leader_id`` and ``leader_url``,
  and the router follows that URL at once (no backoff) and remembers it — so learning a
  partition's leader costs one extra round trip, and no listing of every partition. A caller
  that has a partition listing (``GET /v1/topics/{t}/partitions``) may hand it over
  (:meth:`ClusterView.apply_partitions`) to save even that. Other requests (topic listings,
  admin, a topic-level produce the broker places itself) go to the broker that last answered,
  any broker being able to serve them.
* **Failures.** A connection error or timeout marks the broker suspect for :data:`SUSPECT_S`
  (asked last) and forgets where the partition lives; the next attempt asks a broker that is
  not suspect (refreshing ``/v1/cluster`` from it when the failed broker was the one the
  router asked), which answers 421 naming the leader it knows — the dead one until its lease
  expires, then the one the controller elected. Retries wait 100 ms doubling to 1 s (Kafka's
  ``retry.backoff.ms`` and ``retry.backoff.max.ms``), at most :data:`MAX_ATTEMPTS` (16)
  attempts: 13.5 s of backoff plus the attempts themselves, more than a failover takes with
  the default ``broker.session.timeout.ms`` of 9 s.
* **Idempotence.** Whether a failed attempt may have been written decides whether it may be
  sent again (:func:`judge`). *Never written*: the connection was never made, a 421 naming a
  leader (refused before the append), 429, 503 ``NOT_ENOUGH_REPLICAS``,
  ``LEADER_NOT_AVAILABLE`` or ``BROKER_BUSY``. *Maybe written*: any other failure — a
  timeout or a dropped connection once the request left, a 421 without a leader ("leadership
  moved during the acks=all wait"), ``NETWORK_EXCEPTION``, ``REQUEST_TIMED_OUT``,
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``. Those are retried only for requests the caller
  declares ``idempotent``: reads, and produces carrying a producer session
  (``Logbus-Producer-Id``/``Epoch``/``Sequence``) or an ``Idempotency-Key``, which the broker
  answers as duplicates when the first attempt did land. For any other produce the failure
  is the answer: it is never sent twice blindly.
* **Credentials.** A broker started with ``--auth`` wants ``Authorization`` on every request
  but ``/healthz``, ``/readyz`` and the docs, ``GET /v1/cluster`` included. ``api_key=`` (or
  an ``authorization`` entry in ``headers=``) puts it on the router's HTTP client, so every
  attempt carries it, to whichever broker a redirect or a retry goes. The key is never part of
  an error message (httpx masks it in a repr of the headers).
* **One broker.** A broker that answers ``clustered: false`` is used at the URL the client was
  given (its advertised URL may be a name only it resolves), and so is a broker too old to
  have ``/v1/cluster``.

:class:`Router` is the blocking form (httpx.Client, thread-safe), :class:`AsyncRouter` the
asyncio one; both share :class:`ClusterView` (what is known) and :func:`judge` (what an answer
means). The Spark connector's binary fetcher drives its own ``http.client`` connection with
:meth:`Router.target`, :meth:`Router.failed` and :func:`judge`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

ROUTE_HEADER = "logbus-route"
MAX_ATTEMPTS = 16
BACKOFF_S = 0.1
BACKOFF_MAX_S = 1.0
# A broker that failed to answer is asked last for metadata for this long.
SUSPECT_S = 10.0

TopicPartition = tuple[str, int]

# 503 codes a broker answers before appending anything: a retry can never duplicate.
_NOT_WRITTEN_CODES = frozenset(("NOT_ENOUGH_REPLICAS", "LEADER_NOT_AVAILABLE", "BROKER_BUSY"))


class RoutingError(Exception):
    """No broker gave an answer within the attempts. ``maybe_written``: the last attempt may
    have reached a broker (so a non-idempotent produce may or may not have been appended)."""

    def __init__(self, message: str, *, maybe_written: bool) -> None:
        super().__init__(message)
        self.maybe_written = maybe_written


# An API key (``lbk.…``, 81 characters) or a JWT (a few KiB at most) as a header value: visible
# ASCII only, so a stray newline or space cannot split or corrupt the request.
MAX_CREDENTIAL_CHARS = 8192
_CREDENTIAL = re.compile(rf"[\x21-\x7e]{{1,{MAX_CREDENTIAL_CHARS}}}")


def check_api_key(key: str) -> str:
    """``key`` when it can travel as ``Authorization: Bearer KEY``; ValueError otherwise.
    The message never contains the key."""
    if not _CREDENTIAL.fullmatch(key):
        raise ValueError(
            f"an API key is 1..{MAX_CREDENTIAL_CHARS} visible ASCII characters (no spaces)"
        )
    return key


def client_headers(
    headers: Mapping[str, str] | None = None, api_key: str | None = None
) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer api_key`` when a key is given."""
    out = dict(headers or {})
    if api_key is not None:
        out["authorization"] = f"Bearer {check_api_key(api_key)}"
    return out


def parse_bootstrap(urls: str | Sequence[str]) -> list[str]:
    """``http://a:1,http://b:2`` (or a list of such strings) → distinct base URLs, in order.
    ValueError naming the culprit for anything that is not an http(s) URL."""
    parts = [urls] if isinstance(urls, str) else list(urls)
    out: list[str] = []
    for part in parts:
        for raw in part.split(","):
            url = raw.strip().rstrip("/")
            if not url:
                continue
            if not url.startswith(("http://", "https://")) or len(url.split("//", 1)[1]) == 0:
                raise ValueError(f"not an http:// or https:// URL: {raw.strip()!r}")
            if url not in out:
                out.append(url)
    if not out:
        raise ValueError("no broker URL given")
    return out


class Verdict(enum.Enum):
    DONE = "done"  # an answer for the caller (success, or an error that retrying cannot fix)
    REDIRECT = "redirect"  # 421 naming the leader's URL: not written, go there
    RETRY = "retry"  # not written: safe to send again, after a backoff
    MAYBE = "maybe"  # may have been written: send again only if idempotent


def judge(status: int, body: bytes) -> tuple[Verdict, str | None]:
    """What an answer means for a retry; the leader URL for a 421 that names one."""
    if status < 400 or status in (400, 401, 403, 404, 405, 406, 409, 413, 415, 416, 422):
        return Verdict.DONE, None
    doc = _problem(body)
    if status == 421:
        url = doc.get("leader_url")
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            return Verdict.REDIRECT, url.rstrip("/")
        return (Verdict.RETRY if "leader_id" in doc else Verdict.MAYBE), None
    if status == 429 or doc.get("code") in _NOT_WRITTEN_CODES:
        return Verdict.RETRY, None
    if doc.get("retriable") is False:
        return Verdict.DONE, None
    if status in (502, 503, 504) or doc.get("retriable") is True:
        return Verdict.MAYBE, None
    return Verdict.DONE, None


def _problem(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def connection_never_made(e: BaseException) -> bool:
    """Whether a transport error happened before any byte of the request left."""
    return isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)


class ClusterView:
    """What a client knows of the cluster: brokers, partition leaders, redirects, suspects.
    Thread-safe; no I/O (the routers fill it)."""

    def __init__(self, bootstrap: Sequence[str], clock: Callable[[], float] = time.monotonic):
        self.bootstrap = list(bootstrap)
        self._clock = clock
        self._lock = threading.Lock()
        self.clustered: bool | None = None  # None: not learned yet
        self.brokers: dict[int, str] = {}  # live brokers' advertised URLs
        self.leaders: dict[TopicPartition, int] = {}
        self.redirects: dict[TopicPartition, str] = {}  # from 421 answers, newest first
        self.home = self.bootstrap[0]  # the broker that last answered metadata
        self._suspects: dict[str, float] = {}
        self.refreshed_at = float("-inf")
        self.needs_refresh = True

    def candidates(self) -> list[str]:
        """Where to ask for metadata: the last broker that answered, the bootstrap list and
        every known broker; brokers that failed recently last."""
        with self._lock:
            now = self._clock()
            urls = list(dict.fromkeys([self.home, *self.bootstrap, *self.brokers.values()]))
            return sorted(urls, key=lambda u: self._suspects.get(u, 0.0) > now)

    def suspect(self, url: str) -> None:
        """``url`` did not answer: ask it last, and if it was the broker asked for everything
        else, move on to one that is not suspect (and learn the cluster from it again)."""
        with self._lock:
            now = self._clock()
            self._suspects[url] = now + SUSPECT_S
            if self.home == url:
                urls = dict.fromkeys([*self.bootstrap, *self.brokers.values()])
                fresh = [u for u in urls if self._suspects.get(u, 0.0) <= now]
                self.home = fresh[0] if fresh else self.home
                self.needs_refresh = True

    def apply_cluster(self, base: str, doc: Mapping[str, Any] | None) -> None:
        """An answer of ``GET /v1/cluster`` from ``base`` (None: the broker has no such path)."""
        with self._lock:
            self.home = base
            self._suspects.pop(base, None)
            self.refreshed_at = self._clock()
            self.needs_refresh = False
            if doc is None or not doc.get("clustered"):
                self.clustered = False
                self.brokers = {}
                return
            self.clustered = True
            self.brokers = {
                int(b["broker_id"]): str(b["url"]).rstrip("/")
                for b in doc.get("brokers", [])
                if b.get("alive") and b.get("url")
            }

    def apply_partitions(self, topic: str, doc: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            for p in doc:
                tp = (topic, int(p["partition"]))
                self.leaders[tp] = int(p["leader"])
                self.redirects.pop(tp, None)

    def redirect(self, tp: TopicPartition, url: str) -> None:
        with self._lock:
            self.redirects[tp] = url

    def forget(self, tp: TopicPartition | None) -> None:
        """Ask again where ``tp`` lives before its next request."""
        with self._lock:
            if tp is not None:
                self.leaders.pop(tp, None)
                self.redirects.pop(tp, None)

    def target(self, tp: TopicPartition | None) -> tuple[str, bool]:
        """(base URL, direct) for a request: the partition's leader where known; else the
        broker that last answered — with ``direct`` in a cluster, so that it names the leader
        (421) rather than forwarding."""
        with self._lock:
            if tp is None or not self.clustered:
                return self.home, False
            if tp in self.redirects:
                return self.redirects[tp], True
            url = self.brokers.get(self.leaders.get(tp, -1))
            return (url, True) if url is not None else (self.home, True)


class Backoff:
    """Delays between attempts: ``first_s`` doubling up to ``max_s``."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self.delay = first_s
        self.max_s = max_s

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, self.max_s)
        return delay


def _headers(kwargs: dict[str, Any], direct: bool) -> dict[str, Any]:
    out = dict(kwargs)
    if direct:
        out["headers"] = {**(kwargs.get("headers") or {}), ROUTE_HEADER: "direct"}
    return out


class _Step(enum.Enum):
    RETURN = "return the answer"
    RETRY_NOW = "retry at once"
    RETRY_LATER = "retry after a backoff"


class _Base:
    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        max_attempts: int,
        backoff_s: float,
        backoff_max_s: float,
    ) -> None:
        self.view = ClusterView(parse_bootstrap(urls))
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s

    @property
    def bootstrap(self) -> list[str]:
        return self.view.bootstrap

    def failed(
        self, tp: TopicPartition | None, base: str, unreachable: bool, status: int = 0
    ) -> None:
        """An attempt at ``base`` failed: if it did not answer, suspect it; if it did not answer
        or said it does not lead (421), ask again where ``tp`` lives. A broker that answered
        another retriable error (503: an election, too few replicas) is asked again."""
        if unreachable:
            self.view.suspect(base)
        if unreachable or status == 421:
            self.view.forget(tp)

    def follow_redirect(
        self, verdict: Verdict, leader: str | None, tp: TopicPartition | None, base: str
    ) -> bool:
        """Follow a 421 that names another broker as the leader of ``tp``."""
        if verdict is not Verdict.REDIRECT or leader is None or tp is None or leader == base:
            return False
        self.view.redirect(tp, leader)
        return True

    def _learned(self, base: str, answer: httpx.Response | Exception) -> bool:
        """Take ``GET /v1/cluster``'s answer from ``base`` (404: a broker without it, one
        alone); False to ask the next candidate."""
        if isinstance(answer, Exception):
            self.view.suspect(base)
            return False
        if answer.status_code not in (200, 404):
            return False
        try:
            cluster = answer.json() if answer.status_code == 200 else None
        except ValueError:
            self.view.suspect(base)
            return False
        self.view.apply_cluster(base, cluster)
        return True

    def _unanswered(
        self,
        e: httpx.TransportError,
        what: str,
        partition: TopicPartition | None,
        base: str,
        attempts: int,
        idempotent: bool,
    ) -> None:
        """An attempt got no answer: give up unless retrying is safe and allowed."""
        safe = connection_never_made(e)
        self.failed(partition, base, True)
        if not (safe or idempotent) or attempts >= self.max_attempts:
            self._give_up(what, attempts, e, not safe)

    def _next_step(
        self,
        r: httpx.Response,
        partition: TopicPartition | None,
        base: str,
        attempts: int,
        idempotent: bool,
        redirects: int,
    ) -> tuple[_Step, int]:
        """What to do with an answer (and the redirect count to go on with)."""
        verdict, leader = judge(r.status_code, r.content)
        if verdict is Verdict.DONE or attempts >= self.max_attempts:
            return _Step.RETURN, redirects
        if verdict is Verdict.MAYBE and not idempotent:
            return _Step.RETURN, redirects
        if self.follow_redirect(verdict, leader, partition, base):
            redirects += 1
            # The first hop to a named leader needs no backoff.
            return (_Step.RETRY_NOW if redirects == 1 else _Step.RETRY_LATER), redirects
        self.failed(partition, base, False, r.status_code)
        return _Step.RETRY_LATER, 0

    def _give_up(self, what: str, attempts: int, e: BaseException | None, maybe: bool) -> None:
        raise RoutingError(
            f"{what}: no broker answered after {attempts} attempt(s)"
            + (f" (last error: {e})" if e is not None else ""),
            maybe_written=maybe,
        ) from e


class Router(_Base):
    """Blocking routing client (see the module doc). ``request`` returns the final answer —
    success or an error retrying cannot fix or that was not safe to retry — or raises
    :class:`RoutingError` when no broker answered. ``api_key``: sent as ``Authorization:
    Bearer`` on every request (ValueError from :func:`check_api_key` for one that cannot be)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: httpx.Timeout | float = 30.0,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        pool: int = 8,
        max_attempts: int = MAX_ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            urls, max_attempts=max_attempts, backoff_s=backoff_s, backoff_max_s=backoff_max_s
        )
        self.http = httpx.Client(
            timeout=timeout,
            headers=client_headers(headers, api_key),
            transport=transport,
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        )
        self._sleep = sleep
        self._refresh_lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a Router holds sockets and is never pickled; create it in place")

    def refresh(self) -> bool:
        """Learn the brokers from the first one that answers (False: none did)."""
        with self._refresh_lock:
            if not self.view.needs_refresh:
                return True  # another request refreshed while this one waited
            for base in self.view.candidates():
                try:
                    answer: httpx.Response | Exception = self.http.get(f"{base}/v1/cluster")
                except httpx.TransportError as e:
                    answer = e
                if self._learned(base, answer):
                    return True
            return False

    def target(self, tp: TopicPartition | None) -> tuple[str, bool]:
        """(base URL, direct) for the next request about ``tp`` (see the module doc)."""
        if self.view.needs_refresh:
            self.refresh()
        return self.view.target(tp)

    def leader_url(self, topic: str, partition: int) -> str | None:
        """The URL of the partition's leader per a fresh listing (``GET
        /v1/topics/{t}/partitions`` from any broker), retried while it has none (an election,
        a topic just created), within the attempts; None on one broker, where there is no
        other. For tools that aim something else (wrk) at the leader."""
        path = f"/v1/topics/{quote(topic, safe='')}/partitions"
        backoff = Backoff(self.backoff_s, self.backoff_max_s)
        for _ in range(self.max_attempts):
            r = self.request("GET", path, idempotent=True)
            r.raise_for_status()
            self.view.apply_partitions(topic, r.json())
            if not self.view.clustered:
                return None
            url, direct = self.view.target((topic, partition))
            leader = self.view.leaders.get((topic, partition), -1)
            if direct and url == self.view.brokers.get(leader):
                return url
            self._sleep(backoff.next())
        raise RoutingError(f"{topic}-{partition} has no leader", maybe_written=False)

    def request(
        self,
        method: str,
        path: str,
        *,
        partition: TopicPartition | None = None,
        idempotent: bool,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send ``path`` to the leader of ``partition`` (or to any broker), retrying per the
        module doc. ``idempotent``: a repeat can never be appended twice."""
        backoff = Backoff(self.backoff_s, self.backoff_max_s)
        attempts = redirects = 0
        while True:
            attempts += 1
            base, direct = self.target(partition)
            try:
                r = self.http.request(method, base + path, **_headers(kwargs, direct))
            except httpx.TransportError as e:
                self._unanswered(e, f"{method} {path}", partition, base, attempts, idempotent)
            else:
                step, redirects = self._next_step(
                    r, partition, base, attempts, idempotent, redirects
                )
                if step is _Step.RETURN:
                    return r
                if step is _Step.RETRY_NOW:
                    continue
            self._sleep(backoff.next())


class AsyncRouter(_Base):
    """:class:`Router` for asyncio (one event loop)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: httpx.Timeout | float = 30.0,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        pool: int = 8,
        max_attempts: int = MAX_ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        backoff_max_s: float = BACKOFF_MAX_S,
    ) -> None:
        super().__init__(
            urls, max_attempts=max_attempts, backoff_s=backoff_s, backoff_max_s=backoff_max_s
        )
        self.http = httpx.AsyncClient(
            timeout=timeout,
            headers=client_headers(headers, api_key),
            transport=transport,
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        )
        self._refresh_lock: asyncio.Lock | None = None

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncRouter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def refresh(self) -> bool:
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        async with self._refresh_lock:
            if not self.view.needs_refresh:
                return True  # another request refreshed while this one waited
            for base in self.view.candidates():
                try:
                    answer: httpx.Response | Exception = await self.http.get(f"{base}/v1/cluster")
                except httpx.TransportError as e:
                    answer = e
                if self._learned(base, answer):
                    return True
            return False

    async def target(self, tp: TopicPartition | None) -> tuple[str, bool]:
        if self.view.needs_refresh:
            await self.refresh()
        return self.view.target(tp)

    async def request(
        self,
        method: str,
        path: str,
        *,
        partition: TopicPartition | None = None,
        idempotent: bool,
        **kwargs: Any,
    ) -> httpx.Response:
        backoff = Backoff(self.backoff_s, self.backoff_max_s)
        attempts = redirects = 0
        while True:
            attempts += 1
            base, direct = await self.target(partition)
            try:
                r = await self.http.request(method, base + path, **_headers(kwargs, direct))
            except httpx.TransportError as e:
                self._unanswered(e, f"{method} {path}", partition, base, attempts, idempotent)
            else:
                step, redirects = self._next_step(
                    r, partition, base, attempts, idempotent, redirects
                )
                if step is _Step.RETURN:
                    return r
                if step is _Step.RETRY_NOW:
                    continue
            await asyncio.sleep(backoff.next())
