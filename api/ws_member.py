"""A WebSocket member's link to its group's coordinator, wherever that is and while it moves.

Theory of operation
-------------------
The socket is the member, but the member's state lives on the group's coordinator — the
leader of the group's ``__consumer_offsets`` partition — which may be another broker and may
change while the socket stays open (a kill, a lease lost, a leader rebalance). A
:class:`GroupLink` makes each membership call where the coordinator is *now*: in-process when
this broker coordinates the group, else as the member's own HTTP call to the coordinator
(``Logbus-Route: direct``, the broker named by this broker's metadata or by the last 421).
Records are read here either way, through the cluster layer.

* **Heartbeats.** In-process, the push loop reconciles on every round as before (free, and
  woken by the group's event). Remotely, a heartbeat task calls every third of the session
  timeout (at most ``HEARTBEAT_MAX_S``, 3 s — Kafka's ``heartbeat.interval.ms``), at once
  when the client acknowledges revocations, and keeps the last assignment it heard; the
  session reads that view without waiting on the network.
* **Positions** are kept here (next offset per assigned partition) in both modes; in-process
  the coordinator's member positions lead and are copied here, remotely a newly assigned
  partition starts at the group's committed offset (or ``auto_offset_reset``). So a move of
  the coordinator does not move the reader back: records are not delivered twice by it.
* **Retries.** A retriable failure (``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``,
  ``COORDINATOR_NOT_AVAILABLE``, a timeout, a refused connection to a dead coordinator) is
  retried after 100 ms doubling to 1 s, at the coordinator named then, while records keep
  flowing from the last assignment. Membership is persisted with the offsets, so the new
  coordinator knows the member: the client sees nothing. The link gives up only when no call
  succeeded for the member's session timeout (the coordinator would have expired it anyway):
  the socket then closes 4503. ``UNKNOWN_MEMBER_ID`` and ``FENCED_MEMBER_EPOCH`` are Kafka's
  "rejoin": the link joins again with the same parameters and the client gets ``joined``
  again (``rejoined: true``) with the new member id; its partitions are announced anew and
  read from the committed offsets (at least once).

Bounds: one remote call in flight per member, each within ``CALL_TIMEOUT_S``; a leave on
close is sent in the background within ``CALL_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from cluster.assignor import TopicPartition
from core_log.errors import ErrorCode, LogbusError

from . import ws_protocol as proto
from .state import AppState

log = logging.getLogger("logbus.ws")

HEARTBEAT_MAX_S = 3.0
CALL_TIMEOUT_S = 10.0  # one remote call: a heartbeat may wait for its membership record
BACKOFF_S = (0.1, 1.0)  # first and longest wait between failed calls
REJOIN = frozenset((ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH))
# The coordinator moving or busy: the same call succeeds later (other retriable codes, such as
# an unknown topic, are the answer).
TRANSIENT = frozenset(
    (
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.BROKER_BUSY,
    )
)
_leaving: set[asyncio.Task[None]] = set()  # background leaves, kept until done


@dataclass(frozen=True)
class View:
    """The member's assignment as last heard from the coordinator."""

    epoch: int
    assigned: frozenset[TopicPartition]
    revoking: frozenset[TopicPartition]


_NOTHING = View(-1, frozenset(), frozenset())


