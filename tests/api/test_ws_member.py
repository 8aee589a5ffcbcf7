"""api.ws_member.GroupLink against a fake cluster (httpx.MockTransport coordinators): a
remote member joins, follows its coordinator across a failover and a 421, rejoins when fenced,
and gives up only after a session timeout without any coordinator."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx

from api import ws_protocol as proto
from api.ws_member import GroupLink
from core_log.errors import ErrorCode

TP = ("t", 0)
SESSION_MS = 900  # heartbeats every 300 ms: the tests take about a second each
WAIT_S = 20.0  # bound for a condition reached within a few heartbeats


class Cluster:
    """Brokers 2 and 3 as the HTTP they answer; ``down`` refuse connections."""

    def __init__(self) -> None:
        self.coordinator = 2
        self.down: set[int] = set()
        self.calls: list[tuple[int, str, str]] = []
        self.members = {"m1"}
        self.joins = 0
        self.answer: Callable[[int, httpx.Request], httpx.Response | None] = lambda b, r: None

    def handle(self, request: httpx.Request) -> httpx.Response:
        broker = int(request.url.host[1:])
        self.calls.append((broker, request.method, request.url.path))
        if broker in self.down:
            raise httpx.ConnectError("refused", request=request)
        special = self.answer(broker, request)
        if special is not None:
            return special
        path = request.url.path
        if path.endswith("/members") and request.method == "POST":
            self.joins += 1
            member = f"m{self.joins}"
            self.members.add(member)
            return httpx.Response(201, json=_assignment(member))
        if path.endswith("/heartbeat"):
            member = path.split("/")[-2]
            if member not in self.members:
                return _problem(ErrorCode.UNKNOWN_MEMBER_ID)
            return httpx.Response(200, json=_assignment(member))
        if path.endswith("/offsets") and request.method == "GET":
            offsets = [{"topic": "t", "partition": 0, "offset": 7, "metadata": "", "commit_ms": 0}]
            return httpx.Response(200, json={"group": "g", "offsets": offsets})
        if path.endswith("/offsets"):
            return httpx.Response(200, json={"group": "g", "offsets": []})
        return httpx.Response(404, json={})


def _assignment(member: str) -> dict[str, Any]:
    return {
        "member_id": member,
        "generation": 1,
        "assignment": [{"topic": "t", "partition": 0}],
        "revoking": [],
        "pending": [],
        "heartbeat_interval_ms": 300,
    }


def _problem(code: ErrorCode, **extra: Any) -> httpx.Response:
    body = {"code": code.name, "retriable": code.retriable, "detail": code.name, **extra}
    return httpx.Response(code.http_status, content=json.dumps(body).encode())


def _link(cluster: Cluster, changes: list[int]) -> GroupLink:
    async def known_reader(topic: str, partition: int) -> Any:
        return SimpleNamespace(log_start_offset=0, high_watermark=100)

    broker = SimpleNamespace(
        replicas=object(),
        config=SimpleNamespace(broker_id=1),
        coordinator_of=lambda group: cluster.coordinator,
        broker_url=lambda b: f"http://b{b}",
        known_reader=known_reader,
    )
    state: Any = SimpleNamespace(
        broker=broker,
        coordinator=SimpleNamespace(coordinates=lambda group: False),
        proxy=SimpleNamespace(
            client=httpx.AsyncClient(transport=httpx.MockTransport(cluster.handle)),
            inter_broker_headers=lambda scope: [],  # authentication off
        ),
    )
    join = proto.Join(group="g", topics=["t"], session_timeout_ms=SESSION_MS)
    return GroupLink(state, join, lambda: changes.append(1))


async def _until(done: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not done():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


def test_a_remote_member_follows_its_coordinator_across_a_failover() -> None:
    async def main() -> None:
        cluster = Cluster()
        link = _link(cluster, [])
        await link.join()
        assert link.member_id == "m1" and link.view.assigned == {TP}
        assert link.position(TP) == 7  # the committed offset
        link.advance(TP, 12)
        cluster.down.add(2)  # the coordinator dies ...
        await _until(lambda: any(b == 2 and "heartbeat" in p for b, _, p in cluster.calls), "hb")
        cluster.coordinator = 3  # ... and broker 3 is elected
        await _until(lambda: any(b == 3 and "heartbeat" in p for b, _, p in cluster.calls), "3")
        assert link.fatal is None and link.member_id == "m1" and link.rejoins == 0
        assert link.position(TP) == 12  # the session's position survives the move
        await link.commit({TP: (13, "")})
        assert cluster.calls[-1] == (3, "POST", "/v1/groups/g/offsets")
        assert link.position(TP) == 13
        link.close()
        await _until(lambda: cluster.calls[-1][1] == "DELETE", "the leave")

    asyncio.run(main())


def test_a_421_naming_the_coordinator_is_followed() -> None:
    async def main() -> None:
        cluster = Cluster()

        def not_here(broker: int, request: httpx.Request) -> httpx.Response | None:
            if broker == 2:
                return _problem(ErrorCode.NOT_COORDINATOR, coordinator_url="http://b3")
            return None

        cluster.answer = not_here
        link = _link(cluster, [])
        await link.join()
        assert [b for b, *_ in cluster.calls[:2]] == [2, 3] and link.member_id == "m1"
        link.close()

    asyncio.run(main())


def test_a_fenced_member_joins_again() -> None:
    async def main() -> None:
        cluster = Cluster()
        changes: list[int] = []
        link = _link(cluster, changes)
        await link.join()
        cluster.members.clear()  # its session expired on the coordinator
        await _until(lambda: link.rejoins == 1, "a rejoin")
        assert link.member_id == "m2" and link.fatal is None and changes
        link.close()

    asyncio.run(main())


def test_no_coordinator_for_a_session_timeout_ends_the_member() -> None:
    async def main() -> None:
        cluster = Cluster()
        changes: list[int] = []
        link = _link(cluster, changes)
        await link.join()
        cluster.down.update({2, 3})
        await _until(lambda: link.fatal is not None, "giving up")
        assert link.fatal is not None
        assert link.fatal.code is ErrorCode.COORDINATOR_NOT_AVAILABLE and changes
        try:
            link.reconcile(ack=False)
        except Exception as e:
            assert e is link.fatal
        else:
            raise AssertionError("reconcile after giving up must raise")
        link.close()

    asyncio.run(main())
