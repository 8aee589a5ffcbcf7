"""Transactions over HTTP on one broker, in-process: begin, produce in the transaction to
several partitions, commit or abort, and what read_committed and read_uncommitted readers see;
fencing (a newer session, the epoch bump at every end), timeouts, the admin list and abort."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from cluster.txn_state import txn_state_partition
from tests.api.inprocess import app_client

TXN = "/v1/transactions"


async def begin(c: httpx.AsyncClient, txn_id: str, **body: Any) -> tuple[int, int]:
    r = await c.post(f"{TXN}/{txn_id}", json=body)  # {} takes the defaults
    assert r.status_code == 201, r.text
    return r.json()["producer_id"], r.json()["producer_epoch"]


async def produce(
    c: httpx.AsyncClient,
    txn_id: str,
    session: tuple[int, int],
    topic: str,
    partition: int,
    values: list[Any],
    seq: int = 0,
) -> httpx.Response:
    return await c.post(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        json={"records": [{"value": v} for v in values]},
        headers={
            "Logbus-Transactional-Id": txn_id,
            "Logbus-Producer-Id": str(session[0]),
            "Logbus-Producer-Epoch": str(session[1]),
            "Logbus-Sequence": str(seq),
        },
    )


async def end(
    c: httpx.AsyncClient, txn_id: str, session: tuple[int, int], how: str = "commit"
) -> httpx.Response:
    return await c.post(
        f"{TXN}/{txn_id}/{how}",
        json={"producer_id": session[0], "producer_epoch": session[1]},
    )


async def values(
    c: httpx.AsyncClient, topic: str, partition: int, isolation: str = "read_committed"
) -> list[Any]:
    r = await c.get(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        params={"offset": 0, "isolation": isolation},
    )
    assert r.status_code == 200, r.text
    return [rec["value"] for rec in r.json()["records"]]


async def described_when(c: httpx.AsyncClient, txn_id: str, state: str) -> dict[str, Any]:
    """The transaction's description once it reaches ``state`` (polled, 10 s at most)."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        described: dict[str, Any] = (await c.get(f"{TXN}/{txn_id}")).json()
        if described["state"] == state or asyncio.get_running_loop().time() > deadline:
            assert described["state"] == state
            return described
        await asyncio.sleep(0.01)


async def topic(c: httpx.AsyncClient, name: str, partitions: int = 2) -> None:
    r = await c.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert r.status_code == 201, r.text


def test_commit_and_abort_across_partitions(tmp_path: Path) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, _):
            await topic(c, "a")
            await topic(c, "b", 1)
            s = await begin(c, "app-1")
            for t, p in (("a", 0), ("a", 1), ("b", 0)):
                r = await produce(c, "app-1", s, t, p, [f"{t}{p}-x", f"{t}{p}-y"])
                assert r.status_code == 200, r.text
            # open: read_uncommitted sees it, read_committed does not
            assert await values(c, "a", 0, "read_uncommitted") == ["a0-x", "a0-y"]
            assert await values(c, "a", 0) == []
            r = await end(c, "app-1", s)
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["completed"] is True
            nxt = (doc["producer_id"], doc["producer_epoch"])
            assert nxt == (s[0], s[1] + 1)  # KIP-890: the epoch is bumped at every end
            for t, p in (("a", 0), ("a", 1), ("b", 0)):
                assert await values(c, t, p) == [f"{t}{p}-x", f"{t}{p}-y"]
            # the next transaction runs at the new epoch; aborted, nobody committed sees it
            r = await produce(c, "app-1", nxt, "a", 0, ["gone"])
            assert r.status_code == 200, r.text
            r = await produce(c, "app-1", nxt, "b", 0, ["gone-too"])
            assert r.status_code == 200, r.text
            r = await end(c, "app-1", nxt, "abort")
            assert r.status_code == 200, r.text
            assert await values(c, "a", 0) == ["a0-x", "a0-y"]
            assert await values(c, "b", 0) == ["b0-x", "b0-y"]
            assert await values(c, "a", 0, "read_uncommitted") == ["a0-x", "a0-y", "gone"]
            # An end is answered once its markers are written; the COMPLETE record follows.
            described = await described_when(c, "app-1", "complete_abort")
            assert described["producer_epoch"] == s[1] + 2
            missing = await c.get(f"{TXN}/nobody")
            assert missing.status_code == 404
            assert missing.json()["code"] == "TRANSACTIONAL_ID_NOT_FOUND"
            # the partition listing carries the last stable offset
            parts = (await c.get("/v1/topics/a/partitions")).json()
            assert [p["last_stable_offset"] for p in parts] == [p["high_watermark"] for p in parts]

    asyncio.run(main())


