"""The shortest end-to-end path: create, produce, fetch."""

import httpx


def test_create_produce_fetch(client: httpx.Client) -> None:
    r = client.post("/v1/topics", json={"name": "smoke", "partitions": 1})
    assert r.status_code == 201, r.text
    r = client.post("/v1/topics/smoke/records", json={"records": [{"key": "k", "value": {"n": 1}}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"offsets": [{"partition": 0, "offset": 0}]}
    r = client.get("/v1/topics/smoke/partitions/0/records", params={"offset": 0})
    body = r.json()
    assert [(x["offset"], x["key"], x["value"]) for x in body["records"]] == [(0, "k", {"n": 1})]
    assert body["next_offset"] == 1 and r.headers["logbus-high-watermark"] == "1"


def test_answers_do_not_name_the_server_software(client: httpx.Client) -> None:
    """No ``Server`` field (docs/security.md; api.server.uvicorn_config), and the ``Date`` an
    origin server with a clock sends."""
    for r in (client.get("/healthz"), client.get("/v1/topics")):
        assert r.status_code == 200, r.text
        assert "server" not in r.headers and "date" in r.headers
