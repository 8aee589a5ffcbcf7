"""Health, readiness, metrics, the cluster resource, the offline docs and the OpenAPI document."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import httpx
import pytest
from fastapi.routing import APIRoute

from api.app import create_fastapi
from api.settings import Settings
from tests.api.helpers import create_topic, fetch_all, produce
from tests.server import BrokerProcess

EXPECTED_PATHS = {
    "/v1/topics": {"get", "post"},
    "/v1/topics/{topic}": {"get", "delete"},
    "/v1/topics/{topic}/configs": {"get", "patch"},
    "/v1/topics/{topic}/partitions": {"get", "post"},
    "/v1/topics/{topic}/partitions/{partition}/offsets": {"get"},
    "/v1/topics/{topic}/records": {"post"},
    "/v1/topics/{topic}/partitions/{partition}/records": {"get", "post"},
    "/v1/topics/{topic}/partitions/{partition}/replicas": {"put", "delete"},
    "/v1/cluster": {"get"},
    "/v1/cluster/brokers/{broker_id}/drain": {"post"},
    "/v1/producers": {"post"},
    "/v1/transactions": {"get", "post"},
    "/v1/transactions/{transactional_id}/offsets": {"post"},
    "/v1/transactions/{transactional_id}": {"get", "post"},
    "/v1/transactions/{transactional_id}/commit": {"post"},
    "/v1/transactions/{transactional_id}/abort": {"post"},
    "/v1/groups": {"get"},
    "/v1/groups/{group}": {"get", "delete"},
    "/v1/groups/{group}/members": {"post"},
    "/v1/groups/{group}/members/{member}": {"delete"},
    "/v1/groups/{group}/members/{member}/heartbeat": {"post"},
    "/v1/groups/{group}/members/{member}/records": {"get"},
    "/v1/groups/{group}/offsets": {"get", "post"},
    "/v1/groups/{group}/offsets/reset": {"post"},
    "/v1/quotas": {"get", "put", "delete"},
    "/v1/users": {"get", "post"},
    "/v1/users/{user}": {"delete"},
    "/v1/users/{user}/keys": {"get", "post"},
    "/v1/users/{user}/keys/{key_id}": {"delete"},
    "/v1/acls": {"get", "post", "delete"},
    "/v1/tokens": {"post"},
    "/v1/whoami": {"get"},
    "/healthz": {"get"},
    "/readyz": {"get"},
    "/metrics": {"get"},
}


def test_healthz_and_readyz(http: httpx.Client) -> None:
    r = http.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = http.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    assert r.headers["content-type"].startswith("application/json")


def test_cluster(http: httpx.Client, shared_broker: BrokerProcess) -> None:
    r = http.get("/v1/cluster")
    assert r.status_code == 200
    body = r.json()
    assert body["controller"] == 1 and body["broker_id"] == 1 and body["clustered"] is False
    [me] = body["brokers"]
    assert me["broker_epoch"] >= 1
    assert {k: v for k, v in me.items() if k != "broker_epoch"} == {
        "broker_id": 1,
        "host": "127.0.0.1",
        "port": shared_broker.port,
        "rack": None,
        "url": f"http://127.0.0.1:{shared_broker.port}",
        "alive": True,
    }
    health = body["partitions"]
    # One broker: every partition has its one replica in sync and led.
    assert health["total"] >= 0
    assert health["under_replicated"] == health["offline"] == health["unclean_elections"] == 0
    assert health["under_min_isr"] == 0


def _samples(text: str, name: str) -> dict[str, float]:
    """{label text: value} of one metric in the Prometheus text format."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m[1] or ""] = float(m[2])
    return out


