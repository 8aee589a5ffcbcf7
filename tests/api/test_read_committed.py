"""``isolation=read_committed`` on partition fetches (JSON, NDJSON, Kafka batches), in-process.

Transactional data cannot be produced over HTTP yet (issue 13 is being built: the coordinator
comes next), so the partition's log is written directly — committed, aborted and open
transactions, markers, plain batches — and read through the API. A ``read_committed`` fetch
answers only committed data below the last stable offset (``Logbus-Last-Stable-Offset``),
moves past aborted data and markers without stopping, and a long-poll at the last stable
offset wakes when a marker moves it.
"""

from __future__ import annotations

import asyncio
import time
from base64 import b64decode
from pathlib import Path
from typing import Any

import httpx

from api import streams
from core_log.batch import scan_batches
from tests.api.inprocess import app_client
from tests.core_log.test_transactions import plain, txn

URL = "/v1/topics/t/partitions/0/records"
BATCH = "application/vnd.logbus.batch"


async def _fetch(c: httpx.AsyncClient, **params: Any) -> httpx.Response:
    accept = params.pop("accept", "application/json")
    r = await c.get(URL, params=params, headers={"accept": accept})
    assert r.status_code == 200, r.text
    return r


async def _topic(c: httpx.AsyncClient, state: Any) -> Any:
    """Topic ``t`` (one partition), and its partition, to write transactions into directly."""
    assert (await c.post("/v1/topics", json={"name": "t", "partitions": 1})).is_success
    return state.broker.logs.get("t", 0)


def _values(r: httpx.Response) -> list[tuple[int, str]]:
    """(offset, value) of a JSON answer (these values are not JSON: ``value_b64``)."""
    return [(rec["offset"], b64decode(rec["value_b64"]).decode()) for rec in r.json()["records"]]


def test_read_committed_fetch(tmp_path: Path) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, state):
            p = await _topic(c, state)
            await p.append(plain(b"p0"))  # 0
            await p.append(txn(1, 0, b"a1", b"a2"), transactional=True)  # 1-2, aborted
            await p.append(txn(2, 0, b"b1"), transactional=True)  # 3, committed
            await p.append_marker(1, 0, False, 0)  # 4: ABORT
            await p.append_marker(2, 0, True, 0)  # 5: COMMIT
            await p.append(txn(3, 0, b"c1"), transactional=True)  # 6: open
            await p.append(plain(b"p7"))  # 7

            r = await _fetch(c, offset=0, isolation="read_committed")
            assert _values(r) == [(0, "p0"), (3, "b1")]
            doc = r.json()
            assert (doc["next_offset"], doc["last_stable_offset"], doc["high_watermark"]) == (
                6,
                6,
                8,
            )
            assert doc["lag"] == 0  # nothing more is visible at read_committed
            assert r.headers["Logbus-Last-Stable-Offset"] == "6"
            assert r.headers["Logbus-Lag"] == "0"
            # read_uncommitted (the default) sees everything but the markers, up to the HW
            r = await _fetch(c, offset=0)
            assert [v for _, v in _values(r)] == ["p0", "a1", "a2", "b1", "c1", "p7"]
            assert "last_stable_offset" not in r.json()
            assert "Logbus-Last-Stable-Offset" not in r.headers
            # From inside the aborted transaction, and from a marker: on past them at once.
            assert _values(await _fetch(c, offset=1, isolation="read_committed")) == [(3, "b1")]
            r = await _fetch(c, offset=4, isolation="read_committed")
            assert _values(r) == [] and r.json()["next_offset"] == 6
            # NDJSON and Kafka batches filter the same way.
            r = await _fetch(c, offset=0, isolation="read_committed", accept="application/x-ndjson")
            assert [line for line in r.text.splitlines() if line].__len__() == 2
            assert r.headers["Logbus-Next-Offset"] == "6"
            r = await _fetch(c, offset=0, isolation="read_committed", accept=BATCH)
            batches = [h for _, h in scan_batches(r.content)]
            assert [(h.base_offset, h.is_control) for h in batches] == [(0, False), (3, False)]
            assert r.headers["Logbus-Next-Offset"] == "6"
            # A long-poll at the last stable offset wakes when the open transaction commits.
            poll = asyncio.create_task(
                _fetch(c, offset=6, isolation="read_committed", wait_ms=20_000)
            )
            await asyncio.sleep(0)  # the poll is in flight (it waits on the partition)
            await p.append_marker(3, 0, True, 0)  # 8: COMMIT
            r = await asyncio.wait_for(poll, 15)
            assert _values(r) == [(6, "c1"), (7, "p7")]
            assert r.json()["last_stable_offset"] == 9
            # Bad isolation values are refused.
            bad = await c.get(URL, params={"offset": 0, "isolation": "serializable"})
            assert bad.status_code == 400 and "isolation must be" in bad.json()["detail"]

    asyncio.run(main())