def test_stale_epochs_are_fenced(tmp_path: Path) -> None:
    """A produce or a commit with the epoch of an ended transaction neither joins nor decides
    the next one (KAFKA-17754); a newer session fences the older one."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, _):
            await topic(c, "a")
            s1 = await begin(c, "app")
            assert (await produce(c, "app", s1, "a", 0, ["t1"])).status_code == 200
            r = await end(c, "app", s1)
            s2 = (r.json()["producer_id"], r.json()["producer_epoch"])
            again = await end(c, "app", s1)  # a retry of t1's commit: the same answer
            assert again.status_code == 200 and again.json() == r.json()
            assert (await produce(c, "app", s2, "a", 1, ["t2"])).status_code == 200
            # delayed writes and a delayed commit of transaction 1, once t2 has begun
            late = await produce(c, "app", s1, "a", 1, ["late"], seq=1)
            assert late.status_code == 409 and late.json()["code"] == "PRODUCER_FENCED"
            late_commit = await end(c, "app", s1)
            assert late_commit.status_code == 409
            assert late_commit.json()["code"] == "PRODUCER_FENCED"
            assert await values(c, "a", 1) == []  # t2 is still open: not committed by it
            # a new session fences s2: its transaction is aborted, its calls refused
            s3 = await begin(c, "app")
            assert s3[0] == s2[0] and s3[1] > s2[1]
            r = await end(c, "app", s2)
            assert r.status_code == 409 and r.json()["code"] == "PRODUCER_FENCED"
            assert await values(c, "a", 1) == []
            assert await values(c, "a", 1, "read_uncommitted") == ["t2"]

    asyncio.run(main())


def test_bad_requests_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, _):
            await topic(c, "a")
            s = await begin(c, "app")
            bad_id = await c.post(f"{TXN}/a%20b", json={})
            assert bad_id.status_code == 400
            r = await c.post(f"{TXN}/x", json={"transaction_timeout_ms": 900_001})
            assert r.status_code == 400 and r.json()["code"] == "INVALID_TRANSACTION_TIMEOUT"
            # a transactional produce needs a session, a partition path, acks=all
            r = await c.post(
                "/v1/topics/a/records",
                json={"records": [{"value": 1}]},
                headers={"Logbus-Transactional-Id": "app"},
            )
            assert r.status_code == 400
            r = await c.post(
                "/v1/topics/a/partitions/0/records?acks=1",
                json={"records": [{"value": 1}]},
                headers={
                    "Logbus-Transactional-Id": "app",
                    "Logbus-Producer-Id": str(s[0]),
                    "Logbus-Producer-Epoch": str(s[1]),
                    "Logbus-Sequence": "0",
                },
            )
            assert r.status_code == 400
            # a session that is not the id's
            r = await produce(c, "app", (s[0] + 1000, 0), "a", 0, ["x"])
            assert r.status_code == 409 and r.json()["code"] == "INVALID_PRODUCER_ID_MAPPING"
            r = await produce(c, "never-begun", s, "a", 0, ["x"])
            assert r.status_code == 409, r.text
            # commit with nothing open
            r = await end(c, "app", s)
            assert r.status_code == 409 and r.json()["code"] == "INVALID_TXN_STATE"
            assert await values(c, "a", 0, "read_uncommitted") == []

    asyncio.run(main())


def test_timeout_aborts_and_admin_lists_and_aborts(tmp_path: Path) -> None:
    async def main() -> None:
        async with app_client(
            tmp_path / "d", transaction_abort_timed_out_transaction_cleanup_interval_ms=3_600_000
        ) as (c, state):
            await topic(c, "a")
            s = await begin(c, "slow", transaction_timeout_ms=1)
            assert (await produce(c, "slow", s, "a", 0, ["x"])).status_code == 200
            h = await begin(c, "hang")
            assert (await produce(c, "hang", h, "a", 1, ["y"])).status_code == 200
            r = await c.get(TXN, params={"state": "ongoing"})
            assert r.status_code == 200, r.text
            listed = {t["transactional_id"]: t for t in r.json()["transactions"]}
            assert set(listed) == {"slow", "hang"}
            assert listed["hang"]["partitions"] == [{"topic": "a", "partitions": [1]}]
            # the timeout task (run now rather than after its interval) aborts "slow" only
            await asyncio.sleep(0.01)  # past the 1 ms timeout on the real clock
            assert await state.transactions.expire_now() >= 1
            r = await end(c, "slow", s)
            assert r.status_code == 409 and r.json()["code"] == "PRODUCER_FENCED"
            # an admin aborts the hanging one
            r = await c.post(f"{TXN}/hang/abort", json={})
            assert r.status_code == 200, r.text
            r = await c.get(TXN, params={"state": "ongoing"})
            assert r.json()["transactions"] == []
            assert await values(c, "a", 0) == [] and await values(c, "a", 1) == []
            # an LSO no longer held back: a plain record after them is visible
            r = await c.post("/v1/topics/a/partitions/0/records", json={"records": [{"value": 9}]})
            assert r.status_code == 200
            assert await values(c, "a", 0) == [9]
            bad = await c.get(TXN, params={"state": "nope"})
            assert bad.status_code == 400

    asyncio.run(main())


def test_single_request_commits_everything_or_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, _):
            await topic(c, "a")
            await topic(c, "b", 1)
            body = {
                "transactional_id": "one-shot",
                "records": [
                    {"topic": "a", "partition": 1, "value": "a1"},
                    {"topic": "b", "key": "k", "value": "b0"},
                    {"topic": "a", "partition": 1, "value": "a1-2"},
                    {"topic": "a", "partition": 0, "value": {"n": 1}},
                ],
            }
            r = await c.post(TXN, json=body)
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["completed"] is True
            assert [(o["topic"], o["partition"], o["offset"]) for o in doc["offsets"]] == [
                ("a", 1, 0),
                ("b", 0, 0),
                ("a", 1, 1),
                ("a", 0, 0),
            ]
            assert await values(c, "a", 1) == ["a1", "a1-2"]
            assert await values(c, "b", 0) == ["b0"]
            assert await values(c, "a", 0) == [{"n": 1}]
            # again: a second transaction (its own session), offsets after the first's marker
            r = await c.post(TXN, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["offsets"][0]["offset"] == 3
            # bad input anywhere in the body writes nothing anywhere
            for bad, status in (
                ({**body, "records": [*body["records"], {"topic": "nope", "value": 1}]}, 404),
                ({**body, "records": [*body["records"], {"value": 1}]}, 400),
                ({**body, "records": [{"topic": "a", "partition": 9, "value": 1}]}, 404),
                ({**body, "transactional_id": "a b"}, 400),
                ({"transactional_id": "x"}, 400),
                ({**body, "extra": 1}, 400),
            ):
                r = await c.post(TXN, json=bad)
                assert r.status_code == status, (bad, r.text)
            assert len(await values(c, "a", 1, "read_uncommitted")) == 4

    asyncio.run(main())


def test_an_open_transaction_survives_a_restart(tmp_path: Path) -> None:
    """The coordinator's state is its log: after a restart the open transaction is still
    open (its data invisible at read_committed, the last stable offset held at its start), and
    its producer commits it with the session it had."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, _):
            await topic(c, "a")
            s = await begin(c, "durable")
            assert (await produce(c, "durable", s, "a", 0, ["x", "y"])).status_code == 200
            assert (await produce(c, "durable", s, "a", 1, ["z"])).status_code == 200
        async with app_client(tmp_path / "d") as (c, _):
            assert await values(c, "a", 0) == []
            parts = (await c.get("/v1/topics/a/partitions")).json()
            assert [p["last_stable_offset"] for p in parts] == [0, 0]
            assert (await c.get(f"{TXN}/durable")).json()["state"] == "ongoing"
            r = await end(c, "durable", s)
            assert r.status_code == 200, r.text
            assert await values(c, "a", 0) == ["x", "y"] and await values(c, "a", 1) == ["z"]
        async with app_client(tmp_path / "d") as (c, _):
            # and the next session of the id continues from the bumped epoch
            assert await begin(c, "durable") == (s[0], s[1] + 2)
            assert await values(c, "a", 0) == ["x", "y"]

    asyncio.run(main())


