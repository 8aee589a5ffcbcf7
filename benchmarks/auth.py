"""What authentication, 100 ACLs and a quota cost the produce path (issue 12, "Performance").

    python -m benchmarks.auth [--quick] [--seconds 3] [--rounds 5] [--json PATH]

Three brokers run side by side as ``logbus serve`` child processes
(:class:`api.process.BrokerProcess`, default settings, each its own data directory):

* **none**: authentication off (today's default);
* **auth**: ``--auth``, the admin's key from ``LOGBUS_BOOTSTRAP_KEY``; a user ``bench`` with
  one API key and ``--acls`` (100) ACLs that all apply to it (``User:bench`` or ``User:*``): a
  mix of literal and prefixed topic ACLs on other names, group ACLs, DENY ACLs on other topics
  and one on the benchmark's own prefix for another operation, ``User:*`` entries, and the
  two it needs (WRITE and DESCRIBE on the prefix ``auth-bench-``);
* **auth_quota**: as *auth*, plus a quota for the entity (user ``bench``, client id
  ``bench-client``) — ``producer_byte_rate``, ``consumer_byte_rate`` and
  ``request_percentage`` — set far above what the broker can do, so it measures what
  enforcement costs (every request resolved, measured and timed: ``request_percentage`` wraps
  each request's task steps in a timer, the most expensive of the quota types), never
  throttling. The run checks both: the answer of a request carries
  ``Logbus-Throttle-Time-Ms: 0`` before, and ``/metrics`` shows no throttle time after.

Every request is identical on the three brokers: ``Authorization: Bearer <bench's key>`` (a
broker without auth ignores it) and ``Logbus-Client-Id: bench-client``. The loads are
those of ``logbus bench`` (:mod:`benchmarks.http`), driven by ``wrk`` (C, one thread):

* **small**: one JSON record of a 100-byte value per request, 64 connections;
* **json**: 1,000 such records per request, 8 connections;

both ``POST /v1/topics/{t}/records?acks=1`` to a 1-partition topic (``--acks all`` adds an
fsync per request group, which only dilutes the per-request cost measured here). Each
measurement writes into a fresh topic, deleted afterwards, so disk use stays bounded; a new
topic also means the broker's ACL decision for it is computed once (not cached from before).

The machine is shared and noisy (2 cores, other work running), so the configurations
alternate: round after round, each load runs on *none*, *auth*, *auth_quota* in turn, after
one warm-up pass of every load on every broker (a key's first use costs one argon2 check,
~0.1 s, once per key per broker; the warm-up takes it out of the figures). The figures are
the medians over rounds of each round's ratios, with their spread (min to max):

* ``auth / none`` (target ≥ 0.90): what authentication and 100 ACLs cost;
* ``auth_quota / auth`` (target ≥ 0.95): the quota cost, what enforcement adds to an
  authenticated request ("quota enforcement costs ≤ 5 %");
* ``auth_quota / none`` (no target): both together.

Output: a table on stdout (each ratio with its target and met/missed), ``--json`` (default
``docs/bench-auth.json``). ``--quick`` is a smoke run (seconds); a machine without ``wrk``
falls back to an asyncio load generator (``--driver python``), whose figures are not
comparable with ``wrk``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from api.process import BrokerProcess
from auth_quotas.credentials import generate_api_key
from benchmarks.cluster import (
    Load,
    _python_load,
    measured_run,
    run_summary,
    running,
    start_patiently,
)
from benchmarks.consumers import Figure, cpu_seconds
from benchmarks.http import RECORD_BYTES, WrkResult, json_body, run_wrk

CONFIGS: Final = ("none", "auth", "auth_quota")
USER: Final = "bench"
CLIENT_ID: Final = "bench-client"
TOPIC_PREFIX: Final = "auth-bench-"
# Far above anything one broker on this machine does (1 TB/s; 10,000 event loops): the
# quota is resolved, measured and timed on every request, and never throttles.
NEVER_THROTTLES: Final = {
    "producer_byte_rate": 1e12,
    "consumer_byte_rate": 1e12,
    "request_percentage": 1e6,
}
AUTH_TARGET: Final = 0.90
QUOTA_TARGET: Final = 0.95
TIMEOUT_S: Final = 60.0  # any one admin request (a loaded machine answers slowly, not never)


def loads() -> dict[str, Load]:
    small = orjson.dumps({"records": [{"value": "v" * (RECORD_BYTES - 2)}]})
    return {
        "small": Load("small", small, 1, 64, "application/json"),
        "json": Load("json", json_body(1000), 1000, 8, "application/json"),
    }


LOAD_NAMES: Final = {
    "small": "small request (1 record/request, 64 connections)",
    "json": "JSON produce (1,000 records/request, 8 connections)",
}


# -- the ACLs ----------------------------------------------------------------------------------


def bench_acls(n: int) -> list[dict[str, str]]:
    """``n`` (≥ 4) ACLs that all apply to ``User:bench``: the two it needs, a DENY on its own
    prefix for another operation (deny wins, so it is checked on every decision of that
    resource), then a cycle of literal/prefixed topic ACLs on other names, group ACLs, DENY
    ACLs on other topics and ``User:*`` entries."""
    assert n >= 4
    me = f"User:{USER}"

    def acl(
        principal: str, rtype: str, name: str, pattern: str, op: str, perm: str
    ) -> dict[str, str]:
        return {
            "principal": principal,
            "resource_type": rtype,
            "name": name,
            "pattern": pattern,
            "operation": op,
            "permission": perm,
        }

    out = [
        acl(me, "topic", TOPIC_PREFIX, "prefixed", "write", "allow"),
        acl(me, "topic", TOPIC_PREFIX, "prefixed", "describe", "allow"),
        acl(me, "topic", TOPIC_PREFIX, "prefixed", "delete", "deny"),
        acl("User:*", "topic", "auth-", "prefixed", "describe_configs", "allow"),
    ]
    ops = ("read", "write", "describe", "describe_configs")
    i = 0
    while len(out) < n:
        kind = i % 8
        if kind in (0, 1):
            out.append(acl(me, "topic", f"orders-{i}", "literal", ops[i % 4], "allow"))
        elif kind == 2:
            out.append(acl(me, "topic", f"team-{i}-", "prefixed", ops[i % 4], "allow"))
        elif kind == 3:
            out.append(acl(me, "group", f"consumers-{i}", "literal", "read", "allow"))
        elif kind == 4:
            out.append(acl(me, "topic", f"secret-{i}", "literal", "write", "deny"))
        elif kind == 5:
            out.append(acl(me, "topic", f"internal-{i}-", "prefixed", "read", "deny"))
        elif kind == 6:
            out.append(acl("User:*", "topic", f"public-{i}", "literal", "read", "allow"))
        else:
            out.append(acl("User:*", "group", f"shared-{i}-", "prefixed", "read", "allow"))
        i += 1
    return out


# -- brokers -----------------------------------------------------------------------------------


@dataclass
class Broker:
    config: str
    process: BrokerProcess
    admin: dict[str, str]  # headers of admin requests
    headers: dict[str, str]  # headers of every benchmark request

    @property
    def url(self) -> str:
        return self.process.url


def _check(r: httpx.Response, what: str) -> httpx.Response:
    if r.status_code >= 300:
        raise RuntimeError(f"{what}: {r.status_code} {r.text[:300]}")
    return r


def setup(
    brokers: dict[str, Broker], n_acls: int, quota_types: Sequence[str] = tuple(NEVER_THROTTLES)
) -> dict[str, Any]:
    """User, key, ACLs and quota on the auth brokers; the same request headers everywhere.
    Returns what was configured (for the JSON)."""
    keys: dict[str, str] = {}
    acls = bench_acls(n_acls)
    for name in ("auth", "auth_quota"):
        b = brokers[name]
        with httpx.Client(base_url=b.url, headers=b.admin, timeout=TIMEOUT_S) as c:
            created = _check(c.post("/v1/users", json={"name": USER}), "create user").json()
            keys[name] = created["key"]
            _check(c.post("/v1/acls", json=acls), f"add {len(acls)} ACLs")
            if name == "auth_quota":
                quotas = {t: NEVER_THROTTLES[t] for t in quota_types}
                body = {"entity": {"user": USER, "client_id": CLIENT_ID}, "quotas": quotas}
                _check(c.put("/v1/quotas", json=body), "set quota")
            total = len(_check(c.get("/v1/acls"), "list ACLs").json()["acls"])
        b.headers = {"Authorization": f"Bearer {keys[name]}", "Logbus-Client-Id": CLIENT_ID}
    # The broker without auth gets the same header bytes (it ignores the key).
    brokers["none"].headers = dict(brokers["auth"].headers)
    return {"acls_for_bench_user": len(acls), "acls_in_store": total}


def sanity(brokers: dict[str, Broker]) -> None:
    """The configuration is in force: no key → 401, a denied topic → 403, the quota answers
    with a throttle time of 0; the benchmark user may write its topics."""
    small = loads()["small"].body
    ct = {"Content-Type": "application/json"}
    for name, b in brokers.items():
        # BrokerProcess picks its port before the child binds it: with other work on the
        # machine starting brokers too, another process can take the port first, answer the
        # readiness probe, and be measured instead (suspected in one trial run whose check
        # below got 404 where 403 was due; not reproduced).
        assert b.process.proc is not None
        if b.process.proc.poll() is not None:
            raise RuntimeError(f"{name}: the broker exited: {b.process.log()[-2000:]}")
    for name in ("auth", "auth_quota"):
        b = brokers[name]
        path = "/v1/topics/secret-4/records"  # a DENY WRITE literal ACL of bench_acls
        r = httpx.post(b.url + path, content=small, headers=b.headers | ct, timeout=TIMEOUT_S)
        if r.status_code != 403:
            raise RuntimeError(f"{name}: a denied topic answered {r.status_code}, not 403")
        r = httpx.post(b.url + path, content=small, headers=ct, timeout=TIMEOUT_S)
        if r.status_code != 401:
            raise RuntimeError(f"{name}: no credential answered {r.status_code}, not 401")
    for name, b in brokers.items():
        topic = f"{TOPIC_PREFIX}sanity"
        create_topic(b, topic)
        r = _check(
            httpx.post(
                f"{b.url}/v1/topics/{topic}/records",
                content=small,
                headers={**b.headers, "Content-Type": "application/json"},
                timeout=TIMEOUT_S,
            ),
            f"{name}: bench user writes",
        )
        throttle = r.headers.get("logbus-throttle-time-ms")
        if name == "auth_quota" and throttle != "0":
            raise RuntimeError(f"auth_quota: Logbus-Throttle-Time-Ms is {throttle!r}, not '0'")
        if name != "auth_quota" and throttle is not None:
            raise RuntimeError(f"{name}: a quota applies (Logbus-Throttle-Time-Ms {throttle})")
        delete_topic(b, topic)


def throttled_ms(b: Broker) -> float:
    """Throttle time ``b`` handed out to the benchmark user, by its ``/metrics``."""
    text = _check(httpx.get(f"{b.url}/metrics", headers=b.admin, timeout=TIMEOUT_S), "metrics").text
    total = 0.0
    for m in re.finditer(
        r"^logbus_quota_throttle_time_ms(?:_total)?\{([^}]*)\} (\S+)$", text, re.M
    ):
        if f'user="{USER}"' in m[1]:
            total += float(m[2])
    return total


def create_topic(b: Broker, name: str) -> None:
    r = httpx.post(
        f"{b.url}/v1/topics", json={"name": name, "partitions": 1}, headers=b.admin, timeout=60
    )
    _check(r, f"create topic {name}")


def delete_topic(b: Broker, name: str) -> None:
    # A fresh name per measurement: a leftover costs disk, not correctness.
    with contextlib.suppress(httpx.HTTPError):
        httpx.delete(f"{b.url}/v1/topics/{name}", headers=b.admin, timeout=TIMEOUT_S)


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Measured:
    requests_per_s: float
    cpu_us_per_request: float  # the broker's CPU (user + system, all threads) per request
    result: WrkResult


def produce(
    b: Broker, topic: str, load: Load, seconds: float, acks: str, workdir: Path, driver: str
) -> Measured:
    """``load`` for ``seconds`` against a fresh ``topic``: requests/s, and the broker's CPU
    time per request (less sensitive than throughput to the CPU other work takes: it is the
    request's own cost, however much of the machine the broker got)."""
    create_topic(b, topic)
    assert b.process.proc is not None
    pid = b.process.proc.pid
    try:
        path = f"/v1/topics/{topic}/records?acks={acks}"
        cpu0 = cpu_seconds(pid)
        if driver == "wrk":
            r = run_wrk(
                b.url + path,
                workdir,
                seconds=seconds,
                connections=load.connections,
                method="POST",
                body=load.body,
                content_type=load.content_type,
                headers=b.headers,
            )
            elapsed: float = max(1, round(seconds))  # wrk's -d
        else:
            r = asyncio.run(_python_load(b.url, path, load, seconds, b.headers))
            elapsed = seconds
        cpu = cpu_seconds(pid) - cpu0
    finally:
        delete_topic(b, topic)
    requests = max(r.requests_per_s * elapsed, 1.0)
    return Measured(r.requests_per_s, cpu / requests * 1e6, r)


@dataclass
class Ratio:
    name: str
    numerator: str
    denominator: str
    target: float | None


RATIOS: Final = (
    Ratio("auth + {acls} ACLs / no auth", "auth", "none", AUTH_TARGET),
    Ratio("auth + {acls} ACLs + quota / auth (quota cost)", "auth_quota", "auth", QUOTA_TARGET),
    Ratio("auth + {acls} ACLs + quota / no auth", "auth_quota", "none", None),
)


def ratio_figures(
    rounds: dict[str, list[dict[str, float]]], n_acls: int
) -> tuple[list[Figure], dict[str, Any]]:
    """Per load and ratio: the median of the rounds' ratios, with min to max in the note."""
    figures: list[Figure] = []
    summary: dict[str, Any] = {}
    for kind, rows in rounds.items():
        for spec in RATIOS:
            per_round = [r[spec.numerator] / r[spec.denominator] for r in rows]
            med = statistics.median(per_round)
            name = f"{kind}: {spec.name.format(acls=n_acls)}"
            num = statistics.median(r[spec.numerator] for r in rows)
            den = statistics.median(r[spec.denominator] for r in rows)
            figures.append(
                Figure(
                    name,
                    med,
                    "ratio",
                    spec.target,
                    note=f"rounds {min(per_round):.3f} to {max(per_round):.3f}; median "
                    f"{num:,.0f} vs {den:,.0f} requests/s",
                )
            )
            summary[f"{kind}/{spec.numerator}_over_{spec.denominator}"] = {
                "median": med,
                "min": min(per_round),
                "max": max(per_round),
                "per_round": per_round,
                "target": spec.target,
                "met": None if spec.target is None else med >= spec.target,
            }
    return figures, summary


def cpu_figures(
    cpu_rounds: dict[str, list[dict[str, float]]],
) -> tuple[list[Figure], dict[str, Any]]:
    """Per load: what auth, and the quota on top, add to the broker's CPU time per request
    (median over rounds of each round's difference, in µs, and of the ratio)."""
    figures: list[Figure] = []
    summary: dict[str, Any] = {}
    for kind, rows in cpu_rounds.items():
        for spec in RATIOS[:2]:
            added = [r[spec.numerator] - r[spec.denominator] for r in rows]
            ratio = [r[spec.numerator] / r[spec.denominator] for r in rows]
            med = statistics.median(added)
            figures.append(
                Figure(
                    f"{kind}: broker CPU added, {spec.numerator} - {spec.denominator}",
                    med,
                    "µs/req",
                    note=f"rounds {min(added):+.1f} to {max(added):+.1f} µs; CPU ratio "
                    f"{statistics.median(ratio):.3f} ({min(ratio):.3f} to {max(ratio):.3f})",
                )
            )
            summary[f"{kind}/{spec.numerator}_minus_{spec.denominator}"] = {
                "median_us": med,
                "per_round_us": added,
                "median_ratio": statistics.median(ratio),
            }
    return figures, summary


def run(args: argparse.Namespace, workdir: Path) -> tuple[list[Figure], dict[str, Any]]:
    admin_key = generate_api_key().token
    auth_env = {"LOGBUS_BOOTSTRAP_KEY": admin_key}
    admin = {"Authorization": f"Bearer {admin_key}"}

    def broker(config: str, *extra: str) -> Broker:
        root = workdir / config
        root.mkdir(parents=True)
        env = auth_env if extra else {}
        return Broker(config, BrokerProcess(root / "data", None, *extra, env=env), admin, {})

    brokers = {
        "none": broker("none"),
        "auth": broker("auth", "--auth"),
        "auth_quota": broker("auth_quota", "--auth"),
    }
    extra: dict[str, Any] = {}
    with running(*(b.process for b in brokers.values())):
        for b in brokers.values():
            start_patiently(b.process)
        extra["configured"] = setup(brokers, args.acls, args.quota)
        sanity(brokers)
        print(
            f"brokers: none {brokers['none'].url}, auth {brokers['auth'].url}, "
            f"auth_quota {brokers['auth_quota'].url}; {extra['configured']}",
            flush=True,
        )
        shapes = {k: v for k, v in loads().items() if k in args.only}
        seq = 0

        def measure(config: str, kind: str, seconds: float) -> Measured:
            nonlocal seq
            seq += 1
            topic = f"{TOPIC_PREFIX}{kind}-{seq}"
            return produce(
                brokers[config], topic, shapes[kind], seconds, args.acks, workdir, args.driver
            )

        if args.warmup_seconds > 0:
            print("warm-up (every load on every broker):", flush=True)
            for kind in shapes:
                for config in CONFIGS:
                    measure(config, kind, args.warmup_seconds)
        rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in shapes}
        cpu_rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in shapes}
        p99: dict[str, list[float]] = {}
        for rnd in range(args.rounds):
            for kind in shapes:
                row: dict[str, float] = {}
                cpu_row: dict[str, float] = {}
                for config in CONFIGS:
                    m = measure(config, kind, args.seconds)
                    row[config] = rate = m.requests_per_s
                    cpu_row[config] = m.cpu_us_per_request
                    p99.setdefault(f"{kind}/{config}", []).append(m.result.latency_p99_ms)
                    load1 = os.getloadavg()[0]
                    print(
                        f"  round {rnd + 1} {kind:5} {config:10} {rate:>10,.0f} requests/s "
                        f"({rate * shapes[kind].records:>10,.0f} records/s, "
                        f"p99 {m.result.latency_p99_ms:6.1f} ms, "
                        f"broker CPU {m.cpu_us_per_request:7.1f} µs/request; load {load1:.1f})",
                        flush=True,
                    )
                rounds[kind].append(row)
                cpu_rounds[kind].append(cpu_row)
        extra["throttled_ms"] = throttled_ms(brokers["auth_quota"])
        for name, b in brokers.items():
            assert b.process.proc is not None
            if b.process.proc.poll() is not None:
                raise RuntimeError(f"{name}: the broker exited during the run")
    if extra["throttled_ms"]:
        print(
            f"WARNING: the quota throttled for {extra['throttled_ms']:.0f} ms: "
            "the quota-cost figures include throttling",
            flush=True,
        )
    extra["rounds"] = rounds
    extra["cpu_us_per_request_rounds"] = cpu_rounds
    extra["p99_ms"] = {k: statistics.median(v) for k, v in p99.items()}
    figures, extra["ratios"] = ratio_figures(rounds, args.acls)
    cpu_figs, extra["cpu_added"] = cpu_figures(cpu_rounds)
    figures += cpu_figs
    for kind, rows in rounds.items():
        for config in CONFIGS:
            med = statistics.median(r[config] for r in rows)
            cpu = statistics.median(r[config] for r in cpu_rounds[kind])
            figures.append(
                Figure(
                    f"{kind}: {config} (median requests/s)",
                    med,
                    "req/s",
                    note=f"{med * shapes[kind].records:,.0f} records/s; "
                    f"p99 {extra['p99_ms'][f'{kind}/{config}']:.1f} ms; "
                    f"broker CPU {cpu:.1f} µs/request",
                )
            )
    return figures, extra


