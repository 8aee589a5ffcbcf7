"""Client subcommands of ``logbus`` (topics, produce, consume, bench): HTTP to a broker.

Every command talks to ``--url`` (default ``$LOGBUS_URL`` or ``http://127.0.0.1:8080``) with a
timeout on every request. ``--url`` may list several brokers of a cluster, comma-separated:
``produce`` and ``consume`` then route each partition's requests to its leader through
:mod:`logbus_client.routing` (421 redirects followed, another broker asked when one is gone,
bounded retries); the other commands (topics, groups) go to any broker, the next one when
one does not answer (a change only when it was surely not received). A broker
error (``application/problem+json``) is printed on one line of stderr — ``CODE (status):
detail`` — and the command exits 1; a usage error exits 2.

Credentials: ``--api-key KEY`` (default ``$LOGBUS_API_KEY``) or ``--api-key-file PATH`` (the
file's first line: a key in a file is not in ``ps`` or the shell's history) is sent as
``Authorization: Bearer KEY`` with every request of every client command, to whichever broker
it goes. The key is never printed: a 401 says only whether a key was given.

* ``topics create|list|describe|alter|delete|reassign``: tables for people, ``--json`` for
  programs. ``reassign`` moves a partition's replicas (or ``--cancel``s a move), ``cluster
  drain`` every replica of a broker; both start the move and return (``describe`` or
  ``--wait`` shows it finish).
* ``produce``: lines from stdin, batched into NDJSON requests. The client picks each record's
  partition itself as a Kafka producer would (murmur2 of the key, or a sticky partition for
  keyless records), so it can keep up to ``--max-in-flight`` requests going at once while keeping
  Kafka's per-partition order: at most one request per partition is in flight (``--unordered``
  lifts that), the next batches are encoded while it travels. A batch also leaves after
  ``--linger-ms`` without new input, so ``tail -f app.log | logbus produce logs`` works.
  Produce is idempotent, as Kafka's producer is by default: the command opens a producer session
  (``POST /v1/producers``) and numbers each partition's records, so a request whose answer was
  lost (a leader killed mid-request) is sent again and the broker appends it once; with
  ``--unordered`` each request carries an ``Idempotency-Key`` instead. A request is then one
  batch, so it carries at most :data:`MAX_IDEMPOTENT_BODY_BYTES`.
* ``consume``: one fetch loop per partition (asyncio, so a quiet partition's long poll does not
  hold up the others); without ``--follow`` it stops at the high watermarks seen at start.
  Records are fetched as binary record batches and decoded here (see :class:`_Fetcher`).
* ``bench``: forwards to :func:`benchmarks.http.run_bench`.

httpx, orjson and tqdm are imported inside the commands so ``logbus serve`` does not pay for them.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import random
import select
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import httpx

    from core_log.batch import Record
    from logbus_client.producer import ProducerSession
    from logbus_client.routing import AsyncRouter, Router

_UA = {"user-agent": "logbus-cli"}

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0
LONG_POLL_MS = 30_000  # below the broker's max_wait_ms (60 s)
BATCH_TYPE = "application/vnd.logbus.batch"
MAX_BATCH_LINES = 100_000  # the broker's max_records_per_request
MAX_BODY_BYTES = 8 * 1024 * 1024  # well below the broker's max_request_bytes (64 MiB)
# An idempotent produce request is appended as one batch, which must fit the topic's
# max.message.bytes (1 MiB by default); half of it leaves room for the batch's own overhead.
MAX_IDEMPOTENT_BODY_BYTES = 512 * 1024

_ENVELOPE = frozenset(("type", "title", "status", "code", "retriable", "detail", "errors"))


class CliError(Exception):
    """A failure reported on one line of stderr, with the exit code (and the HTTP status of a
    broker's refusal, 0 for other failures)."""

    def __init__(self, message: str, exit_code: int = 1, status: int = 0) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


# -- argument parsing ---------------------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``topics``, ``groups``, ``transactions``, ``produce``, ``consume``, the
    security commands and ``bench`` on ``logbus``."""
    conn = argparse.ArgumentParser(add_help=False)
    add_connection_options(conn)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON instead of a table")

    _add_topics(sub, [conn, as_json])
    from .groups_cli import add_groups

    add_groups(sub, [conn, as_json])
    from .transactions_cli import add_transactions

    add_transactions(sub, [conn, as_json])
    _add_produce(sub, [conn])
    _add_consume(sub, [conn])
    from .security_cli import add_security

    add_security(sub, [conn, as_json])
    _add_bench(sub)


def add_connection_options(parser: argparse.ArgumentParser, dest_prefix: str = "") -> None:
    """``--url``, ``--timeout``, ``--api-key`` and ``--api-key-file``; ``logbus`` also takes
    them before the command, under ``dest_prefix`` (see :func:`apply_global_options`)."""
    parser.add_argument(
        "--url",
        dest=f"{dest_prefix}url",
        default=None,
        help=f"broker URL, or several of a cluster comma-separated (default: $LOGBUS_URL or "
        f"{DEFAULT_URL})",
    )
    parser.add_argument(
        "--timeout",
        dest=f"{dest_prefix}timeout",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help=f"timeout of each HTTP request (default: {DEFAULT_TIMEOUT_S})",
    )
    key = parser.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key",
        dest=f"{dest_prefix}api_key",
        default=None,
        metavar="KEY",
        help="API key sent as 'Authorization: Bearer KEY' (default: $LOGBUS_API_KEY); "
        "visible in ps: prefer --api-key-file or the variable",
    )
    key.add_argument(
        "--api-key-file",
        dest=f"{dest_prefix}api_key_file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the API key from the first line of this file",
    )


def apply_global_options(args: argparse.Namespace) -> str | None:
    """Merge ``logbus --url U --timeout T --api-key K --json COMMAND`` into the command's own
    options (the command's win) and fill in the defaults; return an error for a command that
    takes none. ``--api-key`` and ``--api-key-file`` are one option: either of them given to
    the command wins over both before it."""
    absent = object()
    if getattr(args, "api_key", None) is not None or getattr(args, "api_key_file", None):
        args.global_api_key = args.global_api_key_file = None
    given = {
        "url": args.global_url,
        "timeout": args.global_timeout,
        "api_key": args.global_api_key,
        "api_key_file": args.global_api_key_file,
        "json": args.global_json or None,
    }
    for name, value in given.items():
        if value is None:
            continue
        mine = getattr(args, name, absent)
        if mine is absent or (name == "json" and not isinstance(mine, bool)):
            return f"logbus {args.command} does not take --{name.replace('_', '-')}"
        if mine is None or mine is False:
            setattr(args, name, value)
    if args.command != "bench" and getattr(args, "url", absent) is None:
        args.url = os.environ.get("LOGBUS_URL", DEFAULT_URL)
    if getattr(args, "timeout", absent) is None:
        args.timeout = DEFAULT_TIMEOUT_S
    return None


def _add_topics(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    topics = sub.add_parser("topics", help="create, list, describe, alter and delete topics")
    tsub = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")

    create = tsub.add_parser("create", parents=parents, help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=_positive_int, default=1, help="default: 1")
    create.add_argument("--replication-factor", type=_positive_int, default=1, help="default: 1")
    create.add_argument(
        "--config",
        type=_config_pair,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="topic config, e.g. retention.ms=86400000 (repeatable)",
    )
    create.set_defaults(func=_command(_topics_create))

    lst = tsub.add_parser("list", parents=parents, help="list topics")
    lst.set_defaults(func=_command(_topics_list))

    describe = tsub.add_parser(
        "describe", parents=parents, help="a topic, its configs and partitions"
    )
    describe.add_argument("name")
    describe.set_defaults(func=_command(_topics_describe))

    alter = tsub.add_parser("alter", parents=parents, help="change configs or add partitions")
    alter.add_argument("name")
    alter.add_argument(
        "--config",
        type=_config_pair,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="set a config (repeatable)",
    )
    alter.add_argument(
        "--delete-config",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY",
        help="reset a config to its default (repeatable)",
    )
    alter.add_argument(
        "--partitions", type=_positive_int, help="increase the number of partitions to N"
    )
    alter.set_defaults(func=_command(_topics_alter))

    delete = tsub.add_parser("delete", parents=parents, help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(func=_command(_topics_delete))

    reassign = tsub.add_parser(
        "reassign",
        parents=parents,
        help="move a partition to other brokers (Kafka's kafka-reassign-partitions), or cancel",
    )
    reassign.add_argument("name")
    reassign.add_argument("--partition", type=_non_negative_int, required=True)
    action = reassign.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--replicas",
        type=_broker_ids,
        metavar="ID,ID,...",
        help="the target brokers, preferred leader first (e.g. 2,3,1)",
    )
    action.add_argument(
        "--cancel", action="store_true", help="go back to the replicas before the move"
    )
    reassign.add_argument(
        "--wait", action="store_true", help="return once the move is complete (or cancelled)"
    )
    reassign.set_defaults(func=_command(_topics_reassign))


def add_drain(
    csub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """``logbus cluster drain --broker N`` (registered by :mod:`api.cluster_cli`)."""
    conn = argparse.ArgumentParser(add_help=False)
    add_connection_options(conn)
    conn.add_argument("--json", action="store_true", help="print JSON instead of a table")
    drain = csub.add_parser(
        "drain",
        parents=[conn],
        help="move every replica off a broker (before removing it from the cluster)",
    )
    drain.add_argument("--broker", type=_non_negative_int, required=True, metavar="ID")
    drain.add_argument(
        "--wait", action="store_true", help="return once no partition is being reassigned"
    )
    drain.set_defaults(func=_command(_cluster_drain))


def _add_produce(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    p = sub.add_parser(
        "produce",
        parents=parents,
        help="produce the lines of stdin as records",
        description="Produce each line of stdin as one record (its value is the line as a JSON "
        "string, or the parsed line with --json-values). A summary with the achieved rate is "
        "printed on stderr at the end.",
    )
    p.add_argument("topic")
    p.add_argument(
        "--partition",
        type=_non_negative_int,
        help="send every record to this partition (default: murmur2 of the key, or sticky)",
    )
    p.add_argument(
        "--key-separator",
        metavar="SEP",
        help="each line is KEY<SEP>VALUE (split at the first SEP); a line without SEP is an error",
    )
    p.add_argument(
        "--json-values",
        action="store_true",
        help="parse each value as JSON instead of taking it as a string (blank lines skipped)",
    )
    p.add_argument(
        "--batch-size",
        type=_batch_size,
        default=1000,
        metavar="N",
        help="records per request (default: %(default)s)",
    )
    p.add_argument("--acks", choices=["0", "1", "all"], default="all", help="default: %(default)s")
    p.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=4,
        metavar="N",
        help="requests in flight at once (default: %(default)s), one per partition at a time",
    )
    p.add_argument(
        "--unordered",
        action="store_true",
        help="allow several requests in flight to one partition (faster, may reorder batches)",
    )
    p.add_argument(
        "--linger-ms",
        type=_non_negative_int,
        default=200,
        metavar="MS",
        help="send a partial batch after MS without new input (default: %(default)s)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(func=_command(_produce))


def _add_consume(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    c = sub.add_parser(
        "consume",
        parents=parents,
        help="print the records of a topic",
        description="Print records, one per line. Without --follow, stop at the high "
        "watermarks seen at start; with --follow, wait for new records until Ctrl-C.",
    )
    c.add_argument("topic")
    c.add_argument(
        "--partition",
        type=_non_negative_int,
        help="read one partition (default: all of them, side by side)",
    )
    c.add_argument(
        "--from",
        dest="start",
        type=_start_position,
        default=("earliest", 0),
        metavar="POSITION",
        help="earliest (default), latest, an OFFSET, -N (the last N records of each "
        "partition), an ISO-8601 time (local time unless it has an offset) or @MS "
        "(ms since the epoch): the first record at or after that time",
    )
    c.add_argument("--follow", "-f", action="store_true", help="wait for new records until Ctrl-C")
    c.add_argument(
        "--max-records", type=_positive_int, metavar="N", help="stop after N records in all"
    )
    c.add_argument(
        "--format",
        choices=["value", "json"],
        default="value",
        help="value: the value of each record (strings as they are, other JSON compact, bytes "
        "raw); json: each record as a JSON object with its partition (default: %(default)s)",
    )
    c.set_defaults(func=_command(_consume))


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser(
        "bench",
        help="run the HTTP benchmark suite (see docs/benchmarks.md)",
        description="Run benchmarks.http.run_bench: produce and fetch throughput and latency.",
    )
    b.add_argument("--url", default=None, help="benchmark this broker (default: start a fresh one)")
    b.add_argument(
        "--seconds",
        type=_positive_float,
        default=None,
        help="time budget of each measurement (default: the benchmark's own)",
    )
    b.add_argument("--json", type=Path, metavar="OUT", help="also write the results here")
    b.add_argument("--plot", type=Path, metavar="PNG", help="also draw the results here")
    b.set_defaults(func=_command(_bench))


def _positive_int(raw: str) -> int:
    value = _int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {raw!r}")
    return value


def _non_negative_int(raw: str) -> int:
    value = _int(raw)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {raw!r}")
    return value


def _broker_ids(raw: str) -> list[int]:
    """``2,3,1``: broker ids, comma-separated (the broker checks they exist)."""
    try:
        return [_non_negative_int(part.strip()) for part in raw.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"broker ids, comma-separated: {raw!r}") from None


def _batch_size(raw: str) -> int:
    value = _positive_int(raw)
    if value > MAX_BATCH_LINES:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH_LINES} records per request")
    return value


def _int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {raw!r}") from None


def _positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {raw!r}")
    return value


def _config_pair(raw: str) -> tuple[str, str]:
    key, sep, value = raw.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {raw!r}")
    return key.strip(), value


def _start_position(raw: str) -> tuple[str, int]:
    """``--from``: (earliest|latest, 0), (offset, N), (tail, N) or (time, ms)."""
    text = raw.strip()
    if text in ("earliest", "latest"):
        return text, 0
    if text.startswith("@"):
        try:
            ms = int(text[1:])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"@ takes milliseconds since the epoch: {raw!r}"
            ) from None
        if ms < 0:
            raise argparse.ArgumentTypeError(f"a time before the epoch: {raw!r}")
        return "time", ms
    try:
        n = int(text)
    except ValueError:
        pass
    else:
        return ("offset", n) if n >= 0 else ("tail", -n)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected earliest, latest, an offset, -N, an ISO-8601 time or @MS: {raw!r}"
        ) from None
    ms = round(when.timestamp() * 1000)  # a naive time is local time
    if ms < 0:
        raise argparse.ArgumentTypeError(f"a time before the epoch: {raw!r}")
    return "time", ms


# -- running a command ---------------------------------------------------------------------------


def _command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Errors to one readable line of stderr and an exit code; no tracebacks for expected ones."""

    def run(args: argparse.Namespace) -> int:
        name = " ".join(
            x for x in (getattr(args, "command", None), getattr(args, "topics_command", None)) if x
        )
        try:
            return fn(args)
        except CliError as e:
            print(f"logbus {name}: {e}{_auth_hint(args, e.status)}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            print(f"logbus {name}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            _stdout_to_devnull()
            return 0

    return run


def _auth_hint(args: argparse.Namespace, status: int) -> str:
    """After a 401 without a key: how to give one (the broker's own text says what was wrong
    with a key that was sent; the key itself is never printed)."""
    if status != 401 or getattr(args, "api_key", None) is not None:
        return ""
    return " (no API key given: --api-key, --api-key-file or $LOGBUS_API_KEY)"


def _api_key(args: argparse.Namespace) -> str | None:
    """The key of ``--api-key``, ``--api-key-file`` or ``$LOGBUS_API_KEY`` (checked once, kept
    in ``args.api_key``); None when none is given. A key that cannot be one is a usage error
    whose message does not show it."""
    from logbus_client.routing import MAX_CREDENTIAL_CHARS, check_api_key

    path: Path | None = getattr(args, "api_key_file", None)
    key: str | None = getattr(args, "api_key", None)
    source = "--api-key"
    if path is not None:
        source = f"--api-key-file {path}"
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_CREDENTIAL_CHARS + 2)
        except OSError as e:
            raise CliError(f"{source}: {e.strerror or e}", 2) from None
        lines = raw.splitlines()
        key = lines[0].decode("latin-1").strip() if lines else ""  # checked below
        if not key:
            raise CliError(f"{source}: the file is empty", 2)
        args.api_key_file = None
    elif key is None:
        key = os.environ.get("LOGBUS_API_KEY") or None
        source = "$LOGBUS_API_KEY"
    if key is not None:
        try:
            check_api_key(key)
        except ValueError as e:
            raise CliError(f"{source}: {e}", 2) from None
    args.api_key = key
    return key


def _stdout_to_devnull() -> None:
    """After EPIPE (``logbus consume t | head``): no second error when Python flushes stdout."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _urls(args: argparse.Namespace) -> list[str]:
    from logbus_client.routing import parse_bootstrap

    try:
        return parse_bootstrap(str(args.url))
    except ValueError as e:
        raise CliError(f"--url must be http:// or https:// URLs, comma-separated: {e}", 2) from None


def _router(args: argparse.Namespace, pool: int = 4) -> Router:
    """Partition requests to their leaders, over every broker ``--url`` names."""
    from logbus_client.routing import Router

    return Router(_urls(args), timeout=args.timeout, headers=_UA, api_key=_api_key(args), pool=pool)


def _unreachable(router: Router | AsyncRouter, method: str, path: str, e: Exception) -> CliError:
    """A routed request that no broker answered (a :class:`RoutingError`)."""
    where = ("the broker at " if len(router.bootstrap) == 1 else "the brokers at ") + ", ".join(
        router.bootstrap
    )
    maybe = " (it may or may not have been written)" if getattr(e, "maybe_written", False) else ""
    return CliError(f"{method} {path}: cannot reach {where}{maybe}: {e}")


def _routed(router: Router, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A non-partition request through ``router`` (idempotent: reads and producer init)."""
    from logbus_client.routing import RoutingError

    try:
        response = router.request(method, path, idempotent=True, **kwargs)
    except RoutingError as e:
        raise _unreachable(router, method, path, e) from None
    _raise_for_problem(response)
    return response


def _client(args: argparse.Namespace, pool: int = 4) -> Router:
    """The client of the commands that any broker answers (topics, groups): a :class:`Router`
    over every ``--url``, so a dead or silent first broker is passed over for the next."""
    return _router(args, pool)


def _topic_path(topic: str, *rest: object) -> str:
    return "/".join(["/v1/topics", quote(topic, safe=""), *(str(x) for x in rest)])


def _request(client: Router, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One call any broker answers. A read is retried on another broker after a timeout or
    a retriable answer; a change only when it never left (the connection was refused), so
    a topic is never created or deleted twice behind the user's back."""
    from logbus_client.routing import RoutingError

    try:
        response = client.request(method, path, idempotent=method == "GET", **kwargs)
    except RoutingError as e:
        raise _unreachable(client, method, path, e) from None
    _raise_for_problem(response)
    return response


def _raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    raise CliError(_problem_text(response), status=response.status_code)


def _problem_text(response: httpx.Response) -> str:
    """``CODE (status): detail [key=value ...]`` from problem+json, or the status and body."""
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if not isinstance(body, dict) or "detail" not in body:
        text = response.text.strip().replace("\n", " ")[:300]
        return f"HTTP {response.status_code} {response.reason_phrase}" + (
            f": {text}" if text else ""
        )
    code = body.get("code") or body.get("title") or "ERROR"
    text = f"{code} ({response.status_code}): {body['detail']}"
    extra = {k: v for k, v in body.items() if k not in _ENVELOPE}
    if extra:
        text += " [" + ", ".join(f"{k}={v}" for k, v in extra.items()) + "]"
    return text


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False))


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _configs_text(configs: dict[str, Any]) -> str:
    return ",".join(f"{k}={_config_value(v)}" for k, v in sorted(configs.items())) or "-"


def _config_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


# -- topics ---------------------------------------------------------------------------------------


def _topics_create(args: argparse.Namespace) -> int:
    body = {
        "name": args.name,
        "partitions": args.partitions,
        "replication_factor": args.replication_factor,
        "configs": dict(args.config),
    }
    with _client(args) as client:
        topic = _request(client, "POST", "/v1/topics", json=body).json()
    if args.json:
        _print_json(topic)
    else:
        print(
            f"created topic {topic['name']}: {topic['partitions']} partition(s), "
            f"replication factor {topic['replication_factor']}, "
            f"configs {_configs_text(topic.get('configs') or {})}"
        )
    return 0


def _topics_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        doc = _request(client, "GET", "/v1/topics").json()
    if args.json:
        _print_json(doc)
        return 0
    topics = sorted(doc["topics"], key=lambda t: t["name"])
    if not topics:
        print("no topics", file=sys.stderr)
        return 0
    rows = [
        (t["name"], t["partitions"], t["replication_factor"], _configs_text(t["configs"]))
        for t in topics
    ]
    print(_table(["TOPIC", "PARTITIONS", "REPLICATION", "CONFIGS"], rows))
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        topic = _request(client, "GET", _topic_path(args.name)).json()
    if args.json:
        _print_json(topic)
        return 0
    print(_describe_text(topic))
    return 0


def _describe_text(t: dict[str, Any]) -> str:
    created = datetime.fromtimestamp(t["created_ms"] / 1000).astimezone().isoformat("T", "seconds")
    head = _table(
        ["", ""],
        [
            ("Topic:", t["name"]),
            ("Topic id:", t["topic_id"]),
            ("Partitions:", t["partitions"]),
            ("Replication factor:", t["replication_factor"]),
            ("Configs:", _configs_text(t["configs"])),
            ("Created:", created),
        ],
    ).split("\n", 1)[1]
    ids = ",".join
    rows = [
        (
            p["partition"],
            p["leader"],
            p["leader_epoch"],
            ids(map(str, p["replicas"])),
            ids(map(str, p["isr"])),
            p["log_start_offset"],
            p["high_watermark"],
            p["log_end_offset"],
        )
        for p in sorted(t["partition_details"], key=lambda p: p["partition"])
    ]
    table = _table(
        [
            "PARTITION",
            "LEADER",
            "EPOCH",
            "REPLICAS",
            "ISR",
            "LOG-START",
            "HIGH-WATERMARK",
            "LOG-END",
        ],
        rows,
    )
    moving = [
        f"partition {p['partition']}: reassigning, adding "
        f"{ids(map(str, p['adding_replicas'])) or '-'}, removing "
        f"{ids(map(str, p['removing_replicas'])) or '-'}"
        for p in sorted(t["partition_details"], key=lambda p: p["partition"])
        if p.get("adding_replicas") or p.get("removing_replicas")
    ]
    return "\n".join([f"{head}\n\n{table}", *moving])


def _topics_alter(args: argparse.Namespace) -> int:
    changes: dict[str, str | None] = dict(args.config)
    for key in args.delete_config:
        if key in changes:
            raise CliError(f"{key} is both set (--config) and reset (--delete-config)", 2)
        changes[key] = None
    if not changes and args.partitions is None:
        raise CliError("nothing to alter: give --config, --delete-config or --partitions", 2)
    result: dict[str, Any] = {"topic": args.name}
    with _client(args) as client:
        if changes:
            path = _topic_path(args.name, "configs")
            result.update(_request(client, "PATCH", path, json={"configs": changes}).json())
        if args.partitions is not None:
            path = _topic_path(args.name, "partitions")
            detail = _request(client, "POST", path, json={"count": args.partitions}).json()
            result["partitions"] = detail["partitions"]
    if args.json:
        _print_json(result)
        return 0
    if changes:
        print(f"altered configs of topic {args.name}; overrides now:")
        overrides = result.get("overrides") or {}
        rows = [(k, _config_value(v)) for k, v in sorted(overrides.items())]
        print(_table(["CONFIG", "VALUE"], rows) if rows else "(none: every config is default)")
    if args.partitions is not None:
        print(f"topic {args.name} has {result['partitions']} partition(s)")
    return 0


def _topics_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _request(client, "DELETE", _topic_path(args.name))
    if args.json:
        _print_json({"topic": args.name, "deleted": True})
    else:
        print(f"deleted topic {args.name}")
    return 0


REASSIGN_POLL_S = 0.5  # --wait looks at the partitions this often


def _topics_reassign(args: argparse.Namespace) -> int:
    path = _topic_path(args.name, "partitions", args.partition, "replicas")
    with _client(args) as client:
        if args.cancel:
            row = _request(client, "DELETE", path).json()
        else:
            row = _request(client, "PUT", path, json={"replicas": args.replicas}).json()
        if args.wait and row["in_progress"]:
            _wait_reassigned(client, {args.name: {args.partition}})
            row["in_progress"] = False
    if args.json:
        _print_json(row)
    elif args.cancel:
        print(f"{args.name}-{args.partition}: cancelled, replicas {_ids(row['replicas'])}")
    else:
        print(_reassign_text(row))
    return 0


def _reassign_text(row: dict[str, Any]) -> str:
    name = f"{row['topic']}-{row['partition']}"
    if not row["in_progress"]:
        return f"{name}: replicas {_ids(row['replicas'])}"
    target = [r for r in row["replicas"] if r not in row["removing_replicas"]]
    return (
        f"{name}: reassigning to {_ids(target)}"
        f" (adding {_ids(row['adding_replicas']) or '-'}, removing "
        f"{_ids(row['removing_replicas']) or '-'})"
    )


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


def _wait_reassigned(client: Router, pending: dict[str, set[int]]) -> None:
    """Poll the partition listings until none of ``pending`` is being reassigned. There is no
    overall deadline (a large partition takes as long as its copy does); each request has
    ``--timeout``, and Ctrl-C stops waiting (the move goes on)."""
    while pending:
        for topic in list(pending):
            parts = _request(client, "GET", _topic_path(topic, "partitions")).json()
            moving = {
                p["partition"]
                for p in parts
                if p.get("adding_replicas") or p.get("removing_replicas")
            }
            pending[topic] &= moving
            if not pending[topic]:
                del pending[topic]
        if pending:
            time.sleep(REASSIGN_POLL_S)


def _cluster_drain(args: argparse.Namespace) -> int:
    with _client(args) as client:
        doc = _request(client, "POST", f"/v1/cluster/brokers/{args.broker}/drain").json()
        if args.wait:
            pending: dict[str, set[int]] = {}
            for row in doc["reassignments"]:
                if row["in_progress"]:
                    pending.setdefault(row["topic"], set()).add(row["partition"])
            _wait_reassigned(client, pending)
            for row in doc["reassignments"]:
                row["in_progress"] = False
    if args.json:
        _print_json(doc)
        return 0
    if not doc["reassignments"]:
        print(f"broker {args.broker} holds no replica")
        return 0
    for row in doc["reassignments"]:
        print(_reassign_text(row))
    if args.wait:
        print(f"broker {args.broker} holds no replica now")
    return 0


# -- produce --------------------------------------------------------------------------------------

_EOF = object()
STDIN_READ_BYTES = 1 << 16


class _StdinLines:
    """Lines of a file descriptor (stdin), read on the calling thread.

    ``poll`` waits for input with the linger timeout and ``os.read`` takes what is there
    without waiting for a full buffer, so interactive or ``tail -f`` input is not held back.
    No thread reads stdin: a daemon thread inside ``sys.stdin.buffer.read1`` when the
    interpreter exits (after an error on the main thread) aborted it with ``Fatal Python error:
    _enter_buffered_busy`` (exit 134).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pending = b""
        self._eof = False
        # poll, not select: select() refuses descriptors past FD_SETSIZE (1024), which a
        # process with many files open (the CLI run in-process by a long test session) has.
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def get(self, timeout: float | None) -> list[bytes] | object | None:
        """Complete lines (without the newline; possibly none yet), ``_EOF`` at the end, or
        None when nothing arrived within ``timeout`` seconds."""
        if self._eof:
            return _EOF
        ready = self._poll.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))
        if not ready:
            return None
        try:
            chunk = os.read(self.fd, STDIN_READ_BYTES)
        except OSError as e:
            raise CliError(f"reading stdin: {e}") from None
        if not chunk:
            self._eof = True
            last, self._pending = self._pending, b""
            return [last] if last else _EOF
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        return lines


class _Encoder:
    """One input line → (partition, NDJSON record line, payload bytes)."""

    def __init__(self, args: argparse.Namespace, partitions: int) -> None:
        import orjson

        from cluster.partitioner import partition_for_key

        self._dumps = orjson.dumps
        self._loads = orjson.loads
        self._decode_error = orjson.JSONDecodeError
        self._partition_for_key = partition_for_key
        self.partitions = partitions
        self.fixed: int | None = args.partition
        self.sep: bytes | None = args.key_separator.encode() if args.key_separator else None
        self.json_values: bool = args.json_values
        self.sticky = random.randrange(partitions)  # keyless records: KIP-480 sticky partition
        self.line_no = 0

    def encode(self, line: bytes) -> tuple[int, bytes, int] | None:
        self.line_no += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        size = len(line)
        key_part = b""
        partition = self.sticky if self.fixed is None else self.fixed
        if self.sep is not None:
            key, found, line = line.partition(self.sep)
            if not found:
                raise CliError(f"line {self.line_no}: no key separator {self.sep.decode()!r} in it")
            key_part = self._field(b"key", key) + b","
            if self.fixed is None:
                partition = self._partition_for_key(key, self.partitions)
        if self.json_values:
            if not line.strip():
                return None
            try:
                value = self._dumps(self._loads(line))
            except self._decode_error as e:
                raise CliError(
                    f"line {self.line_no}: not JSON ({e}); drop --json-values?"
                ) from None
            value_part = b'"value":' + value
        else:
            value_part = self._field(b"value", line)
        return partition, b"{" + key_part + value_part + b"}\n", size

    def _field(self, name: bytes, raw: bytes) -> bytes:
        """A JSON string field, or ``name_b64`` for bytes that are not UTF-8."""
        try:
            return b'"' + name + b'":' + self._dumps(raw.decode())
        except UnicodeDecodeError:
            return b'"' + name + b'_b64":"' + base64.b64encode(raw) + b'"'

    def next_sticky(self) -> None:
        self.sticky = (self.sticky + 1) % self.partitions


class _Sender:
    """Up to ``max_in_flight`` batches queued or in flight; per partition in order unless told.

    With ``ordered``, a batch waits for the previous batch of its partition, so only one request
    per partition travels at a time while the following batches are already encoded; requests
    carry the producer session's sequence numbers. Without, each carries an Idempotency-Key.
    Either way the router may send a request again after a failure, and the broker appends it
    once.
    """

    def __init__(
        self,
        router: Router,
        session: ProducerSession | None,
        topic: str,
        acks: str,
        max_in_flight: int,
        on_ack: Callable[[int, int], None],
    ) -> None:
        import uuid

        self.router = router
        self.session = session
        self.topic = topic
        self.params = {"acks": acks}
        self.ordered = session is not None
        self.on_ack = on_ack
        self.key_prefix = f"logbus-cli-{uuid.uuid4().hex}"
        self.requests = 0
        self.pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="logbus-produce")
        self.slots = threading.BoundedSemaphore(max_in_flight)
        self.last: dict[int, Future[None]] = {}
        self.error: BaseException | None = None

    def submit(self, partition: int, lines: list[bytes], size: int) -> None:
        while not self.slots.acquire(timeout=0.1):
            self.check()
        self.check()
        prev = self.last.get(partition) if self.ordered else None
        body = b"".join(lines)
        key = f"{self.key_prefix}-{self.requests}"
        self.requests += 1
        self.last[partition] = self.pool.submit(
            self._send, prev, partition, body, len(lines), size, key
        )

    def _send(
        self,
        prev: Future[None] | None,
        partition: int,
        body: bytes,
        count: int,
        size: int,
        key: str,
    ) -> None:
        from logbus_client.routing import RoutingError

        path = _topic_path(self.topic, "partitions", partition, "records")
        try:
            if prev is not None:
                wait_futures([prev])
            if self.error is not None:
                return
            try:
                if self.session is not None:
                    response = self.session.send(partition, body, count, params=self.params)
                else:
                    response = self.router.request(
                        "POST",
                        path,
                        partition=(self.topic, partition),
                        idempotent=True,
                        params=self.params,
                        content=body,
                        headers={"content-type": "application/x-ndjson", "idempotency-key": key},
                    )
            except RoutingError as e:
                raise _unreachable(self.router, "POST", path, e) from None
            _raise_for_problem(response)
            if response.status_code == 202:  # acks=0
                count = int(response.headers.get("logbus-record-count", count))
            self.on_ack(count, size)
        except BaseException as e:
            if self.error is None:
                self.error = e
        finally:
            self.slots.release()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, cancel: bool = False) -> None:
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)


def _produce(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from logbus_client.producer import ProducerSession

    with _router(args, pool=args.max_in_flight) as router:
        topic = _routed(router, "GET", _topic_path(args.topic)).json()
        partitions: int = topic["partitions"]
        if args.partition is not None and args.partition >= partitions:
            raise CliError(f"topic {args.topic} has {partitions} partition(s): no {args.partition}")
        router.view.apply_partitions(args.topic, topic.get("partition_details") or [])
        session = None
        if not args.unordered:
            session = ProducerSession(router, args.topic)
            try:
                init = session.init()
            except Exception as e:
                raise _unreachable(router, "POST", "/v1/producers", e) from None
            _raise_for_problem(init)
        encoder = _Encoder(args, partitions)
        show = sys.stderr.isatty() if args.progress is None else args.progress
        bar = tqdm(
            desc=f"produce {args.topic}",
            unit=" rec",
            unit_scale=True,
            file=sys.stderr,
            disable=not show,
            dynamic_ncols=True,
        )
        lock = threading.Lock()
        acked = [0, 0]  # records, payload bytes

        def on_ack(count: int, size: int) -> None:
            with lock:
                acked[0] += count
                acked[1] += size
                bar.update(count)

        sender = _Sender(router, session, args.topic, args.acks, args.max_in_flight, on_ack)
        started = time.monotonic()
        try:
            _produce_loop(args, encoder, sender, _StdinLines(sys.stdin.fileno()))
            sender.close()
            sender.check()
        except BaseException:
            sender.close(cancel=True)
            bar.close()
            with lock:
                print(f"{acked[0]} record(s) were acknowledged", file=sys.stderr)
            raise
        bar.close()
    elapsed = max(time.monotonic() - started, 1e-9)
    records, size = acked
    print(
        f"produced {records} record(s), {size / 1e6:.2f} MB to {args.topic} in {elapsed:.2f} s: "
        f"{records / elapsed:,.0f} records/s, {size / 1e6 / elapsed:.2f} MB/s",
        file=sys.stderr,
    )
    return 0


def _produce_loop(
    args: argparse.Namespace,
    encoder: _Encoder,
    sender: _Sender,
    lines: _StdinLines,
) -> None:
    buffers: dict[int, list[bytes]] = {}
    sizes: dict[int, int] = {}  # NDJSON bytes per buffer
    payload: dict[int, int] = {}  # input bytes per buffer
    linger = args.linger_ms / 1000
    deadline: float | None = None
    max_body = MAX_IDEMPOTENT_BODY_BYTES  # every request is idempotent (one batch)

    def flush(p: int) -> None:
        lines = buffers.pop(p)
        sizes.pop(p)
        sender.submit(p, lines, payload.pop(p))
        if p == encoder.sticky:
            encoder.next_sticky()

    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        item = lines.get(timeout)
        if item is None:  # linger.ms passed without input: send what is buffered
            for p in list(buffers):
                flush(p)
            deadline = None
            continue
        if item is _EOF:
            break
        assert isinstance(item, list)
        for line in item:
            encoded = encoder.encode(line)
            if encoded is None:
                continue
            p, record, size = encoded
            if p in buffers and sizes[p] + len(record) > max_body:
                flush(p)  # one batch per request: keep it within max.message.bytes
            if p in buffers:
                buffers[p].append(record)
                sizes[p] += len(record)
                payload[p] += size
            else:
                buffers[p], sizes[p], payload[p] = [record], len(record), size
            if len(buffers[p]) >= args.batch_size:
                flush(p)
        sender.check()
        if not buffers:
            deadline = None
        elif deadline is None:
            deadline = time.monotonic() + linger
    for p in list(buffers):
        flush(p)


# -- consume --------------------------------------------------------------------------------------


class _LimitReached(Exception):
    """--max-records printed: stop every partition's loop."""


def _consume(args: argparse.Namespace) -> int:
    import asyncio

    try:
        return asyncio.run(_consume_async(args))
    except KeyboardInterrupt:
        sys.stdout.flush()
        return 0


async def _consume_async(args: argparse.Namespace) -> int:
    import asyncio

    import httpx

    from logbus_client.routing import AsyncRouter

    timeout = httpx.Timeout(args.timeout, read=args.timeout + LONG_POLL_MS / 1000)
    api_key = _api_key(args)
    async with AsyncRouter(
        _urls(args), timeout=timeout, headers=_UA, api_key=api_key, pool=16
    ) as router:
        fetcher = _Fetcher(router, args)
        topic = await fetcher.get_json(_topic_path(args.topic))
        details = {d["partition"]: d for d in topic["partition_details"]}
        router.view.apply_partitions(args.topic, topic["partition_details"])
        if args.partition is None:
            parts = sorted(details)
        elif args.partition in details:
            parts = [args.partition]
        else:
            raise CliError(
                f"topic {args.topic} has {topic['partitions']} partition(s): no {args.partition}"
            )
        starts = await asyncio.gather(*(fetcher.start_offset(details[p]) for p in parts))
        if args.follow and sys.stderr.isatty():
            where = ", ".join(f"{p}@{o}" for p, o in zip(parts, starts, strict=True))
            print(f"following {args.topic} from {where}; Ctrl-C to stop", file=sys.stderr)
        try:
            async with asyncio.TaskGroup() as group:
                for p, start in zip(parts, starts, strict=True):
                    end = None if args.follow else details[p]["high_watermark"]
                    group.create_task(fetcher.run(p, start, end))
        except BaseExceptionGroup as eg:
            errors = _leaves(eg)
            for e in errors:
                if not isinstance(e, _LimitReached):
                    raise e from None
    return 0


def _leaves(eg: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in eg.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


class _Fetcher:
    """Fetch loops of one consume command.

    Records travel as Kafka record batches (``application/vnd.logbus.batch``) and are decoded
    here with :mod:`core_log.batch`: the broker sends the stored bytes as they are, which is many
    times cheaper for it than rendering JSON, and the output is the same — ``--format json``
    renders with the broker's own :func:`api.records_codec.record_to_json`.
    """

    def __init__(self, router: AsyncRouter, args: argparse.Namespace) -> None:
        import orjson

        from core_log.batch import decode_records, scan_batches
        from core_log.errors import CorruptRecordError

        from .records_codec import record_to_json

        self.router = router
        self.topic: str = args.topic
        self.follow: bool = args.follow
        self.start: tuple[str, int] = args.start
        self.remaining: int | None = args.max_records
        self.as_json = args.format == "json"
        self.dumps = orjson.dumps
        self.loads = orjson.loads
        self.decode_error = orjson.JSONDecodeError
        self.scan_batches = scan_batches
        self.decode_records = decode_records
        self.corrupt_error = CorruptRecordError
        self.record_to_json = record_to_json
        self.out = sys.stdout.buffer

    async def get(
        self,
        path: str,
        params: dict[str, Any] | None = None,
        binary: bool = False,
        partition: int | None = None,
    ) -> httpx.Response:
        """A GET routed to ``partition``'s leader (or to any broker), retried per
        :mod:`logbus_client.routing`; CliError when no broker answers."""
        from logbus_client.routing import RoutingError

        headers = {"accept": BATCH_TYPE} if binary else None
        tp = None if partition is None else (self.topic, partition)
        try:
            return await self.router.request(
                "GET", path, partition=tp, idempotent=True, params=params, headers=headers
            )
        except RoutingError as e:
            raise _unreachable(self.router, "GET", path, e) from None

    async def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        response = await self.get(path, params)
        _raise_for_problem(response)
        return self.loads(response.content)

    async def start_offset(self, d: dict[str, Any]) -> int:
        kind, n = self.start
        p, first, hw = d["partition"], d["log_start_offset"], d["high_watermark"]
        if kind == "earliest":
            return int(first)
        if kind == "latest":
            return int(hw)
        if kind == "tail":
            return int(max(first, hw - n))
        if kind == "time":
            doc = await self.get_json(
                _topic_path(self.topic, "partitions", p, "offsets"), {"at": str(n)}
            )
            return int(hw if doc["offset"] is None else doc["offset"])
        if n > d["log_end_offset"]:
            raise CliError(
                f"offset {n} is past the end of partition {p} (log end offset "
                f"{d['log_end_offset']})"
            )
        return n

    async def run(self, partition: int, offset: int, end: int | None) -> None:
        path = _topic_path(self.topic, "partitions", partition, "records")
        params: dict[str, Any] = {"wait_ms": LONG_POLL_MS} if self.follow else {}
        while end is None or offset < end:
            params["offset"] = offset
            response = await self._fetch(partition, path, params)
            if response.status_code == 416:
                offset = self._reset(partition, offset, response)
                continue
            _raise_for_problem(response)
            records, unreadable = self._decode(partition, response.content, offset, end)
            if self.remaining is not None:
                records = records[: self.remaining]
                self.remaining -= len(records)
            self._print(partition, records)
            if unreadable is not None and self.remaining != 0:
                raise unreadable
            if self.remaining == 0:
                raise _LimitReached
            next_offset = int(response.headers.get("logbus-next-offset", offset))
            if records:
                next_offset = max(next_offset, records[-1].offset + 1)
            if next_offset <= offset and not self.follow:
                return  # no progress below the high watermark: nothing more to read
            offset = next_offset

    async def _fetch(self, partition: int, path: str, params: dict[str, Any]) -> httpx.Response:
        """One fetch; with --follow, a lost or failing broker is waited for: a broker restart
        does not end a tail."""
        import asyncio

        delay = 0.5
        while True:
            try:
                response = await self.get(path, params, binary=True, partition=partition)
            except CliError as e:
                if not self.follow:
                    raise
                problem = str(e)
            else:
                if not self.follow or response.status_code < 500:
                    return response
                problem = _problem_text(response)
            print(
                f"logbus consume: partition {partition}: {problem}; retrying in {delay:g} s",
                file=sys.stderr,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    def _decode(
        self, partition: int, data: bytes, offset: int, end: int | None
    ) -> tuple[list[Record], CliError | None]:
        """The records of ``data`` in [offset, end), and the error for a stored batch no
        reader can serve (the records before it are still returned, to be printed first)."""
        out: list[Record] = []
        for pos, h in self.scan_batches(data):
            if h.last_offset < offset:
                continue
            if end is not None and h.base_offset >= end:
                break
            try:
                batch = self.decode_records(data, pos)
            except self.corrupt_error as e:
                first = max(offset, h.base_offset)
                return out, CliError(
                    f"partition {partition}: a stored record at offsets {first}..{h.last_offset} "
                    f"cannot be read ({e}); to skip it: logbus consume {self.topic} "
                    f"--partition {partition} --from {h.last_offset + 1}"
                )
            out.extend(r for r in batch if r.offset >= offset and (end is None or r.offset < end))
        return out, None

    def _reset(self, partition: int, offset: int, response: httpx.Response) -> int:
        """Offset out of range: below the log start (retention moved it) → jump to the start."""
        try:
            start = int(self.loads(response.content)["log_start_offset"])
        except (ValueError, KeyError, TypeError):
            start = -1
        if offset >= start >= 0:
            raise CliError(_problem_text(response))
        print(
            f"logbus consume: partition {partition}: offset {offset} is gone (log start "
            f"{start}); continuing at {start}",
            file=sys.stderr,
        )
        return start

    def _print(self, partition: int, records: list[Record]) -> None:
        if not records:
            return
        if self.as_json:
            to_json = self.record_to_json
            lines = [self.dumps({"partition": partition, **to_json(r)}) for r in records]
        else:
            lines = [self._value(r.value) for r in records]
        self.out.write(b"\n".join(lines) + b"\n")
        self.out.flush()

    def _value(self, value: bytes | None) -> bytes:
        """A JSON string value as its text, other values as stored, a tombstone as ``null``."""
        if value is None:
            return b"null"
        if value[:1] == b'"':
            try:
                text = self.loads(value)
            except self.decode_error:
                return value
            if isinstance(text, str):
                return text.encode()
        return value


# -- bench ----------------------------------------------------------------------------------------


def _bench(args: argparse.Namespace) -> int:
    try:
        from benchmarks.http import run_bench
    except ModuleNotFoundError as e:  # an optional dependency of the benchmark
        raise CliError(f"the benchmark needs {e.name!r}: pip install -e '.[bench]'", 2) from None
    return run_bench(args)
