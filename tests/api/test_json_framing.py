"""JSON values embedded in NDJSON lines and SSE events stay one line per record."""

from __future__ import annotations

import json

import httpx

from .helpers import create_topic

MULTILINE = b'{"records": [{"value": [1,\n 2]}, {"value": {"a":\r\n "x\\ny"}}, {"value": "z"}]}'


def test_values_with_line_breaks_keep_one_record_per_line(http: httpx.Client) -> None:
    topic = create_topic(http, "framing")
    r = http.post(
        f"/v1/topics/{topic}/partitions/0/records",
        content=MULTILINE,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text
    expected = [[1, 2], {"a": "x\ny"}, "z"]

    nd = http.get(
        f"/v1/topics/{topic}/partitions/0/records?offset=0",
        headers={"accept": "application/x-ndjson"},
    )
    lines = nd.text.splitlines()
    assert [json.loads(line)["value"] for line in lines] == expected

    doc = http.get(f"/v1/topics/{topic}/partitions/0/records?offset=0").json()
    assert [rec["value"] for rec in doc["records"]] == expected

    events: list[str] = []
    with http.stream(
        "GET",
        f"/v1/topics/{topic}/partitions/0/records?offset=0",
        headers={"accept": "text/event-stream"},
        timeout=10,
    ) as sse:
        for line in sse.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
            if len(events) == 3:
                break
    assert [json.loads(e)["value"] for e in events] == expected
