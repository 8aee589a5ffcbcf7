"""Idempotent produce over HTTP (Kafka semantics): retries append nothing and answer with the
original offsets; gaps are 409 OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is fenced."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import DefaultRecordBatchBuilder, assert_problem, create_topic, end_offsets

BATCH = "application/vnd.logbus.batch"


def session(http: httpx.Client, name: str | None = None) -> tuple[int, int]:
    body = {} if name is None else {"transactional_id": name}
    doc = http.post("/v1/producers", json=body).json()
    return doc["producer_id"], doc["producer_epoch"]


def produce(
    http: httpx.Client, topic: str, pid: int, epoch: int, seq: int, values: list[object]
) -> httpx.Response:
    return http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        json={"records": [{"value": v} for v in values]},
        headers={
            "Logbus-Producer-Id": str(pid),
            "Logbus-Producer-Epoch": str(epoch),
            "Logbus-Sequence": str(seq),
        },
    )


def offsets(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    return [o["offset"] for o in r.json()["offsets"]]


def values(http: httpx.Client, topic: str) -> list[object]:
    r = http.get(f"/v1/topics/{topic}/partitions/0/records", params={"offset": 0})
    return [rec["value"] for rec in r.json()["records"]]


def test_retry_gap_and_fencing(http: httpx.Client) -> None:
    topic = create_topic(http, "idem", partitions=1)
    pid, epoch = session(http, f"{topic}-app")
    assert offsets(produce(http, topic, pid, epoch, 0, ["a", "b", "c"])) == [0, 1, 2]
    retry = produce(http, topic, pid, epoch, 0, ["a", "b", "c"])
    assert offsets(retry) == [0, 1, 2] and retry.headers["logbus-duplicate"] == "true"
    assert offsets(produce(http, topic, pid, epoch, 3, ["d"])) == [3]
    gap = produce(http, topic, pid, epoch, 9, ["x"])
    body = assert_problem(gap, 409, "OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert (body["expected"], body["received"]) == (4, 9)
    _, new_epoch = session(http, f"{topic}-app")  # a new instance of the same app
    assert new_epoch == epoch + 1
    assert_problem(produce(http, topic, pid, epoch, 4, ["zombie"]), 409, "INVALID_PRODUCER_EPOCH")
    assert offsets(produce(http, topic, pid, new_epoch, 0, ["e"])) == [4]
    assert values(http, topic) == ["a", "b", "c", "d", "e"]
    assert end_offsets(http, topic) == [5]


def test_bad_sessions_are_400(http: httpx.Client) -> None:
    topic = create_topic(http, "idembad", partitions=2)
    h = {"Logbus-Producer-Id": "1", "Logbus-Producer-Epoch": "0"}  # no sequence
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records", json={"records": [{"value": 1}]}, headers=h
    )
    assert_problem(r, 400, "INVALID_REQUEST")
    h["Logbus-Sequence"] = "0"
    r = http.post(f"/v1/topics/{topic}/records", json={"records": [{"value": 1}]}, headers=h)
    assert_problem(r, 400, "INVALID_REQUEST")  # sequences are per partition: a path is needed
    assert end_offsets(http, topic) == [0, 0]


def kafka_idempotent_batch(pid: int, epoch: int, seq: int, n: int) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i in range(n):
        assert b.append(
            i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % (seq + i), headers=[]
        )
    return bytes(b.build())


def test_duplicate_batches_from_a_kafka_idempotent_builder(http: httpx.Client) -> None:
    topic = create_topic(http, "idembin", partitions=1)
    pid, epoch = session(http)
    url = f"/v1/topics/{topic}/partitions/0/records"
    first = kafka_idempotent_batch(pid, epoch, 0, 4)
    second = kafka_idempotent_batch(pid, epoch, 4, 2)
    assert offsets(http.post(url, content=first, headers={"content-type": BATCH})) == [0]
    assert offsets(http.post(url, content=second, headers={"content-type": BATCH})) == [4]
    again = http.post(url, content=first, headers={"content-type": BATCH})
    assert offsets(again) == [0] and again.headers["logbus-duplicate"] == "true"
    gap = kafka_idempotent_batch(pid, epoch, 10, 1)
    assert_problem(
        http.post(url, content=gap, headers={"content-type": BATCH}),
        409,
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
    )
    assert end_offsets(http, topic) == [6]


def test_retry_after_a_lost_response(http: httpx.Client, shared_broker: object) -> None:
    """The first attempt is sent and its connection dropped before the answer is read."""
    topic = create_topic(http, "idemlost", partitions=1)
    pid, epoch = session(http)
    body = b'{"records":[{"value":"once"}]}'
    url = httpx.URL(str(http.base_url))
    head = (
        f"POST /v1/topics/{topic}/partitions/0/records HTTP/1.1\r\nHost: {url.netloc.decode()}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Logbus-Producer-Id: {pid}\r\nLogbus-Producer-Epoch: {epoch}\r\nLogbus-Sequence: 0\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port), timeout=10) as s:
        s.sendall(head + body)
        s.recv(1)  # the broker has answered: the append happened; drop the rest of the answer
    retry = produce(http, topic, pid, epoch, 0, ["once"])
    assert offsets(retry) == [0] and retry.headers["logbus-duplicate"] == "true"
    assert values(http, topic) == ["once"]


def test_retry_after_a_crash_and_restart(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as http:
            topic = create_topic(http, "idemcrash", partitions=1)
            pid, epoch = session(http)
            for seq in range(0, 30, 3):
                assert offsets(produce(http, topic, pid, epoch, seq, [seq, seq + 1, seq + 2]))
        broker.kill()  # no clean shutdown: state comes from a snapshot + replay of the log
        broker.start()
        with make_client(broker) as http:
            retry = produce(http, topic, pid, epoch, 27, [27, 28, 29])
            assert offsets(retry) == [27, 28, 29] and retry.headers["logbus-duplicate"] == "true"
            assert_problem(
                produce(http, topic, pid, epoch, 31, [31]), 409, "OUT_OF_ORDER_SEQUENCE_NUMBER"
            )
            assert offsets(produce(http, topic, pid, epoch, 30, [30])) == [30]
            assert values(http, topic) == list(range(31))
    finally:
        broker.stop()


def test_fencing_survives_a_restart(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as http:
            topic = create_topic(http, "idemfence", partitions=1)
            pid, old = session(http, "svc")
            assert offsets(produce(http, topic, pid, old, 0, ["old"])) == [0]
            _, new = session(http, "svc")
        broker.kill()
        broker.start()
        with make_client(broker) as http:
            zombie = produce(http, topic, pid, old, 1, ["zombie"])
            assert_problem(zombie, 409, "INVALID_PRODUCER_EPOCH")
            assert offsets(produce(http, topic, pid, new, 0, ["new"])) == [1]
            assert values(http, topic) == ["old", "new"]
    finally:
        broker.stop()


# -- Idempotency-Key -----------------------------------------------------------------------------


def keyed(http: httpx.Client, url: str, key: str, **kwargs: object) -> httpx.Response:
    headers = {"Idempotency-Key": key, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return http.post(url, headers=headers, **kwargs)  # type: ignore[arg-type]


def test_idempotency_key_retries_answer_the_original_offsets(http: httpx.Client) -> None:
    topic = create_topic(http, "idemkey", partitions=3)
    body = {"records": [{"key": f"k{i}", "value": i} for i in range(12)] + [{"value": "nokey"}]}
    first = keyed(http, f"/v1/topics/{topic}/records", "order-42", json=body)
    assert first.status_code == 200, first.text
    ends = end_offsets(http, topic)
    for _ in range(3):
        again = keyed(http, f"/v1/topics/{topic}/records", "order-42", json=body)
        assert again.json() == first.json() and again.headers["logbus-duplicate"] == "true"
    assert end_offsets(http, topic) == ends and sum(ends) == 13
    other = keyed(http, f"/v1/topics/{topic}/records", "order-43", json=body)
    assert other.status_code == 200 and sum(end_offsets(http, topic)) == 26


def test_idempotency_key_with_another_body_is_422(http: httpx.Client) -> None:
    topic = create_topic(http, "idemkey422", partitions=1)
    url = f"/v1/topics/{topic}/records"
    assert keyed(http, url, "k-1", json={"records": [{"value": 1}]}).status_code == 200
    r = keyed(http, url, "k-1", json={"records": [{"value": 2}]})
    assert_problem(r, 422, "IDEMPOTENCY_KEY_REUSED")
    assert end_offsets(http, topic) == [1]
    assert_problem(
        keyed(http, url, "bad key", json={"records": [{"value": 1}]}), 400, "INVALID_REQUEST"
    )


def test_idempotency_key_with_ndjson_and_binary(http: httpx.Client) -> None:
    topic = create_topic(http, "idemkeyfmt", partitions=1)
    url = f"/v1/topics/{topic}/partitions/0/records"
    nd = {
        "content": b'{"value":1}\n{"value":2}\n',
        "headers": {"content-type": "application/x-ndjson"},
    }
    assert offsets(keyed(http, url, "nd-1", **nd)) == [0, 1]
    assert keyed(http, url, "nd-1", **nd).headers["logbus-duplicate"] == "true"
    batch = kafka_idempotent_batch(-1, -1, -1, 3)
    bin_ = {"content": batch, "headers": {"content-type": BATCH}}
    assert offsets(keyed(http, url, "bin-1", **bin_)) == [2]
    again = keyed(http, url, "bin-1", **bin_)
    assert offsets(again) == [2] and again.headers["logbus-duplicate"] == "true"
    assert end_offsets(http, topic) == [5]


def test_idempotency_key_survives_a_crash(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as http:
            topic = create_topic(http, "idemkeycrash", partitions=2)
            body = {"records": [{"value": i} for i in range(5)]}
            first = keyed(http, f"/v1/topics/{topic}/records", "pay-7", json=body).json()
        broker.kill()
        broker.start()
        with make_client(broker) as http:
            again = keyed(http, f"/v1/topics/{topic}/records", "pay-7", json=body)
            assert again.json() == first and again.headers["logbus-duplicate"] == "true"
            assert sum(end_offsets(http, topic)) == 5
    finally:
        broker.stop()


def test_idempotency_key_is_forgotten_after_its_window(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", env={"LOGBUS_IDEMPOTENCY_WINDOW_MS": "300"})
    try:
        with make_client(broker) as http:
            topic = create_topic(http, "idemwindow", partitions=1)
            url = f"/v1/topics/{topic}/records"
            body = {"records": [{"value": "x"}]}
            assert offsets(keyed(http, url, "w-1", json=body)) == [0]
            assert keyed(http, url, "w-1", json=body).headers.get("logbus-duplicate") == "true"
            time.sleep(0.6)
            late = keyed(http, url, "w-1", json=body)
            assert offsets(late) == [1] and "logbus-duplicate" not in late.headers
    finally:
        broker.stop()
