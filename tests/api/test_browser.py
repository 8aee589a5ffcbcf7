"""End to end with a real browser: Chromium's ``EventSource`` and ``WebSocket`` against a live
broker, driven by Playwright.

The browser is Debian's Chromium (``/usr/bin/chromium``), never one Playwright downloads. The
page is the broker's own ``/healthz`` (same origin, so no CORS is involved); the test code runs
in it with ``page.evaluate``. Skipped, saying why, where the browser or the ``playwright``
package is missing. To run it::

    apt-get install -y chromium          # Debian's package: /usr/bin/chromium
    .venv/bin/pip install playwright     # the Python package only; no `playwright install`
    .venv/bin/pytest tests/api/test_browser.py
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.ws_protocol import parse_binary_frame
from core_log.batch import iter_records
from tests.api.conftest import make_client, start_broker
from tests.api.helpers import create_topic, produce
from tests.server import BrokerProcess

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 10_000

if not Path(CHROMIUM).exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is missing (pip install playwright)"
)

# Collects the records of one partition with an EventSource, into window.sse; resolves at once.
OPEN_SSE = """
({url}) => {
  const state = {got: [], opens: 0, errors: 0};
  window.sse = state;
  const source = new EventSource(url);
  window.source = source;
  source.onopen = () => { state.opens += 1; };
  source.onerror = () => { state.errors += 1; };
  source.onmessage = (e) => {
    state.got.push({id: e.lastEventId, data: JSON.parse(e.data)});
  };
}
"""

# A WebSocket session: subscribe, grant credit in steps, produce, collect; resolves with what
# arrived, or rejects with a reason.
WEBSOCKET_SESSION = """
async ({wsUrl, topic, timeoutMs}) => {
  const ws = new WebSocket(wsUrl);
  const inbox = [];
  let wake = null;
  ws.onmessage = (e) => { inbox.push(JSON.parse(e.data)); if (wake) wake(); };
  const closed = new Promise((resolve) => { ws.onclose = (e) => resolve(e.code); });
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = () => reject(new Error("websocket failed to open"));
  });
  const next = async (type) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = inbox.findIndex((m) => m.type === type);
      if (i >= 0) return inbox.splice(i, 1)[0];
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${type} message; inbox: ${JSON.stringify(inbox)}`);
      await new Promise((resolve) => { wake = resolve; setTimeout(resolve, left); });
    }
  };
  const records = async (n) => {
    const out = [];
    while (out.length < n) out.push(...(await next("records")).records);
    return out;
  };
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const send = (doc) => ws.send(JSON.stringify(doc));

  send({op: "subscribe", id: 1, partitions: [{topic, partition: 0, offset: 0}]});
  const subscribed = await next("subscribed");
  await pause(300);
  const beforeCredit = inbox.length;
  send({op: "credit", records: 3});
  const first = await records(3);
  await pause(300);
  const afterThree = inbox.filter((m) => m.type === "records").length;
  send({op: "credit", records: 100});
  const rest = await records(2);
  // Produce over the same socket: the reply, then the records pushed back to us.
  send({op: "produce", id: "p", topic, partition: 0, records: [{value: {from: "browser"}}]});
  const produced = await next("produced");
  const echoed = await records(1);
  send({op: "nonsense", id: 7});
  const error = await next("error");
  ws.close(1000, "done");
  const code = await closed;
  return {subscribed, beforeCredit, first, afterThree, rest, produced, echoed, error, code};
}
"""

# Binary frames: the raw bytes of each frame, base64, for the test to parse.
BINARY_SESSION = """
async ({wsUrl, topic, n, timeoutMs}) => {
  const ws = new WebSocket(wsUrl);
  ws.binaryType = "arraybuffer";
  const frames = [];
  const texts = [];
  let count = 0;
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`timeout: ${frames.length} frames, ${JSON.stringify(texts)}`)),
      timeoutMs);
    ws.onmessage = (e) => {
      if (typeof e.data === "string") { texts.push(JSON.parse(e.data)); return; }
      const bytes = new Uint8Array(e.data);
      let s = "";
      for (const b of bytes) s += String.fromCharCode(b);
      frames.push(btoa(s));
      // u16 topic length | topic | i32 partition | batches: record count at batch offset 57
      const view = new DataView(e.data);
      let at = 2 + view.getUint16(0) + 4;
      while (at < bytes.length) {
        count += view.getInt32(at + 57);
        at += 12 + view.getInt32(at + 8);
      }
      if (count >= n) { clearTimeout(timer); resolve(); }
    };
  });
  await new Promise((resolve) => { ws.onopen = resolve; });
  ws.send(JSON.stringify({op: "subscribe", topics: [topic], from: "earliest", format: "binary"}));
  ws.send(JSON.stringify({op: "credit", records: 1000}));
  await done;
  ws.close();
  return {frames, texts, count};
}
"""


@pytest.fixture(scope="module")
def browser_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """This module's own broker: the SSE test restarts it."""
    b = start_broker(tmp_path_factory.mktemp("browser") / "data")
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def page(browser_broker: BrokerProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page()
            pg.set_default_timeout(TIMEOUT_MS)
            r = pg.goto(browser_broker.url + "/healthz")
            assert r is not None and r.ok
            yield pg
        finally:
            browser.close()


@pytest.fixture
def client(browser_broker: BrokerProcess) -> Iterator[httpx.Client]:
    with make_client(browser_broker) as c:
        yield c


def test_browser_websocket_credit_produce_and_errors(
    browser_broker: BrokerProcess, page: Any, client: httpx.Client
) -> None:
    topic = create_topic(client, "browser-ws")
    produce(client, topic, [{"key": f"k{i}", "value": {"n": i}} for i in range(5)], partition=0)
    ws_url = browser_broker.url.replace("http://", "ws://", 1) + "/v1/ws"
    got = page.evaluate(WEBSOCKET_SESSION, {"wsUrl": ws_url, "topic": topic, "timeoutMs": 5000})
    assert got["subscribed"]["partitions"] == [{"topic": topic, "partition": 0, "offset": 0}]
    assert got["beforeCredit"] == 0  # nothing without credit
    assert [r["offset"] for r in got["first"]] == [0, 1, 2]
    assert got["afterThree"] == 0  # nothing past the credit of 3
    assert [r["offset"] for r in got["rest"]] == [3, 4]
    assert [(r["key"], r["value"]) for r in got["first"] + got["rest"]] == [
        (f"k{i}", {"n": i}) for i in range(5)
    ]
    assert got["produced"]["offsets"] == [{"partition": 0, "offset": 5}]
    assert [(r["offset"], r["value"]) for r in got["echoed"]] == [(5, {"from": "browser"})]
    assert (got["error"]["id"], got["error"]["code"]) == (7, "INVALID_REQUEST")
    assert got["code"] == 1000


def test_browser_websocket_binary_frames(
    browser_broker: BrokerProcess, page: Any, client: httpx.Client
) -> None:
    topic = create_topic(client, "browser-bin", partitions=2)
    for p in range(2):
        produce(client, topic, [{"value": f"{p}-{i}"} for i in range(3)], partition=p)
        produce(client, topic, [{"value": f"{p}-{i}"} for i in range(3, 5)], partition=p)
    ws_url = browser_broker.url.replace("http://", "ws://", 1) + "/v1/ws"
    got = page.evaluate(
        BINARY_SESSION, {"wsUrl": ws_url, "topic": topic, "n": 10, "timeoutMs": 5000}
    )
    assert got["count"] == 10, got
    assert [m["type"] for m in got["texts"]] == ["subscribed"], got["texts"]
    seen: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: []}
    for frame in got["frames"]:
        t, p, batches = parse_binary_frame(base64.b64decode(frame))
        assert t == topic
        seen[p].extend((r.offset, r.value) for r in iter_records(batches))
    for p in range(2):
        assert seen[p] == [(i, f'"{p}-{i}"'.encode()) for i in range(5)]


def test_browser_event_source_resumes_after_a_broker_restart(
    browser_broker: BrokerProcess, page: Any, client: httpx.Client
) -> None:
    topic = create_topic(client, "browser-sse")
    produce(client, topic, [{"value": i} for i in range(5)], partition=0)
    url = f"{browser_broker.url}/v1/topics/{topic}/partitions/0/records?offset=0"
    page.evaluate(OPEN_SSE, {"url": url})
    try:
        page.wait_for_function("window.sse.got.length >= 5")
        # The connection drops; EventSource reconnects by itself (retry: 1000 ms) and sends
        # Last-Event-ID, so the stream goes on from the next offset, not from ?offset=0.
        browser_broker.restart()
        produce(client, topic, [{"value": i} for i in range(5, 8)], partition=0)
        page.wait_for_function("window.sse.got.length >= 8 && window.sse.opens >= 2")
        page.wait_for_timeout(300)
        state = page.evaluate("window.sse")
    finally:
        page.evaluate("window.source.close()")
    assert state["errors"] >= 1 and state["opens"] >= 2, state
    assert [e["id"] for e in state["got"]] == [str(i + 1) for i in range(8)]
    assert [(e["data"]["offset"], e["data"]["value"]) for e in state["got"]] == [
        (i, i) for i in range(8)
    ]


def test_chromium_is_debian_s(page: Any) -> None:
    """The browser driven is the system one, not a download."""
    assert shutil.which("chromium") == CHROMIUM
    assert "Chrome/" in page.evaluate("navigator.userAgent")