def print_table(figures: list[Figure]) -> None:
    print(f"\n{'measure':<60} {'value':>10} {'target':>8} {'':>6}  note")
    for f in figures:
        met = {True: "met", False: "MISSED", None: ""}[f.met]
        target = "" if f.target is None else f"≥ {f.target:.2f}"
        value = {"ratio": f"{f.value:.3f}", "µs/req": f"{f.value:+.1f} µs"}.get(
            f.unit, f"{f.value:,.0f}"
        )
        print(f"{f.name:<60} {value:>10} {target:>8} {met:>6}  {f.note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    parser.add_argument("--json", default="docs/bench-auth.json", help="'' for none")
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--seconds", type=float, help="per measurement (3; quick 1)")
    parser.add_argument(
        "--warmup-seconds", type=float, default=1.0, help="per load and broker (0: none)"
    )
    parser.add_argument(
        "--quota",
        default=",".join(NEVER_THROTTLES),
        help="comma-separated quota types of auth_quota (all three by default)",
    )
    parser.add_argument("--rounds", type=int, help="rounds of none, auth, auth_quota (5; quick 1)")
    parser.add_argument("--acls", type=int, default=100, help="ACLs applying to the user")
    parser.add_argument("--acks", choices=["0", "1", "all"], default="1")
    parser.add_argument("--driver", choices=["wrk", "python"], help="load generator (wrk if found)")
    parser.add_argument("--only", default="small,json", help="comma-separated loads")
    args = parser.parse_args(argv)
    q = args.quick
    args.seconds = args.seconds or (1.0 if q else 3.0)
    args.quota = [t.strip() for t in args.quota.split(",") if t.strip()]
    if not args.quota or set(args.quota) - set(NEVER_THROTTLES):
        parser.error(f"--quota: some of {', '.join(NEVER_THROTTLES)}")
    args.rounds = args.rounds or (1 if q else 5)
    args.driver = args.driver or ("wrk" if shutil.which("wrk") else "python")
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    if unknown := set(args.only) - set(loads()):
        parser.error(f"unknown loads: {', '.join(sorted(unknown))}")
    if args.acls < 4:
        parser.error("--acls: at least 4 (the ones the benchmark needs)")

    figures, extra, started, seen = measured_run("auth", args, argv, run)
    print_table(figures)
    out: dict[str, Any] = {
        **extra.pop("_head"),
        "settings": {
            k: getattr(args, k)
            for k in ("quick", "seconds", "warmup_seconds", "rounds", "acls", "acks", "driver")
        }
        | {
            "quota": {t: NEVER_THROTTLES[t] for t in args.quota},
            "user": USER,
            "client_id": CLIENT_ID,
        },
        "figures": [asdict(f) | {"met": f.met} for f in figures],
        "extra": extra,
    }
    print(run_summary(started, seen, args.driver, out["source"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