def test_metrics(http: httpx.Client) -> None:
    topic = create_topic(http, "metrics", partitions=2)
    produce(http, topic, [{"value": i} for i in range(5)], partition=1)
    fetch_all(http, topic, 1)
    http.get(f"/v1/topics/{topic}/partitions/1/records", params={"offset": 99})  # a 416
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "# TYPE logbus_partition_high_watermark gauge" in text
    hw = _samples(text, "logbus_partition_high_watermark")
    assert hw[f'{{partition="1",topic="{topic}"}}'] == 5
    assert hw[f'{{partition="0",topic="{topic}"}}'] == 0
    leo = _samples(text, "logbus_partition_log_end_offset")
    assert leo[f'{{partition="1",topic="{topic}"}}'] == 5
    assert (
        _samples(text, "logbus_partition_log_start_offset")[f'{{partition="1",topic="{topic}"}}']
        == 0
    )
    assert _samples(text, "logbus_partition_size_bytes")[f'{{partition="1",topic="{topic}"}}'] > 0
    requests = _samples(text, "logbus_http_requests_total")
    assert requests['{method="POST",route="produce",status="200"}'] >= 1
    assert requests['{method="GET",route="fetch",status="200"}'] >= 1
    assert requests['{method="GET",route="fetch",status="416"}'] >= 1
    assert _samples(text, "logbus_records_in_total")[f'{{topic="{topic}"}}'] == 5
    assert _samples(text, "logbus_records_out_total")[f'{{topic="{topic}"}}'] >= 5
    assert _samples(text, "logbus_bytes_in_total")[f'{{topic="{topic}"}}'] > 0
    latency = _samples(text, "logbus_http_request_duration_seconds_count")
    assert latency['{route="produce"}'] >= 1 and latency['{route="fetch"}'] >= 2
    # A deleted topic's partitions leave the gauges.
    assert http.delete(f"/v1/topics/{topic}").status_code == 204
    assert f'topic="{topic}"' not in "\n".join(
        line
        for line in http.get("/metrics").text.splitlines()
        if line.startswith("logbus_partition_")
    )


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.urls.append(value)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_are_served_from_local_assets(http: httpx.Client, page: str) -> None:
    r = http.get(page)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    parser = _Assets()
    parser.feed(r.text)
    assets = [u for u in parser.urls if u.endswith((".js", ".css", ".png"))]
    assert assets, r.text
    for url in assets:
        assert url.startswith("/static-offline-docs/"), f"{page} loads {url} from elsewhere"
        got = http.get(url)
        assert got.status_code == 200, url
        assert len(got.content) > 1000, url
    assert "/openapi.json" in r.text
    assert "cdn.jsdelivr.net" not in r.text and "unpkg.com" not in r.text


def test_openapi_lists_every_path(http: httpx.Client) -> None:
    r = http.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["title"] == "Logbus"
    paths = doc["paths"]
    assert {p: set(ops) for p, ops in paths.items()} == EXPECTED_PATHS
    # Every API route of the app is documented (docs pages and static files aside).
    app = create_fastapi(Settings())
    for route in app.routes:
        if isinstance(route, APIRoute) and route.include_in_schema:
            assert route.path in paths, route.path
            for method in route.methods:
                assert method.lower() in paths[route.path], (route.path, method)
    # Errors are documented as problem+json, never as FastAPI's 422.
    for path, ops in paths.items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (path, method)
    produce_op = paths["/v1/topics/{topic}/partitions/{partition}/records"]["post"]
    content = produce_op["requestBody"]["content"]
    assert set(content) >= {
        "application/json",
        "application/x-ndjson",
        "application/vnd.logbus.batch",
    }
    fetch_op = paths["/v1/topics/{topic}/partitions/{partition}/records"]["get"]
    assert {"offset", "max_bytes", "max_records", "min_bytes", "wait_ms"} <= {
        p["name"] for p in fetch_op["parameters"]
    }
    assert "Problem" in doc["components"]["schemas"]


def test_unknown_paths_stay_problem_json_outside_v1(http: httpx.Client) -> None:
    r = http.get("/static-offline-docs/no-such-file.js")
    assert r.status_code == 404


def test_a_recreated_topic_starts_its_counters_afresh(http: httpx.Client) -> None:
    topic = create_topic(http, "metricsreset", partitions=1)
    produce(http, topic, [{"value": i} for i in range(5)])
    assert http.delete(f"/v1/topics/{topic}").status_code == 204
    assert f'topic="{topic}"' not in http.get("/metrics").text
    r = http.post("/v1/topics", json={"name": topic, "partitions": 1})
    assert r.status_code == 201
    produce(http, topic, [{"value": 1}, {"value": 2}])
    line = next(
        x
        for x in http.get("/metrics").text.splitlines()
        if x.startswith(f'logbus_records_in_total{{topic="{topic}"}}')
    )
    assert float(line.split()[-1]) == 2.0
