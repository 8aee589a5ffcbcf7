"""``logbus transactions``: list transactions and abort a hanging one (an operator's tools).

Like ``kafka-transactions.sh list`` / ``find-hanging`` / ``abort``: ``list`` shows every
coordinator's transactional ids (``--state ongoing --min-duration-ms 60000`` finds the hanging
ones), ``abort`` ends an id's open transaction and fences its producer (ALTER on the cluster).
"""

from __future__ import annotations

import argparse
from urllib.parse import quote

from . import client_cli as cli


def add_transactions(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    txns = sub.add_parser("transactions", help="list transactions and abort hanging ones")
    tsub = txns.add_subparsers(dest="transactions_command", required=True, metavar="COMMAND")

    lst = tsub.add_parser("list", parents=parents, help="transactional ids, states and durations")
    lst.add_argument(
        "--state",
        action="append",
        default=[],
        help="only these states (ongoing, prepare_commit, complete_abort, ...); repeatable",
    )
    lst.add_argument(
        "--min-duration-ms",
        type=int,
        default=0,
        help="only transactions open at least this long (the hanging ones)",
    )
    lst.set_defaults(func=cli._command(_list))

    abort = tsub.add_parser(
        "abort", parents=parents, help="abort an id's open transaction and fence its producer"
    )
    abort.add_argument("transactional_id")
    abort.set_defaults(func=cli._command(_abort))


def _list(args: argparse.Namespace) -> int:
    params: dict[str, object] = {"min_duration_ms": args.min_duration_ms}
    if args.state:
        params["state"] = args.state
    with cli._client(args) as client:
        doc = cli._request(client, "GET", "/v1/transactions", params=params).json()
    if args.json:
        cli._print_json(doc)
        return 0
    rows = [
        (
            t["transactional_id"],
            t["state"],
            t["producer_id"],
            t["producer_epoch"],
            t["duration_ms"],
            sum(len(p["partitions"]) for p in t["partitions"]),
        )
        for t in doc["transactions"]
    ]
    headers = ["TRANSACTIONAL-ID", "STATE", "PRODUCER", "EPOCH", "OPEN-MS", "PARTITIONS"]
    print(cli._table(headers, rows) if rows else "no transactions")
    if doc["unavailable"]:
        print(f"not listed: the coordinators of partitions {doc['unavailable']} did not answer")
    return 0


def _abort(args: argparse.Namespace) -> int:
    path = f"/v1/transactions/{quote(args.transactional_id, safe='')}/abort"
    with cli._client(args) as client:
        doc = cli._request(client, "POST", path, json={}).json()
    if args.json:
        cli._print_json(doc)
    else:
        print(
            f"aborted the transaction of {args.transactional_id}; its producer is fenced "
            f"(epoch {doc['producer_epoch']})"
        )
    return 0