def test_a_read_committed_member_starting_at_latest_starts_at_the_last_stable_offset(
    tmp_path: Path,
) -> None:
    """``auto_offset_reset=latest`` at read_committed is the last stable offset (Kafka's
    rule): a transaction open when the member joins is read once it commits, not skipped."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, state):
            p = await _topic(c, state)
            await p.append(plain(b"p0"))  # 0
            await p.append(txn(7, 0, b"t1", b"t2"), transactional=True)  # 1-2: open
            await p.append(plain(b"p3"))  # 3
            joined = await c.post(
                "/v1/groups/late/members", json={"topics": ["t"], "auto_offset_reset": "latest"}
            )
            assert joined.status_code == 201, joined.text
            url = f"/v1/groups/late/members/{joined.json()['member_id']}/records"
            r = await c.get(url, params={"isolation": "read_committed"})
            assert r.status_code == 200 and _values(r) == []
            await p.append_marker(7, 1, True, 0)  # 4: COMMIT
            r = await c.get(url, params={"isolation": "read_committed", "wait_ms": 10_000})
            assert _values(r) == [(1, "t1"), (2, "t2"), (3, "p3")]

    asyncio.run(main())


def _event_offsets(chunk: bytes) -> list[int]:
    return [int(line[3:]) - 1 for line in chunk.split(b"\n") if line.startswith(b"id:")]


def test_read_committed_server_sent_events(tmp_path: Path) -> None:
    """The partition stream at read_committed: committed records only, on past aborted data
    and markers, and it waits at the last stable offset (no busy loop while a transaction is
    open above it) until a marker moves it."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, state):
            p = await _topic(c, state)
            await p.append(plain(b"p0"))  # 0
            await p.append(txn(1, 0, b"a1", b"a2"), transactional=True)  # 1-2, aborted
            await p.append_marker(1, 0, False, 0)  # 3: ABORT
            await p.append(txn(3, 0, b"c1"), transactional=True)  # 4: open
            await p.append(plain(b"p5"))  # 5
            stream = streams.partition_sse(
                state.broker, "t", 0, 0, 100, state.budgets.stream, committed=True
            )
            assert (await anext(stream)).startswith(b"retry:")
            assert _event_offsets(await anext(stream)) == [0]
            following = asyncio.create_task(anext(stream))
            # It passes over the aborted data and the marker, then waits on the partition for
            # the high watermark to move: one waiter (not a loop of reads returning nothing).
            for _ in range(1000):
                if p.waiter_count:
                    break
                await asyncio.sleep(0.01)
            assert p.waiter_count == 1 and not following.done()
            await p.append_marker(3, 0, True, 0)  # 6: COMMIT: the LSO moves to 7
            assert _event_offsets(await asyncio.wait_for(following, 10)) == [4, 5]
            await stream.aclose()

    asyncio.run(main())


