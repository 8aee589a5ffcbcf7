"""``python -m benchmarks.quota_plot``: a throttled client's byte rate over time, for the
quotas section of docs/security.md.

Theory of operation
-------------------
One broker with Kafka's default windows (11 x 1 s). Two producers flood it from threads of this
process, each with its own client id and the same ``producer_byte_rate``: a *greedy* one that
sends its next request as soon as an answer comes (the broker holds it) and an *obedient* one
that first waits the answer's ``Logbus-Throttle-Time-Ms`` (KIP-219's client behaviour: it is
never held). Each request is 16 KiB, 1/16 of a second's quota, so the client's rate is
measured in steps finer than the 1 s bars. Halfway the quota is halved with ``PUT /v1/quotas``,
to show that a change applies at runtime, on the next request.

What the plot shows (figures from the committed run in ``docs/quota-plot.json``): both clients
at the quota from their second 1 s window on; at the cut, the rate measured over the span is
twice the new quota, so the next request is held ``(O - T) / T * W``, one whole span (11 s, the
cap) by Kafka's formula, which assumes nothing leaves the window meanwhile; then both run at the
new quota. Rates are per 1 s by answer time, as the client sees them.

Output: ``--json`` (default ``docs/quota-plot.json``: settings, per-second bytes per client,
the headers of one throttled answer) and ``--plot`` (default ``docs/quota-plot.png``; needs
matplotlib, the ``bench`` extra). A run takes about ``--seconds`` (default 44).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from api.process import BrokerProcess

QUOTA = 256 * 1024  # bytes/s before the cut; half of it after
REQUEST_BYTES = 16 * 1024
CLIENTS = {"greedy": False, "obedient": True}  # client id -> waits the throttle time
SHOWN_HEADERS = ("logbus-throttle-time-ms", "retry-after", "ratelimit", "ratelimit-policy")


def _set_quota(url: str, cid: str, rate: int) -> None:
    body = {"entity": {"client_id": cid}, "quotas": {"producer_byte_rate": rate}}
    r = httpx.put(f"{url}/v1/quotas", json=body, timeout=30)
    r.raise_for_status()


def _flood(
    url: str, cid: str, obey: bool, t0: float, end: float, log: list[tuple[float, int, int]]
) -> None:
    """Produce until ``end``; log (answer time since t0, bytes, throttle ms) per answer."""
    value = "x" * (REQUEST_BYTES - 64)
    body = {"records": [{"value": value}]}
    with httpx.Client(base_url=url, timeout=60, headers={"Logbus-Client-Id": cid}) as c:
        while time.monotonic() < end:
            request = c.build_request("POST", "/v1/topics/quota-plot/records", json=body)
            r = c.send(request)
            r.raise_for_status()
            throttle = int(r.headers["logbus-throttle-time-ms"])
            log.append((time.monotonic() - t0, len(request.content), throttle))
            if obey and throttle:
                time.sleep(min(throttle / 1000, max(end - time.monotonic(), 0)))


def run(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="quota-plot-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", env={"LOGBUS_LOOP_LAG_INTERVAL_MS": "0"})
        broker.start()
        try:
            httpx.post(f"{broker.url}/v1/topics", json={"name": "quota-plot"}, timeout=30)
            for cid in CLIENTS:
                _set_quota(broker.url, cid, QUOTA)
            logs: dict[str, list[tuple[float, int, int]]] = {cid: [] for cid in CLIENTS}
            t0 = time.monotonic()
            cut_at = seconds / 2
            threads = [
                threading.Thread(
                    target=_flood, args=(broker.url, cid, obey, t0, t0 + seconds, logs[cid])
                )
                for cid, obey in CLIENTS.items()
            ]
            for t in threads:
                t.start()
            time.sleep(cut_at)  # the schedule of the run, not a synchronisation
            for cid in CLIENTS:
                _set_quota(broker.url, cid, QUOTA // 2)
            cut_done = time.monotonic() - t0
            # One throttled answer's headers, as a client sees them (a third client id).
            _set_quota(broker.url, "shown", QUOTA // 2)
            shown: dict[str, str] = {}
            with httpx.Client(base_url=broker.url, timeout=60) as c:
                for _ in range(3):
                    r = c.post(
                        "/v1/topics/quota-plot/records",
                        headers={"Logbus-Client-Id": "shown"},
                        json={"records": [{"value": "y" * 100_000}]},
                    )
                    shown = {k: r.headers[k] for k in SHOWN_HEADERS if k in r.headers}
            for t in threads:
                t.join()
        finally:
            broker.stop()
    per_second = {
        cid: [
            sum(n for t, n, _ in log if second <= t < second + 1) for second in range(int(seconds))
        ]
        for cid, log in logs.items()
    }
    return {
        "settings": {
            "quota_window_num": 11,
            "quota_window_size_seconds": 1,
            "producer_byte_rate_before": QUOTA,
            "producer_byte_rate_after": QUOTA // 2,
            "cut_at_s": round(cut_done, 2),
            "request_bytes": REQUEST_BYTES,
            "seconds": seconds,
            "machine": f"{platform.machine()} {platform.python_implementation()} "
            f"{platform.python_version()}",
        },
        "bytes_per_second": per_second,
        "max_throttle_ms": {cid: max(t for _, _, t in log) for cid, log in logs.items()},
        "throttled_answer_headers": shown,
    }


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = out["settings"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    seconds = int(s["seconds"])
    kib = 1024
    cut = s["cut_at_s"]
    ax.step(
        [0, cut, cut, seconds],
        [s["producer_byte_rate_before"] / kib] * 2 + [s["producer_byte_rate_after"] / kib] * 2,
        color="black",
        linestyle="--",
        linewidth=1.2,
        label="producer_byte_rate (quota)",
    )
    width = 0.4
    for k, (cid, series) in enumerate(out["bytes_per_second"].items()):
        xs = [i + 0.5 + (k - 0.5) * width for i in range(len(series))]
        ax.bar(xs, [b / kib for b in series], width, label=f"{cid} client, per 1 s")
    ax.axvline(cut, color="grey", linewidth=0.8)
    ax.text(cut + 0.3, s["producer_byte_rate_before"] / kib * 1.25, "PUT /v1/quotas: halved")
    ax.set_xlim(0, seconds)
    ax.set_ylim(0, s["producer_byte_rate_before"] / kib * 1.5)
    ax.set_xlabel("seconds")
    ax.set_ylabel("KiB/s produced")
    ax.set_title(
        f"a flooding producer under producer_byte_rate ({s['quota_window_num']} x "
        f"{s['quota_window_size_seconds']} s windows, {s['request_bytes'] // kib} KiB requests)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=44.0)
    parser.add_argument("--json", default="docs/quota-plot.json", help="'' for none")
    parser.add_argument("--plot", default="docs/quota-plot.png", help="'' for none")
    args = parser.parse_args()
    out = run(args.seconds)
    for cid, series in out["bytes_per_second"].items():
        print(cid, " ".join(f"{b / 1024:.0f}" for b in series))
    print(json.dumps(out["throttled_answer_headers"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.plot:
        try:
            plot(out, Path(args.plot))
        except ModuleNotFoundError:
            print("no plot: matplotlib is missing (pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