async def committed(c: httpx.AsyncClient, group: str) -> dict[tuple[str, int], int]:
    r = await c.get(f"/v1/groups/{group}/offsets")
    if r.status_code == 404:
        return {}
    assert r.status_code == 200, r.text
    return {(o["topic"], o["partition"]): o["offset"] for o in r.json()["offsets"]}


def test_group_offsets_commit_with_the_transaction(tmp_path: Path) -> None:
    """Consume-transform-produce: the group's offsets move only when the transaction that
    wrote the output commits; an abort leaves them where they were."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, _):
            await topic(c, "in", 1)
            await topic(c, "out", 1)
            r = await c.post(
                "/v1/topics/in/partitions/0/records",
                json={"records": [{"value": i} for i in range(10)]},
            )
            assert r.status_code == 200
            s = await begin(c, "etl")
            assert (await produce(c, "etl", s, "out", 0, ["0-4"])).status_code == 200
            offsets = {
                "producer_id": s[0],
                "producer_epoch": s[1],
                "group_id": "etl-group",
                "offsets": [{"topic": "in", "partition": 0, "offset": 5}],
            }
            r = await c.post(f"{TXN}/etl/offsets", json=offsets)
            assert r.status_code == 200, r.text
            assert await committed(c, "etl-group") == {}  # pending until the commit
            r = await end(c, "etl", s)
            assert r.status_code == 200, r.text
            assert await committed(c, "etl-group") == {("in", 0): 5}
            # the next transaction is aborted: output and offsets both stay as they were
            s2 = (r.json()["producer_id"], r.json()["producer_epoch"])
            assert (await produce(c, "etl", s2, "out", 0, ["5-9"])).status_code == 200
            offsets.update(producer_id=s2[0], producer_epoch=s2[1])
            offsets["offsets"] = [{"topic": "in", "partition": 0, "offset": 10}]
            assert (await c.post(f"{TXN}/etl/offsets", json=offsets)).status_code == 200
            assert (await end(c, "etl", s2, "abort")).status_code == 200
            assert await committed(c, "etl-group") == {("in", 0): 5}
            assert await values(c, "out", 0) == ["0-4"]
            # a fenced session cannot add offsets
            stale = {**offsets, "producer_epoch": s[1]}
            r = await c.post(f"{TXN}/etl/offsets", json=stale)
            assert r.status_code == 409, r.text
            # the one-request form: records and offsets together
            r = await c.post(
                TXN,
                json={
                    "transactional_id": "etl",
                    "records": [{"topic": "out", "partition": 0, "value": "5-9"}],
                    "offsets": {
                        "group_id": "etl-group",
                        "offsets": [{"topic": "in", "partition": 0, "offset": 10}],
                    },
                },
            )
            assert r.status_code == 200, r.text
            assert await committed(c, "etl-group") == {("in", 0): 10}
            assert await values(c, "out", 0) == ["0-4", "5-9"]

    asyncio.run(main())


def test_concurrent_adds_of_a_session_share_a_write(tmp_path: Path) -> None:
    """Produces of one session to 8 partitions at once add their partitions to the transaction
    in at most two __transaction_state writes (the first, and one for all that arrived while
    it was written), and none is refused as concurrent."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, state):
            await topic(c, "wide", 8)
            s = await begin(c, "fan-out")

            def state_records() -> int:
                n = state.broker.topic("__transaction_state").partitions
                return sum(
                    state.broker.partition("__transaction_state", p).log_end_offset
                    for p in range(n)
                )

            before = state_records()
            answers = await asyncio.gather(
                *(produce(c, "fan-out", s, "wide", p, [p]) for p in range(8))
            )
            assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
            assert 1 <= state_records() - before <= 2
            described = (await c.get(f"{TXN}/fan-out")).json()
            assert described["partitions"] == [{"topic": "wide", "partitions": list(range(8))}]
            assert (await end(c, "fan-out", s)).status_code == 200
            assert [await values(c, "wide", p) for p in range(8)] == [[p] for p in range(8)]

    asyncio.run(main())