def test_read_committed_member_poll(tmp_path: Path) -> None:
    """A member's poll at read_committed: committed records only; a position in front of
    aborted data and markers passes them within the same poll, and a long-poll at the last
    stable offset answers when a marker moves it."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, state):
            p = await _topic(c, state)
            await p.append(txn(1, 0, b"a1", b"a2"), transactional=True)  # 0-1, aborted
            await p.append_marker(1, 0, False, 0)  # 2: ABORT
            await p.append(plain(b"p3"))  # 3
            await p.append(txn(2, 0, b"b1"), transactional=True)  # 4: open
            await p.append(plain(b"p5"))  # 5
            joined = await c.post(
                "/v1/groups/g/members",
                json={"topics": ["t"], "auto_offset_reset": "earliest"},
            )
            assert joined.status_code == 201, joined.text
            url = f"/v1/groups/g/members/{joined.json()['member_id']}/records"
            committed = {"isolation": "read_committed", "max_bytes": 60}  # one batch a read

            async def poll(**params: Any) -> httpx.Response:
                r = await c.get(url, params={**committed, **params})
                assert r.status_code == 200, r.text
                return r

            r = await poll(wait_ms=10_000)
            assert _values(r) == [(3, "p3")]
            assert r.json()["positions"][0]["next_offset"] == 4
            waiting = asyncio.create_task(poll(wait_ms=20_000))
            for _ in range(1000):  # the poll waits on the partition
                if p.waiter_count:
                    break
                await asyncio.sleep(0.01)
            assert p.waiter_count == 1 and not waiting.done()
            await p.append_marker(2, 0, True, 0)  # 6: COMMIT
            r = await asyncio.wait_for(waiting, 15)
            assert _values(r)[0] == (4, "b1")

    asyncio.run(main())


def test_read_committed_websocket(tmp_path: Path) -> None:
    """A WebSocket subscription at read_committed pushes committed records only, passes over
    aborted data and markers, and pushes the open transaction's records once it commits."""
    import concurrent.futures
    import contextlib
    import warnings

    from api.app import create_app
    from api.settings import Settings

    with warnings.catch_warnings():  # starlette asks for httpx2; the httpx it supports is here
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    fast = create_app(Settings(data_dir=tmp_path / "d", loop_lag_interval_ms=0))
    with TestClient(fast, base_url="http://127.0.0.1:8080") as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": 1}).is_success
        state = fast.app.state.logbus  # type: ignore[attr-defined]
        p = state.broker.logs.get("t", 0)

        def run(coro_fn: Any, *args: Any, **kwargs: Any) -> Any:
            async def call() -> Any:
                return await coro_fn(*args, **kwargs)

            assert client.portal is not None
            return client.portal.call(call)  # on the app's event loop

        run(p.append, plain(b"p0"))  # 0
        run(p.append, txn(1, 0, b"a1", b"a2"), transactional=True)  # 1-2, aborted
        run(p.append_marker, 1, 0, False, 0)  # 3: ABORT
        run(p.append, plain(b"p4"))  # 4
        run(p.append, txn(2, 0, b"b1"), transactional=True)  # 5: open
        run(p.append, plain(b"p6"))  # 6
        # Leaving a session, TestClient may cancel the app's task while the session is still
        # shutting down (its own race, see tests/api/test_access.py::_ws): not the test's.
        session = client.websocket_connect("ws://127.0.0.1:8080/v1/ws")
        ws = session.__enter__()
        try:
            ws.send_json(
                {
                    "op": "subscribe",
                    "id": 1,
                    "partitions": [{"topic": "t", "partition": 0, "offset": 0}],
                    "isolation": "read_committed",
                }
            )
            subscribed = ws.receive_json()
            assert subscribed["type"] == "subscribed", subscribed
            ws.send_json({"op": "credit", "id": 2, "records": 100})
            got: list[int] = []
            while len(got) < 2:
                frame = ws.receive_json()
                if frame["type"] == "records":
                    got += [r["offset"] for r in frame["records"]]
            assert got == [0, 4]  # then it waits at the last stable offset, 5:
            deadline = time.monotonic() + 10  # on the partition (not reading again and again)
            while p.waiter_count == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert p.waiter_count == 1
            run(p.append_marker, 2, 0, True, 0)  # 7: COMMIT
            while len(got) < 4:
                frame = ws.receive_json()
                if frame["type"] == "records":
                    got += [r["offset"] for r in frame["records"]]
            assert got == [0, 4, 5, 6]
        finally:
            with contextlib.suppress(concurrent.futures.CancelledError):
                session.__exit__(None, None, None)
