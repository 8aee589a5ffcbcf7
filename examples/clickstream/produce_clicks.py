"""Produce JSON click events into a Logbus topic (the input of ``pipeline.py``).

    python -m examples.clickstream.produce_clicks [--url URL (default $LOGBUS_URL)] [--topic clicks]
        [--events 6000] [--minutes 5] [--users 5] [--replication-factor N]

The events are spread evenly over ``--minutes`` of *event time*, starting at a whole minute
ten minutes ago, and go round-robin over ``--users`` users, so the per-minute counts the
pipeline computes are easy to check: ``events / minutes / users`` per user per minute. Each
event is ``{"user": "user-3", "page": "/cart", "ts": <ms>}``, keyed by the user (so a user's
clicks stay in one partition), with the event time as the record timestamp.
"""

from __future__ import annotations

import argparse
import os
import time

import httpx

PAGES = ("/", "/search", "/product/42", "/cart", "/checkout")
MAX_RECORDS_PER_REQUEST = 10_000


def produce(
    url: str,
    topic: str,
    events: int,
    minutes: int,
    users: int,
    start_ms: int | None = None,
    replication_factor: int | None = None,
) -> int:
    """Create ``topic`` (3 partitions, ``replication_factor`` replicas: by default the
    broker's default) if needed and produce the events; returns start_ms."""
    if start_ms is None:
        start_ms = (int(time.time()) // 60 - 10) * 60_000
    step_ms = minutes * 60_000 / events
    with httpx.Client(base_url=url, timeout=60.0) as http:
        spec: dict[str, object] = {"name": topic, "partitions": 3}
        if replication_factor is not None:
            spec["replication_factor"] = replication_factor
        r = http.post("/v1/topics", json=spec)
        if r.status_code not in (201, 409):
            r.raise_for_status()
        for first in range(0, events, MAX_RECORDS_PER_REQUEST):
            records = []
            for i in range(first, min(events, first + MAX_RECORDS_PER_REQUEST)):
                ts = start_ms + int(i * step_ms)
                user = f"user-{i % users + 1}"
                value = {"user": user, "page": PAGES[i % len(PAGES)], "ts": ts}
                records.append({"key": user, "value": value, "timestamp": ts})
            http.post(f"/v1/topics/{topic}/records", json={"records": records}).raise_for_status()
    return start_ms


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_compose.py parses docker-compose.yml's producer with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--url",
        default=os.environ.get("LOGBUS_URL", "http://127.0.0.1:8080"),
        help="broker URL (default: %(default)s, taken from $LOGBUS_URL when set)",
    )
    ap.add_argument("--topic", default="clicks")
    ap.add_argument("--events", type=int, default=6000)
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--users", type=int, default=5)
    ap.add_argument(
        "--replication-factor", type=int, help="of the topic if it is created (3 in a cluster)"
    )
    return ap


def main() -> None:
    args = build_parser().parse_args()
    start = produce(
        args.url,
        args.topic,
        args.events,
        args.minutes,
        args.users,
        replication_factor=args.replication_factor,
    )
    per = args.events // args.minutes // args.users
    print(
        f"produced {args.events} click events into {args.topic!r}: {args.minutes} minutes of "
        f"event time from {time.strftime('%H:%M', time.gmtime(start / 1000))} UTC, "
        f"{per} per user per minute"
    )


if __name__ == "__main__":
    main()
