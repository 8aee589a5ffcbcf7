"""POST /v1/producers: producer ids are unique and never reused; a name bumps its epoch."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.api.conftest import make_client, start_broker
from tests.api.helpers import assert_problem


def init(http: httpx.Client, **body: object) -> tuple[int, int]:
    r = http.post("/v1/producers", json=body)
    assert r.status_code == 201, r.text
    doc = r.json()
    return doc["producer_id"], doc["producer_epoch"]


def test_anonymous_sessions_get_fresh_ids_at_epoch_zero(http: httpx.Client) -> None:
    sessions = [init(http) for _ in range(20)]
    ids = [pid for pid, _ in sessions]
    assert len(set(ids)) == 20 and ids == sorted(ids)
    assert {epoch for _, epoch in sessions} == {0}


def test_a_named_session_keeps_its_id_and_bumps_its_epoch(http: httpx.Client) -> None:
    first = init(http, transactional_id="app-orders-1")
    second = init(http, transactional_id="app-orders-1")
    other = init(http, transactional_id="app-orders-2")
    assert second == (first[0], first[1] + 1)
    assert other[0] not in (first[0],) and other[1] == 0


def test_bad_requests_are_400(http: httpx.Client) -> None:
    bad_name = http.post("/v1/producers", json={"transactional_id": "a/b"})
    assert_problem(bad_name, 400, "INVALID_REQUEST")
    assert_problem(http.post("/v1/producers", json={"unknown": 1}), 400, "INVALID_REQUEST")
    assert_problem(http.post("/v1/producers", json={"transactional_id": 7}), 400, "INVALID_REQUEST")


def test_ids_and_epochs_survive_a_restart_and_are_never_reused(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data")
    try:
        with make_client(broker) as http:
            before = [init(http) for _ in range(5)]
            named = init(http, transactional_id="svc")
        broker.kill()  # no clean shutdown: the allocation must already be durable
        broker.start()
        with make_client(broker) as http:
            after = init(http)
            assert after[0] > max(pid for pid, _ in before)
            assert after[0] != named[0]
            assert init(http, transactional_id="svc") == (named[0], named[1] + 1)
    finally:
        broker.stop()
