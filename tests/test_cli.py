"""The client side of the ``logbus`` command, run as processes against one real broker.

The commands are forked from the test run's zygote (tests/zygote.py: ``zygote.run``), whose
modules are already imported: 1-2 s of imports saved per command, ~40 commands. The tests that
need a pipe (``--follow`` stopped by Ctrl-C, a produce with stdin left open), the README's line
run by a shell and the examples still start a fresh interpreter.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from api import cli
from cluster.partitioner import partition_for_key
from tests import zygote
from tests.server import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("cli") / "data").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def http(server: BrokerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


def _env(url: str | None) -> dict[str, str]:
    env = os.environ.copy()
    env.pop("LOGBUS_URL", None)
    if url is not None:
        env["LOGBUS_URL"] = url
    return env


def logbus(
    server: BrokerProcess | None, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``logbus ARGS`` with ``LOGBUS_URL`` pointing at the broker (a process forked from the
    test run's zygote: tests/zygote.py)."""
    return zygote.run(
        list(args), input=stdin, timeout=60, cwd=ROOT, env=_env(server.url if server else None)
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def failed(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one-line message of a failed command."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def create(http: httpx.Client, name: str, partitions: int = 1) -> None:
    r = http.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert r.status_code == 201, r.text


def fetch_all(http: httpx.Client, topic: str, partition: int) -> list[dict[str, Any]]:
    r = http.get(f"/v1/topics/{topic}/partitions/{partition}/records", params={"offset": 0})
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["records"]
    return records


# -- topics ---------------------------------------------------------------------------------------


def test_topics_round_trip(server: BrokerProcess, http: httpx.Client) -> None:
    out = ok(
        logbus(
            server,
            "topics",
            "create",
            "cli-admin",
            "--partitions",
            "3",
            "--config",
            "retention.ms=86400000",
            "segment.bytes=1048576",
        )
    ).stdout
    assert "created topic cli-admin" in out
    t = http.get("/v1/topics/cli-admin").json()
    assert t["partitions"] == 3
    assert t["configs"] == {"retention.ms": 86400000, "segment.bytes": 1048576}

    table = ok(logbus(server, "topics", "list")).stdout.splitlines()
    assert table[0].split() == ["TOPIC", "PARTITIONS", "REPLICATION", "CONFIGS"]
    row = next(line.split() for line in table if line.startswith("cli-admin "))
    assert row[:3] == ["cli-admin", "3", "1"]
    listed = json.loads(ok(logbus(server, "topics", "list", "--json")).stdout)
    assert "cli-admin" in {x["name"] for x in listed["topics"]}

    described = ok(logbus(server, "topics", "describe", "cli-admin")).stdout
    assert "retention.ms=86400000" in described
    lines = described.splitlines()
    header = lines.index(next(x for x in lines if x.startswith("PARTITION ")))
    assert "ISR" in lines[header] and "HIGH-WATERMARK" in lines[header]
    assert [x.split()[:2] for x in lines[header + 1 :]] == [["0", "1"], ["1", "1"], ["2", "1"]]
    detail = json.loads(ok(logbus(server, "topics", "describe", "cli-admin", "--json")).stdout)
    assert [p["isr"] for p in detail["partition_details"]] == [[1], [1], [1]]

    altered = logbus(
        server,
        "topics",
        "alter",
        "cli-admin",
        "--config",
        "retention.ms=3600000",
        "--delete-config",
        "segment.bytes",
        "--partitions",
        "4",
    )
    assert "retention.ms  3600000" in ok(altered).stdout
    configs = http.get("/v1/topics/cli-admin/configs").json()
    assert configs["overrides"] == {"retention.ms": 3600000}
    assert http.get("/v1/topics/cli-admin").json()["partitions"] == 4

    assert "deleted topic cli-admin" in ok(logbus(server, "topics", "delete", "cli-admin")).stdout
    assert http.get("/v1/topics/cli-admin").status_code == 404


# -- produce and consume --------------------------------------------------------------------------


def test_produce_then_consume_in_order(server: BrokerProcess, http: httpx.Client) -> None:
    create(http, "cli-seq")
    lines = [str(i) for i in range(1, 5001)]
    produced = ok(logbus(server, "produce", "cli-seq", stdin="\n".join(lines) + "\n"))
    assert produced.stdout == ""
    assert re.search(
        r"produced 5000 record\(s\).* [\d,]+ records/s, [\d.]+ MB/s", produced.stderr
    ), produced.stderr
    assert http.get("/v1/topics/cli-seq/partitions").json()[0]["high_watermark"] == 5000

    consumed = ok(logbus(server, "consume", "cli-seq", "--from", "earliest"))
    assert consumed.stdout.splitlines() == lines

    first = ok(logbus(server, "consume", "cli-seq", "--max-records", "2", "--format", "json"))
    records = [json.loads(x) for x in first.stdout.splitlines()]
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in records] == [
        (0, 0, None, "1"),
        (0, 1, None, "2"),
    ]


def test_produce_json_values_partition_and_acks(server: BrokerProcess, http: httpx.Client) -> None:
    create(http, "cli-json", partitions=2)
    docs = ['{"n": 1}', "[1, 2]", '"text"', "", "null"]
    ok(
        logbus(
            server,
            "produce",
            "cli-json",
            "--json-values",
            "--partition",
            "1",
            "--acks",
            "0",
            stdin="\n".join(docs),
        )
    )
    assert fetch_all(http, "cli-json", 0) == []
    assert [r["value"] for r in fetch_all(http, "cli-json", 1)] == [{"n": 1}, [1, 2], "text", None]
    out = ok(logbus(server, "consume", "cli-json", "--partition", "1")).stdout
    assert out.splitlines() == ['{"n":1}', "[1,2]", "text", "null"]

    bad = logbus(server, "produce", "cli-json", "--json-values", stdin="1\nnot json\n")
    assert "line 2: not JSON" in failed(bad)


def test_keys_land_on_their_murmur2_partition(server: BrokerProcess, http: httpx.Client) -> None:
    create(http, "cli-keys", partitions=4)
    lines = [f"user-{i % 37}|value {i}" for i in range(400)]
    ok(logbus(server, "produce", "cli-keys", "--key-separator", "|", stdin="\n".join(lines)))
    seen: list[tuple[str, str]] = []
    for p in range(4):
        for r in fetch_all(http, "cli-keys", p):
            assert partition_for_key(r["key"].encode(), 4) == p, r
            seen.append((r["key"], r["value"]))
    assert sorted(seen) == sorted(tuple(x.split("|", 1)) for x in lines)
    # Per key, the records keep their order.
    for key in {k for k, _ in seen}:
        values = [v for k, v in seen if k == key]
        assert values == sorted(values, key=lambda v: int(v.split()[1]))

    no_sep = logbus(server, "produce", "cli-keys", "--key-separator", "|", stdin="a|1\nb\n")
    assert "line 2: no key separator" in failed(no_sep)


def test_consume_from_time_offset_and_latest(server: BrokerProcess, http: httpx.Client) -> None:
    create(http, "cli-time")
    records = [{"value": f"r{i}", "timestamp": i * 1000} for i in range(1, 6)]
    assert http.post("/v1/topics/cli-time/records", json={"records": records}).status_code == 200

    def values(*position: str) -> list[str]:
        return ok(logbus(server, "consume", "cli-time", "--from", *position)).stdout.split()

    assert values("@3000") == ["r3", "r4", "r5"]
    assert values("1970-01-01T00:00:02.500Z") == ["r3", "r4", "r5"]
    assert values("3") == ["r4", "r5"]
    assert values("-2") == ["r4", "r5"]
    assert values("latest") == []
    assert "past the end" in failed(logbus(server, "consume", "cli-time", "--from", "99"))


def test_follow_receives_new_records_and_stops_on_ctrl_c(
    server: BrokerProcess, http: httpx.Client
) -> None:
    create(http, "cli-follow", partitions=2)
    old = {"records": [{"value": "old", "partition": p} for p in (0, 1)]}
    assert http.post("/v1/topics/cli-follow/records", json=old).status_code == 200
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "consume", "cli-follow", "--from", "latest", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_env(server.url),
        # A shell's background jobs ignore SIGINT, and children inherit that: restore Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    try:
        # The consumer starts at the end at some point after it is launched: produce until it
        # prints, one record at a time, to either partition.
        first = None
        deadline = time.monotonic() + 30
        i = 0
        while first is None and time.monotonic() < deadline:
            record = {"value": f"tick-{i}", "partition": i % 2}
            r = http.post("/v1/topics/cli-follow/records", json={"records": [record]})
            assert r.status_code == 200
            i += 1
            try:
                first = lines.get(timeout=0.3)
            except queue.Empty:
                assert proc.poll() is None, proc.communicate()
        assert first is not None and first.startswith("tick-"), first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _pump(stream: IO[str] | None, out: queue.Queue[str]) -> None:
    assert stream is not None
    for line in stream:
        out.put(line.rstrip("\n"))


# -- errors ---------------------------------------------------------------------------------------


def test_errors_are_readable(server: BrokerProcess, http: httpx.Client) -> None:
    create(http, "cli-err")
    assert "TOPIC_ALREADY_EXISTS (409)" in failed(logbus(server, "topics", "create", "cli-err"))
    message = failed(logbus(server, "topics", "describe", "cli-nope"))
    assert message.startswith("logbus topics describe: UNKNOWN_TOPIC_OR_PARTITION (404):")
    assert "cli-nope" in message and message.count("\n") == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in failed(logbus(server, "produce", "cli-nope", stdin="x"))
    assert "UNKNOWN_TOPIC_OR_PARTITION" in failed(logbus(server, "consume", "cli-nope"))

    assert "no 5" in failed(logbus(server, "consume", "cli-err", "--partition", "5"))
    assert "INVALID_CONFIG" in failed(
        logbus(server, "topics", "alter", "cli-err", "--config", "retention.ms=soon")
    )


def test_an_unreachable_broker_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI in-process, its retries without their backoff (16 attempts over 13.5 s, as a
    failover needs, are the router's business: tests/client/test_routing.py)."""
    from logbus_client import routing

    monkeypatch.setattr(routing.Backoff, "next", lambda self: 0.0)
    closed = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["topics", "list", "--url", closed, "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the broker at {closed}" in err and "Traceback" not in err
    assert cli.main(["groups", "list", "--url", f"{closed},{closed}/", "--timeout", "5"]) == 1
    assert f"cannot reach the broker at {closed}" in capsys.readouterr().err  # one URL, twice


# -- bench ----------------------------------------------------------------------------------------


def test_bench_forwards_its_arguments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[argparse.Namespace] = []

    def run_bench(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    fake = types.ModuleType("benchmarks.http")
    fake.run_bench = run_bench  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.http", fake)
    argv = ["bench", "--seconds", "2.5", "--json", str(tmp_path / "o.json")]
    assert cli.main([*argv, "--plot", str(tmp_path / "o.png")]) == 0
    (args,) = seen
    assert (args.url, args.seconds, args.json, args.plot) == (
        None,
        2.5,
        tmp_path / "o.json",
        tmp_path / "o.png",
    )

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "benchmarks", raising=False)
    monkeypatch.setitem(sys.modules, "benchmarks.http", None)  # "not installed"
    assert cli.main(["bench", "--url", "http://127.0.0.1:1"]) == 2
    assert "pip install" in capsys.readouterr().err


def test_from_positions_parse() -> None:
    from api.client_cli import _start_position

    assert _start_position("earliest") == ("earliest", 0)
    assert _start_position("latest") == ("latest", 0)
    assert _start_position("12") == ("offset", 12)
    assert _start_position("-3") == ("tail", 3)
    assert _start_position("@1700000000000") == ("time", 1_700_000_000_000)
    assert _start_position("2023-11-14T22:13:20Z") == ("time", 1_700_000_000_000)
    assert _start_position("2023-11-14T23:13:20.5+01:00") == ("time", 1_700_000_000_500)
    for bad in ("soon", "@x", "@-1", "1969-12-31T00:00:00Z"):
        with pytest.raises(argparse.ArgumentTypeError):
            _start_position(bad)


def test_groups_list_describe_reset_delete(server: BrokerProcess, http: httpx.Client) -> None:
    assert http.post("/v1/topics", json={"name": "cg", "partitions": 2}).status_code == 201
    http.post(
        "/v1/topics/cg/partitions/0/records", json={"records": [{"value": i} for i in range(5)]}
    )
    member = http.post(
        "/v1/groups/ops/members", json={"topics": ["cg"], "auto_offset_reset": "earliest"}
    ).json()
    commit = {
        "member_id": member["member_id"],
        "generation": member["generation"],
        "offsets": [{"topic": "cg", "partition": 0, "offset": 2}],
    }
    assert http.post("/v1/groups/ops/offsets", json=commit).status_code == 200

    metrics = http.get("/metrics").text
    assert 'logbus_group_lag{group="ops"} 3.0' in metrics
    assert 'logbus_group_members{group="ops"} 1.0' in metrics

    listed = logbus(server, "groups", "list")
    assert listed.returncode == 0 and re.search(r"ops\s+stable\s+1\s+3", listed.stdout)
    described = json.loads(logbus(server, "groups", "describe", "ops", "--json").stdout)
    (p0,) = [o for o in described["offsets"] if o["partition"] == 0]
    assert (p0["committed_offset"], p0["lag"]) == (2, 3)

    busy = logbus(server, "groups", "reset", "ops", "--to", "earliest")
    assert busy.returncode == 1 and "NON_EMPTY_GROUP" in busy.stderr
    http.delete(f"/v1/groups/ops/members/{member['member_id']}")

    to_offset = logbus(server, "groups", "reset", "ops", "--to", "cg:0:4", "--json")
    assert json.loads(to_offset.stdout)["offsets"][0]["offset"] == 4
    earliest = logbus(server, "groups", "reset", "ops", "--to", "earliest")
    assert earliest.returncode == 0 and re.search(r"cg\s+1\s+0", earliest.stdout)
    bad = logbus(server, "groups", "reset", "ops", "--to", "sideways")
    assert bad.returncode == 2 and "--to" in bad.stderr

    assert logbus(server, "groups", "delete", "ops").stdout.strip() == "deleted group ops"
    assert http.get("/v1/groups/ops").status_code == 404


def test_transactions_list_and_abort(server: BrokerProcess, http: httpx.Client) -> None:
    """``logbus transactions list`` finds a hanging transaction; ``abort`` ends it (its data is
    never visible at read_committed) and fences its producer."""
    assert http.post("/v1/topics", json={"name": "tx-cli", "partitions": 1}).status_code == 201
    session = http.post("/v1/transactions/hanging-app", json={}).json()
    r = http.post(
        "/v1/topics/tx-cli/partitions/0/records",
        json={"records": [{"value": "never"}]},
        headers={
            "Logbus-Transactional-Id": "hanging-app",
            "Logbus-Producer-Id": str(session["producer_id"]),
            "Logbus-Producer-Epoch": str(session["producer_epoch"]),
            "Logbus-Sequence": "0",
        },
    )
    assert r.status_code == 200, r.text
    listed = ok(logbus(server, "transactions", "list", "--state", "ongoing"))
    assert re.search(r"hanging-app\s+ongoing\s+\d+\s+0\s+\d+\s+1", listed.stdout), listed.stdout
    as_json = json.loads(ok(logbus(server, "transactions", "list", "--json")).stdout)
    assert "hanging-app" in {t["transactional_id"] for t in as_json["transactions"]}
    aborted = ok(logbus(server, "transactions", "abort", "hanging-app"))
    assert "aborted the transaction of hanging-app" in aborted.stdout
    assert (
        "no transactions" in ok(logbus(server, "transactions", "list", "--state", "ongoing")).stdout
    )
    fetched = http.get(
        "/v1/topics/tx-cli/partitions/0/records",
        params={"offset": 0, "isolation": "read_committed"},
    ).json()
    assert fetched["records"] == []
    commit = http.post(
        "/v1/transactions/hanging-app/commit",
        json={"producer_id": session["producer_id"], "producer_epoch": session["producer_epoch"]},
    )
    assert commit.status_code == 409 and commit.json()["code"] == "PRODUCER_FENCED"
    again = logbus(server, "transactions", "abort", "hanging-app")
    assert again.returncode == 1 and "INVALID_TXN_STATE" in again.stderr


def test_topics_and_groups_pass_over_a_dead_and_a_silent_broker(
    server: BrokerProcess, http: httpx.Client
) -> None:
    """--url lists brokers of a cluster: a refused connection or a broker that never answers
    (a listening socket nobody accepts on) is passed over for the next URL. Each command
    waits out the 2 s timeout on the silent one, so the four reads run at once (the test took
    21-22 s with all seven in turn)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        dead = f"http://127.0.0.1:{free_port()}"
        mute = f"http://127.0.0.1:{silent.getsockname()[1]}"
        urls = ",".join([dead, mute, server.url])
        opts = ("--url", urls, "--timeout", "2")
        created = ok(logbus(None, "topics", "create", "cli-dead-first", *opts))
        assert "created topic cli-dead-first" in created.stdout
        commit = {"offsets": [{"topic": "cli-dead-first", "partition": 0, "offset": 0}]}
        assert http.post("/v1/groups/cli-dead-ops/offsets", json=commit).status_code == 200
        with ThreadPoolExecutor(4) as pool:
            listed, _, groups_listed, described = pool.map(
                lambda args: ok(logbus(None, *args, *opts)),
                [
                    ("topics", "list", "--json"),
                    ("topics", "describe", "cli-dead-first"),
                    ("groups", "list", "--json"),
                    ("groups", "describe", "cli-dead-ops", "--json"),
                ],
            )
        assert "cli-dead-first" in {t["name"] for t in json.loads(listed.stdout)["topics"]}
        groups = json.loads(groups_listed.stdout)
        assert "cli-dead-ops" in {g["group"] for g in groups["groups"]}
        assert json.loads(described.stdout)["group"] == "cli-dead-ops"
        ok(logbus(None, "groups", "delete", "cli-dead-ops", *opts))
        ok(logbus(None, "topics", "delete", "cli-dead-first", *opts))
        assert http.get("/v1/topics/cli-dead-first").status_code == 404
    finally:
        silent.close()


# -- issue 10: what a new user hit ----------------------------------------------------------------


def test_a_failing_produce_exits_cleanly_while_stdin_is_still_open(
    server: BrokerProcess, http: httpx.Client
) -> None:
    """A reader thread blocked in ``sys.stdin.buffer.read1`` when the main thread exited made
    the interpreter abort (``Fatal Python error: _enter_buffered_busy``, exit 134)."""
    create(http, "cli-open-stdin")
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "produce", "cli-open-stdin", "--key-separator", ":"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=_env(server.url),
    )
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"no separator here\n")
        proc.stdin.flush()
        proc.wait(timeout=30)  # stdin stays open: the command must not wait for it
        err = proc.stderr.read().decode()
        assert proc.returncode == 1, (proc.returncode, err)
        assert "line 1: no key separator ':'" in err and "Fatal Python error" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_options_before_the_command(server: BrokerProcess, http: httpx.Client) -> None:
    create(http, "cli-global")
    env = _env(None)  # no LOGBUS_URL: only the option names the broker
    run = functools.partial(zygote.run, timeout=60, cwd=ROOT, env=env)
    listed = ok(run(["--url", server.url, "topics", "list"]))
    assert "cli-global" in listed.stdout
    as_json = ok(run(["--url", server.url, "--timeout", "5", "--json", "topics", "list"]))
    assert "cli-global" in [t["name"] for t in json.loads(as_json.stdout)["topics"]]
    # The command's own option wins over the one before it.
    bad = f"http://127.0.0.1:{free_port()}"
    ok(run(["--url", bad, "topics", "describe", "cli-global", "--url", server.url]))
    produced = ok(run(["--url", server.url, "produce", "cli-global"], input="a\nb\n"))
    assert "produced 2 record(s)" in produced.stderr
    refused = run(["--url", server.url, "serve"])
    assert refused.returncode == 2 and "does not take --url" in refused.stderr


def test_the_readme_produce_line_with_keys(server: BrokerProcess, http: httpx.Client) -> None:
    """The README's keyed produce (its input really has `key:value` lines)."""
    create(http, "clicks", partitions=3)
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "logbus produce clicks --key-separator" in x)
    command = line.strip().removeprefix("$ ")
    result = subprocess.run(
        command,
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**_env(server.url), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, (command, result.stderr)
    records = [(p, r) for p in range(3) for r in fetch_all(http, "clicks", p)]
    assert len(records) == 10
    for p, r in records:
        assert r["key"] is not None and r["key"].startswith("user-"), r
        assert partition_for_key(r["key"].encode(), 3) == p, r


def test_the_examples_honour_logbus_url(server: BrokerProcess, http: httpx.Client) -> None:
    """Like the ``logbus`` command, the examples talk to ``$LOGBUS_URL`` without ``--url``."""
    topic = "cli-example-clicks"
    small = ("--events", "30", "--minutes", "1", "--users", "3")
    result = subprocess.run(
        [sys.executable, "-m", "examples.clickstream.produce_clicks", "--topic", topic, *small],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=_env(server.url),
    )
    assert result.returncode == 0, result.stderr
    assert sum(len(fetch_all(http, topic, p)) for p in range(3)) == 30
    pipeline = subprocess.run(
        [sys.executable, "-m", "examples.clickstream.pipeline", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=_env(server.url),
    )
    assert pipeline.returncode == 0 and server.url in pipeline.stdout, pipeline.stderr


def test_stdin_lines_read_a_descriptor_past_fd_setsize() -> None:
    """select() refuses descriptors >= 1024; a process with many files open (the CLI run
    in-process by a long test session hit it) still reads its input."""
    import resource

    from api.client_cli import _EOF, _StdinLines

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 1100:
        pytest.skip(f"the open-file limit ({soft}) leaves no descriptor past 1024")
    r, w = os.pipe()
    high = os.dup2(r, 1050)
    os.close(r)
    try:
        lines = _StdinLines(high)
        assert lines.get(0.01) is None  # nothing yet: waits, does not fail
        os.write(w, b"a\nb\n")
        os.close(w)
        assert lines.get(5) == [b"a", b"b"]
        assert lines.get(5) is _EOF
    finally:
        os.close(high)