def test_end_answers_when_the_coordinator_unloads_mid_markers(tmp_path: Path) -> None:
    """An end whose markers are being written when this broker stops coordinating the id (its
    __transaction_state partition unloads: leadership moved, found in the cluster Jepsen run as
    a 500 on commit after a paused coordinator resumed) answers ``completed: false`` — the
    decision is durable, the next coordinator writes the markers — instead of failing with the
    cancelled marker task's CancelledError (a 500)."""

    async def main() -> None:
        async with app_client(tmp_path / "d") as (c, state):
            await topic(c, "a")
            s = await begin(c, "app")
            assert (await produce(c, "app", s, "a", 0, ["x"])).status_code == 200
            coordinator = state.transactions
            held = asyncio.Event()
            writing = asyncio.Event()

            async def stuck_marker(*args: Any, **kw: Any) -> None:
                writing.set()
                await held.wait()

            coordinator.broker.write_marker = stuck_marker  # type: ignore[method-assign,assignment]
            commit = asyncio.create_task(end(c, "app", s))
            await asyncio.wait_for(writing.wait(), 10)
            p = txn_state_partition("app", coordinator.partitions)
            coordinator._unload(p, "test: leadership moved")
            r = await asyncio.wait_for(commit, 10)
            assert r.status_code == 200, r.text
            assert r.json()["completed"] is False
            held.set()

    asyncio.run(main())
