"""``logbus groups``: list, describe, reset and delete consumer groups (an operator's tools).

Like ``kafka-consumer-groups.sh``: reset and delete only touch a group with no members.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from . import client_cli as cli


def add_groups(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    groups = sub.add_parser("groups", help="list, describe, reset and delete consumer groups")
    gsub = groups.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")

    lst = gsub.add_parser("list", parents=parents, help="groups with state, members and lag")
    lst.set_defaults(func=cli._command(_list))

    describe = gsub.add_parser(
        "describe", parents=parents, help="members, assignment, committed offsets and lag"
    )
    describe.add_argument("group")
    describe.set_defaults(func=cli._command(_describe))

    reset = gsub.add_parser(
        "reset", parents=parents, help="reset the committed offsets of a group with no members"
    )
    reset.add_argument("group")
    reset.add_argument(
        "--to",
        required=True,
        nargs="+",
        metavar="TARGET",
        help="earliest, latest, a time (ISO-8601 or @MS), or TOPIC:PARTITION:OFFSET ...",
    )
    reset.add_argument(
        "--topic",
        action="append",
        default=[],
        help="topics to reset (earliest/latest/time; default: the group's topics)",
    )
    reset.set_defaults(func=cli._command(_reset))

    delete = gsub.add_parser("delete", parents=parents, help="delete an empty group's offsets")
    delete.add_argument("group")
    delete.set_defaults(func=cli._command(_delete))


def _path(group: str, *rest: str) -> str:
    return "/".join(["/v1/groups", quote(group, safe=""), *rest])


def _list(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        doc = cli._request(client, "GET", "/v1/groups").json()
    if args.json:
        cli._print_json(doc)
        return 0
    rows = [(g["group"], g["state"], g["members"], g["lag"]) for g in doc["groups"]]
    print(cli._table(["GROUP", "STATE", "MEMBERS", "LAG"], rows) if rows else "no groups")
    return 0


def _describe(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        doc = cli._request(client, "GET", _path(args.group)).json()
    if args.json:
        cli._print_json(doc)
        return 0
    print(f"group {doc['group']}: {doc['state']}, epoch {doc['group_epoch']}, lag {doc['lag']}")
    rows = [
        (
            o["topic"],
            o["partition"],
            _dash(o["committed_offset"]),
            _dash(o["log_end_offset"]),
            _dash(o["lag"]),
            _dash(o["member_id"]),
        )
        for o in doc["offsets"]
    ]
    if rows:
        headers = ["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG", "MEMBER"]
        print(cli._table(headers, rows))
    for m in doc["members"]:
        parts = ",".join(f"{a['topic']}-{a['partition']}" for a in m["assignment"]) or "-"
        print(f"member {m['member_id']} epoch {m['member_epoch']} client {m['client_id']}: {parts}")
    return 0


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _reset(args: argparse.Namespace) -> int:
    body = _reset_body(args.to, args.topic)
    with cli._client(args) as client:
        doc = cli._request(client, "POST", _path(args.group, "offsets", "reset"), json=body).json()
    if args.json:
        cli._print_json(doc)
        return 0
    rows = [(o["topic"], o["partition"], o["offset"]) for o in doc["offsets"]]
    print(cli._table(["TOPIC", "PARTITION", "OFFSET"], rows))
    return 0


def _reset_body(targets: list[str], topics: list[str]) -> dict[str, Any]:
    if len(targets) == 1 and targets[0] in ("earliest", "latest"):
        return {"to": targets[0], "topics": topics or None}
    if all(t.count(":") >= 2 and t.rsplit(":", 2)[1].isdigit() for t in targets):
        offsets = []
        for t in targets:
            topic, partition, offset = t.rsplit(":", 2)
            if not offset.isdigit():
                raise cli.CliError(f"--to {t!r}: the offset must be a number", 2)
            offsets.append({"topic": topic, "partition": int(partition), "offset": int(offset)})
        return {"to": "offsets", "offsets": offsets}
    if len(targets) == 1:
        try:
            kind, ms = cli._start_position(targets[0])
        except argparse.ArgumentTypeError:
            kind, ms = "", 0
        if kind == "time":
            return {"to": "timestamp", "timestamp": ms, "topics": topics or None}
    raise cli.CliError(
        f"--to {' '.join(targets)!r}: use earliest, latest, a time, or TOPIC:PARTITION:OFFSET", 2
    )


def _delete(args: argparse.Namespace) -> int:
    with cli._client(args) as client:
        cli._request(client, "DELETE", _path(args.group))
    if args.json:
        cli._print_json({"group": args.group, "deleted": True})
    else:
        print(f"deleted group {args.group}")
    return 0