class GroupLink:
    """One WebSocket member (see the module doc). ``on_change`` is called when the view, the
    member id or the link's health changed (the session's push loop looks again)."""

    def __init__(
        self,
        state: AppState,
        join: proto.Join,
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.broker = state.broker
        self.coordinator = state.coordinator
        self.params = join
        self.group = join.group
        # The socket's scope: its principal goes with calls to a remote coordinator.
        self.scope: Mapping[str, Any] = {}
        self.session_timeout_ms = max(join.session_timeout_ms, 100)
        self.on_change = on_change
        self.clock = clock
        self.member_id = ""
        self.view = _NOTHING
        self.positions: dict[TopicPartition, int] = {}
        self.rejoins = 0  # joins after the first (the session announces each)
        self.fatal: LogbusError | None = None  # gave up: the session closes
        self._local = True  # where the last successful call went
        self._hint: str | None = None  # a 421's coordinator_url, tried next
        self._failing_since: float | None = None
        self._ack_wanted = False
        self._rejoin_wanted = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def standalone(cls, state: AppState, group: str) -> GroupLink:
        """A link for a group this socket is not a member of (commits of an explicit
        subscription, Kafka's standalone consumer)."""
        return cls(state, proto.Join(group=group, topics=[group]), lambda: None)

    @property
    def interval_s(self) -> float:
        return min(HEARTBEAT_MAX_S, self.session_timeout_ms / 3000)

    # -- where the coordinator is ----------------------------------------------------------------

    def _here(self) -> bool:
        """Whether the next call is made in-process: this broker coordinates the group, or
        believes it leads its partition (then the local call says it is loading)."""
        b = self.broker
        if b.replicas is None or self.coordinator.coordinates(self.group):
            return True
        return b.coordinator_of(self.group) == b.config.broker_id

    def _url(self) -> str:
        if self._hint is not None:
            return self._hint  # until a call to it fails
        cid = self.broker.coordinator_of(self.group)
        url = self.broker.broker_url(cid) if cid >= 0 else None
        if url is None:
            raise LogbusError(
                f"group {self.group!r} has no coordinator now; it is being elected",
                code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
            )
        return url

    async def _http(self, method: str, path: str, **kw: Any) -> Any:
        """The member's call to the remote coordinator; its problem as a LogbusError."""
        proxy = self.state.proxy
        assert proxy is not None, "a remote coordinator exists only in a cluster"
        url = self._url()
        try:
            r = await proxy.client.request(
                method,
                url + f"/v1/groups/{quote(self.group, safe='')}" + path,
                headers={
                    "logbus-route": "direct",
                    **{k.decode(): v.decode() for k, v in proxy.inter_broker_headers(self.scope)},
                },
                timeout=CALL_TIMEOUT_S,
                **kw,
            )
        except httpx.HTTPError as e:
            self._hint = None
            raise LogbusError(
                f"the coordinator of group {self.group!r} at {url} did not answer: "
                f"{e or type(e).__name__}",
                code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ) from None
        if r.status_code < 400:
            return r.json() if r.content else None
        raise self._problem(r)

    def _problem(self, r: httpx.Response) -> LogbusError:
        try:
            doc = r.json()
            code = ErrorCode[doc["code"]]
        except (ValueError, KeyError, TypeError):
            return LogbusError(
                f"the coordinator answered {r.status_code}: {r.text[:200]}",
                code=ErrorCode.COORDINATOR_NOT_AVAILABLE if r.status_code >= 500 else None,
            )
        hint = doc.get("coordinator_url")
        if code is ErrorCode.NOT_COORDINATOR:
            self._hint = hint if isinstance(hint, str) and hint.startswith("http") else None
        extra = {k: v for k, v in doc.items() if k not in _ENVELOPE}
        e = LogbusError(str(doc.get("detail", code.name)), code=code, **extra)
        e.retriable_override = bool(doc.get("retriable", code.retriable))
        return e

    # -- joining ---------------------------------------------------------------------------------

    async def join(self) -> None:
        """Join (retrying retriable failures within the session timeout) and start the
        heartbeat task. Raises the coordinator's error when it refuses the member."""
        await self._join_once()
        self._ok()
        if self._task is None:
            self._task = asyncio.create_task(self._beat_loop(), name="ws-member-heartbeat")

    async def _join_once(self) -> None:
        """Join (retried while the coordinator moves), then learn where to read from (retried
        too: never a second join for one failed read of the committed offsets)."""
        doc = await self._retrying(self._join_call)
        if doc is not None:
            await self._retrying(lambda: self._adopt(doc))

    async def _join_call(self) -> dict[str, Any] | None:
        p = self.params
        if self._here():
            r = self.coordinator.join(
                self.group,
                p.topics,
                session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=p.rebalance_timeout_ms,
                instance_id=p.instance_id,
                client_id=p.client_id,
                auto_offset_reset=p.auto_offset_reset,
            )
            await self.coordinator.durable(self.group)
            self.member_id, self._local = r.member_id, True
            self.view = View(r.epoch, r.assigned, r.revoking)
            return None
        body = {
            "topics": p.topics,
            "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": p.rebalance_timeout_ms,
            "instance_id": p.instance_id,
            "client_id": p.client_id,
            "auto_offset_reset": p.auto_offset_reset,
        }
        doc: dict[str, Any] = await self._http("POST", "/members", json=body)
        self.member_id, self._local = doc["member_id"], False
        return doc

    async def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call`` until it succeeds, fails for good, or has failed for a session timeout."""
        backoff = BACKOFF_S[0]
        deadline = self.clock() + self.session_timeout_ms / 1000
        while True:
            try:
                return await call()
            except LogbusError as e:
                if e.code not in TRANSIENT or self.clock() >= deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])

    # -- the member's view -----------------------------------------------------------------------

    def reconcile(self, *, ack: bool) -> View:
        """The member's view now: an in-process heartbeat when this broker coordinates the
        group, else the last one the heartbeat task heard (``ack`` asks it to acknowledge
        revocations at once)."""
        if self.fatal is not None:
            raise self.fatal
        if not self._here():
            if ack:
                self._ack_wanted = True
                self._wake.set()
            return self.view
        try:
            r = self.coordinator.heartbeat(self.group, self.member_id, ack=ack)
        except LogbusError as e:
            self._failed(e)
            return self.view
        if not self._local:  # came back here: carry the positions over
            owned = self.coordinator.member(self.group, self.member_id)
            for tp, pos in self.positions.items():
                if tp in owned.owned:
                    owned.positions.setdefault(tp, pos)
        self._local = True
        self._ok()
        self.view = View(r.epoch, r.assigned, r.revoking)
        self._drop_unassigned()
        return self.view

    def event(self) -> asyncio.Event | None:
        """The group's change event when it is coordinated here (remote changes come through
        ``on_change``)."""
        if self.coordinator.coordinates(self.group):
            return self.coordinator.event(self.group)
        return None

    def position(self, tp: TopicPartition) -> int | None:
        """Where ``tp`` is read next; None while a remote member's starting offset is not
        known yet (its partition waits)."""
        if self._local and self.coordinator.coordinates(self.group):
            try:
                member = self.coordinator.member(self.group, self.member_id)
                pos = self.coordinator.position(self.group, member, tp)
            except LogbusError as e:
                if e.code not in TRANSIENT and e.code not in REJOIN:
                    raise
                return self.positions.get(tp)
            self.positions[tp] = pos
            return pos
        return self.positions.get(tp)

    def advance(self, tp: TopicPartition, next_offset: int) -> None:
        if tp in self.view.assigned or tp in self.view.revoking:
            self.positions[tp] = next_offset
        if self._local and self.coordinator.coordinates(self.group):
            self.coordinator.advance(self.group, self.member_id, tp, next_offset)

    def _drop_unassigned(self) -> None:
        mine = self.view.assigned | self.view.revoking
        for tp in [tp for tp in self.positions if tp not in mine]:
            del self.positions[tp]

    async def _adopt(self, doc: dict[str, Any]) -> None:
        """Take a remote heartbeat's (or join's) answer; newly assigned partitions start at
        the committed offsets, fetched first (a failure leaves the old view in place)."""
        assigned = _tps(doc["assignment"])
        new = [tp for tp in assigned if tp not in self.positions]
        if new:
            committed = {
                (o["topic"], o["partition"]): o["offset"]
                for o in (await self._http("GET", "/offsets"))["offsets"]
            }
            for tp in new:
                try:
                    self.positions[tp] = await self._start(tp, committed.get(tp))
                except LogbusError as e:
                    if e.code in TRANSIENT:
                        raise
                    # no committed offset and auto_offset_reset=none, a topic gone: the
                    # partition waits for a commit to name where to start
                    log.info("group %s: %s[%d] not read: %s", self.group, *tp, e)
        self.view = View(doc["generation"], assigned, _tps(doc["revoking"]))
        self._drop_unassigned()

    async def _start(self, tp: TopicPartition, committed: int | None) -> int:
        p = await self.broker.known_reader(*tp)
        if committed is not None and p.log_start_offset <= committed <= p.high_watermark:
            return committed
        reset = self.params.auto_offset_reset
        if reset == "none":
            raise LogbusError(
                f"no committed offset for {tp[0]}[{tp[1]}] and auto_offset_reset is none",
                code=ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        return p.log_start_offset if reset == "earliest" else p.high_watermark

    # -- health ----------------------------------------------------------------------------------

    def _ok(self) -> None:
        self._failing_since = None

    def _failed(self, e: LogbusError) -> None:
        """A membership call failed: retriable ones are retried (the heartbeat task wakes),
        a fenced member rejoins, anything else ends the session."""
        if e.code in REJOIN:
            self._rejoin_wanted = True
        elif e.code not in TRANSIENT:
            self.fatal = e
            self.on_change()
            return
        elif self._failing_since is None:
            self._failing_since = self.clock()
            log.info("group %s member %s: %s; retrying", self.group, self.member_id, e)
        self._wake.set()

    async def _beat_loop(self) -> None:
        backoff = BACKOFF_S[0]
        while True:
            wait = backoff if self._failing_since is not None else self.interval_s
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            if self._failing_since is not None:
                failing_s = self.clock() - self._failing_since
                if failing_s >= self.session_timeout_ms / 1000:
                    self.fatal = LogbusError(
                        f"group {self.group!r}: no coordinator answered for {failing_s:.1f} s "
                        "(the session timeout)",
                        code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    )
                    self.on_change()
                    return
            before = (self.view, self.member_id)
            try:
                if self._rejoin_wanted:
                    await self._rejoin()
                elif not self._here():
                    ack, self._ack_wanted = self._ack_wanted, False
                    path = f"/members/{quote(self.member_id, safe='')}/heartbeat"
                    params = {"ack": "true" if ack else "false"}
                    try:
                        await self._adopt(await self._http("POST", path, params=params))
                    except LogbusError:
                        self._ack_wanted = self._ack_wanted or ack
                        raise
                    self._local = False
                    self._ok()
                elif self._failing_since is not None:
                    self.on_change()  # the push loop's in-process heartbeat tries again
            except (LogbusError, KeyError, TypeError, ValueError, RuntimeError) as e:
                if not isinstance(e, LogbusError):  # an answer not as expected: try again
                    log.warning("group %s: heartbeat failed: %r", self.group, e)
                    e = LogbusError(str(e), code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
                self._failed(e)
                if self.fatal is not None:
                    return
                backoff = min(backoff * 2, BACKOFF_S[1]) if self._failing_since else backoff
            else:
                backoff = BACKOFF_S[0]
            if (self.view, self.member_id) != before:
                self.on_change()

    async def _rejoin(self) -> None:
        log.info("group %s member %s was fenced; joining again", self.group, self.member_id)
        self.positions.clear()
        self.view = _NOTHING
        await self._join_once()
        self._rejoin_wanted = False
        self.rejoins += 1
        self._ok()

    # -- commits and leaving ---------------------------------------------------------------------

    async def commit(self, offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        """Commit at the member's generation, retried like a heartbeat; a commit past a
        position moves the position there (nothing below it is delivered again)."""

        async def once() -> None:
            member_id = self.member_id or None
            if self._here():
                epoch = None
                if member_id is not None:
                    epoch = self.coordinator.member(self.group, member_id).epoch
                await self.coordinator.commit(self.group, member_id, epoch, offsets)
                return
            body = {
                "member_id": member_id,
                "generation": self.view.epoch if member_id is not None else None,
                "offsets": [
                    {"topic": t, "partition": p, "offset": o, "metadata": m}
                    for (t, p), (o, m) in offsets.items()
                ],
            }
            await self._http("POST", "/offsets", json=body)

        await self._retrying(once)
        for tp, (offset, _) in offsets.items():
            pos = self.positions.get(tp)
            if (pos is None or pos < offset) and tp in self.view.assigned:
                self.positions[tp] = offset

    def close(self) -> None:
        """Leave the group (remotely in the background, bounded) and stop heartbeating."""
        if self._task is not None:
            self._task.cancel()
        if not self.member_id:
            return
        if self._here():
            with contextlib.suppress(LogbusError):
                self.coordinator.leave(self.group, self.member_id)
        else:
            task = asyncio.ensure_future(self._leave_remote(self.member_id))
            _leaving.add(task)
            task.add_done_callback(_leaving.discard)
        self.member_id = ""

    async def _leave_remote(self, member_id: str) -> None:
        with contextlib.suppress(LogbusError, RuntimeError):  # RuntimeError: shutting down
            await self._http("DELETE", f"/members/{quote(member_id, safe='')}")


_ENVELOPE = frozenset(("type", "title", "status", "code", "retriable", "detail"))


def _tps(docs: list[dict[str, Any]]) -> frozenset[TopicPartition]:
    return frozenset((d["topic"], d["partition"]) for d in docs)
