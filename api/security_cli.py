"""``logbus users|keys|acls|quotas|whoami``: the security admin commands (an operator's tools).

Theory of operation: each command is one or two HTTP calls to the routes of
:mod:`api.routes.security` and :mod:`api.routes.quotas`, through the same client as ``topics``
(:func:`api.client_cli._client`: any broker of ``--url`` answers, since users, keys, ACLs and
quotas live in the metadata store and every broker applies a change within a second). The
commands send the operator's credential like every client command (``--api-key``,
``--api-key-file`` or ``$LOGBUS_API_KEY``); changing users, keys and ACLs needs ``alter`` on the
cluster, listing them ``describe`` (what the bootstrap admin has). Output is a table for people
and the broker's JSON document with ``--json``; a refusal is one line on stderr and exit 1, a
usage error (an unknown operation, a quota without an entity) exit 2 before any request.

The names follow Kafka's tools where they exist (``kafka-acls.sh``: principal ``User:NAME``,
operations, ``allow``/``deny``, literal or prefixed patterns; ``kafka-configs.sh``'s client
quotas: user, client id, or both, each a name or the default entity, ``<default>`` on the
wire) but are spelt as this broker's API spells them (``describe_configs``, ``--pattern
prefixed``), so the CLI, the docs and ``curl`` say the same thing.

A new user's or key's secret is printed once, on stdout, as the broker shows it once: it is
the answer the operator asked for. It is never written anywhere else.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any
from urllib.parse import quote

from auth_quotas.acl import Operation, PatternType, Permission, ResourceType
from auth_quotas.quotas import QuotaType

from . import client_cli as cli

DEFAULT_ENTITY = "<default>"  # Kafka's default quota entity, as the broker stores it

# The broker's own vocabularies (one definition: auth_quotas), for argparse's choices.
RESOURCE_TYPES = tuple(t.value for t in ResourceType)
PATTERNS = tuple(p.value for p in PatternType)
OPERATIONS = tuple(o.value for o in Operation)
PERMISSIONS = tuple(p.value for p in Permission)
QUOTA_TYPES = tuple(q.value for q in QuotaType)


def add_security(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    """Register ``users``, ``keys``, ``acls``, ``quotas`` and ``whoami`` on ``logbus``."""
    _add_users(sub, parents)
    _add_keys(sub, parents)
    _add_acls(sub, parents)
    _add_quotas(sub, parents)
    whoami = sub.add_parser(
        "whoami", parents=parents, help="the principal the broker sees for your credential"
    )
    whoami.set_defaults(func=cli._command(_whoami))


# -- parsing ---------------------------------------------------------------------------------------


def _principal(raw: str) -> str:
    if not raw.startswith("User:") or len(raw) == len("User:"):
        raise argparse.ArgumentTypeError(f"expected User:NAME or User:*, got {raw!r}")
    return raw


def _rate(raw: str) -> float:
    """A quota value: a number >= 0 (0 blocks the entity)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {raw!r}")
    return value


def _add_users(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    users = sub.add_parser("users", help="create, list and delete users (API-key identities)")
    usub = users.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")

    create = usub.add_parser(
        "create", parents=parents, help="create a user and its first API key (shown once)"
    )
    create.add_argument("name", help="1..200 of [A-Za-z0-9._@+-]")
    create.add_argument("--description", default="", help="a note on the first key")
    create.set_defaults(func=cli._command(_users_create))

    lst = usub.add_parser("list", parents=parents, help="list users")
    lst.set_defaults(func=cli._command(_users_list))

    delete = usub.add_parser(
        "delete", parents=parents, help="delete a user and revoke its keys (its ACLs stay)"
    )
    delete.add_argument("name")
    delete.set_defaults(func=cli._command(_users_delete))


def _add_keys(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    keys = sub.add_parser("keys", help="create, list and revoke a user's API keys")
    ksub = keys.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")

    create = ksub.add_parser("create", parents=parents, help="another API key (shown once)")
    create.add_argument("user")
    create.add_argument("--description", default="", help="a note, e.g. where the key lives")
    create.set_defaults(func=cli._command(_keys_create))

    lst = ksub.add_parser("list", parents=parents, help="a user's key ids (never the keys)")
    lst.add_argument("user")
    lst.set_defaults(func=cli._command(_keys_list))

    revoke = ksub.add_parser(
        "revoke", parents=parents, help="revoke a key (every broker refuses it within a second)"
    )
    revoke.add_argument("user")
    revoke.add_argument("key_id", metavar="KEY_ID", help="16 hex characters (see keys list)")
    revoke.set_defaults(func=cli._command(_keys_revoke))


def _acl_filters(p: argparse.ArgumentParser) -> None:
    """The fields of an ACL filter (``acls list`` and ``acls remove``): each given one must
    equal."""
    p.add_argument("--principal", type=_principal, help="User:NAME or User:*")
    p.add_argument("--resource-type", choices=RESOURCE_TYPES)
    p.add_argument("--name", help="the resource name (or prefix) as stored; * for all")
    p.add_argument("--pattern", choices=PATTERNS)
    p.add_argument("--operation", choices=OPERATIONS)
    p.add_argument("--permission", choices=PERMISSIONS)


def _add_acls(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    acls = sub.add_parser("acls", help="add, list and remove ACLs (Kafka's model)")
    asub = acls.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")

    add = asub.add_parser(
        "add",
        parents=parents,
        help="allow (or deny) principals operations on a resource",
        description="Add one ACL per principal and operation. Deny wins over allow; read, "
        "write, delete and alter imply describe. Adding an existing ACL changes nothing.",
    )
    add.add_argument(
        "--principal",
        type=_principal,
        action="append",
        required=True,
        help="User:NAME, or User:* for everyone (repeatable)",
    )
    add.add_argument("--resource-type", choices=RESOURCE_TYPES, required=True)
    add.add_argument(
        "--name",
        required=True,
        help="the resource's name, its prefix with --pattern prefixed, or * for all "
        "(a cluster ACL names kafka-cluster)",
    )
    add.add_argument("--pattern", choices=PATTERNS, default="literal", help="default: literal")
    add.add_argument(
        "--operation", choices=OPERATIONS, action="append", required=True, help="(repeatable)"
    )
    add.add_argument("--permission", choices=PERMISSIONS, default="allow", help="default: allow")
    add.set_defaults(func=cli._command(_acls_add))

    lst = asub.add_parser("list", parents=parents, help="list ACLs (optionally filtered)")
    _acl_filters(lst)
    lst.set_defaults(func=cli._command(_acls_list))

    remove = asub.add_parser(
        "remove", parents=parents, help="remove the ACLs a filter matches (at least one field)"
    )
    _acl_filters(remove)
    remove.set_defaults(func=cli._command(_acls_remove))


def _quota_entity_options(p: argparse.ArgumentParser) -> None:
    user = p.add_mutually_exclusive_group()
    user.add_argument("--user", metavar="NAME", help="a user (the authenticated principal's name)")
    user.add_argument(
        "--user-default", action="store_true", help="the default user: each user separately"
    )
    client = p.add_mutually_exclusive_group()
    client.add_argument(
        "--client-id", metavar="ID", help="a client id (the Logbus-Client-Id header)"
    )
    client.add_argument(
        "--client-id-default",
        action="store_true",
        help="the default client id: each client id separately",
    )


def _add_quotas(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: list[argparse.ArgumentParser]
) -> None:
    quotas = sub.add_parser(
        "quotas", help="set, list and delete client quotas (by user, client id, or both)"
    )
    qsub = quotas.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")

    set_ = qsub.add_parser(
        "set",
        parents=parents,
        help="set quotas of an entity (other quotas of it are kept)",
        description="Set quotas of a user, a client id, or both (each a name or the default). "
        "In force on every broker within about a second. A value of 0 blocks the entity.",
    )
    _quota_entity_options(set_)
    set_.add_argument("--producer-byte-rate", type=_rate, metavar="BYTES/S")
    set_.add_argument("--consumer-byte-rate", type=_rate, metavar="BYTES/S")
    set_.add_argument(
        "--request-percentage", type=_rate, metavar="PERCENT", help="of one event loop's time"
    )
    set_.add_argument(
        "--controller-mutation-rate",
        type=_rate,
        metavar="PER_S",
        help="partitions created, deleted or added per second",
    )
    set_.set_defaults(func=cli._command(_quotas_set))

    lst = qsub.add_parser(
        "list", parents=parents, help="list quotas (optionally of one user and/or client id)"
    )
    _quota_entity_options(lst)
    lst.set_defaults(func=cli._command(_quotas_list))

    delete = qsub.add_parser(
        "delete", parents=parents, help="delete an entity's quotas (all, or those named)"
    )
    _quota_entity_options(delete)
    delete.add_argument(
        "--quota",
        choices=QUOTA_TYPES,
        action="append",
        metavar="TYPE",
        help=f"delete only this quota (repeatable): {', '.join(QUOTA_TYPES)}",
    )
    delete.set_defaults(func=cli._command(_quotas_delete))


# -- output ----------------------------------------------------------------------------------------


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat("T", "seconds")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _show_secret(what: str, key: str) -> None:
    print(f"{what}\nAPI key (shown once, store it now; it cannot be shown again):\n    {key}")


# -- users and keys --------------------------------------------------------------------------------


def _user_path(user: str, *rest: str) -> str:
    return "/".join(["/v1/users", quote(user, safe=""), *rest])


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """One request to a broker of ``--url`` (the next one if it does not answer); the
    answer's JSON document, None when it has no body (a 204)."""
    with cli._client(args) as client:
        r = cli._request(client, method, path, **kwargs)
    return r.json() if r.content else None


def _users_create(args: argparse.Namespace) -> int:
    body = {"name": args.name, "description": args.description}
    doc = _call(args, "POST", "/v1/users", json=body)
    if args.json:
        cli._print_json(doc)
    else:
        _show_secret(f"created user {doc['name']} with key {doc['key_id']}", doc["key"])
    return 0


def _users_list(args: argparse.Namespace) -> int:
    doc = _call(args, "GET", "/v1/users")
    if args.json:
        cli._print_json(doc)
        return 0
    rows = [(u["name"], _when(u["created_ms"])) for u in doc["users"]]
    print(cli._table(["USER", "CREATED"], rows) if rows else "no users")
    return 0


def _users_delete(args: argparse.Namespace) -> int:
    _call(args, "DELETE", _user_path(args.name))
    if args.json:
        cli._print_json({"user": args.name, "deleted": True})
    else:
        print(f"deleted user {args.name} and revoked its keys (its ACLs stay)")
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    path = _user_path(args.user, "keys")
    doc = _call(args, "POST", path, json={"description": args.description})
    if args.json:
        cli._print_json(doc)
    else:
        _show_secret(f"created key {doc['key_id']} for user {doc['user']}", doc["key"])
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    doc = _call(args, "GET", _user_path(args.user, "keys"))
    if args.json:
        cli._print_json(doc)
        return 0
    rows = [(k["key_id"], _when(k["created_ms"]), k["description"] or "-") for k in doc["keys"]]
    print(
        cli._table(["KEY-ID", "CREATED", "DESCRIPTION"], rows)
        if rows
        else f"user {args.user} has no keys"
    )
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    _call(args, "DELETE", _user_path(args.user, "keys", args.key_id))
    if args.json:
        cli._print_json({"user": args.user, "key_id": args.key_id, "revoked": True})
    else:
        print(f"revoked key {args.key_id} of user {args.user}")
    return 0


# -- ACLs ------------------------------------------------------------------------------------------


def _acl_table(acls: list[dict[str, Any]]) -> str:
    rows = [
        (
            a["principal"],
            a["permission"],
            a["operation"],
            a["resource_type"],
            a["name"],
            a["pattern"],
        )
        for a in acls
    ]
    return cli._table(["PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "NAME", "PATTERN"], rows)


def _acls_add(args: argparse.Namespace) -> int:
    body = [
        {
            "principal": principal,
            "resource_type": args.resource_type,
            "name": args.name,
            "pattern": args.pattern,
            "operation": operation,
            "permission": args.permission,
        }
        for principal in dict.fromkeys(args.principal)
        for operation in dict.fromkeys(args.operation)
    ]
    doc = _call(args, "POST", "/v1/acls", json=body)
    if args.json:
        cli._print_json(doc)
        return 0
    print(f"added {doc['added']} new ACL(s) of {len(doc['acls'])}:")
    print(_acl_table(doc["acls"]))
    return 0


def _filter_params(args: argparse.Namespace) -> dict[str, str]:
    fields = ("principal", "resource_type", "name", "pattern", "operation", "permission")
    return {f: getattr(args, f) for f in fields if getattr(args, f) is not None}


def _acls_list(args: argparse.Namespace) -> int:
    doc = _call(args, "GET", "/v1/acls", params=_filter_params(args))
    if args.json:
        cli._print_json(doc)
        return 0
    print(_acl_table(doc["acls"]) if doc["acls"] else "no ACLs")
    return 0


def _acls_remove(args: argparse.Namespace) -> int:
    params = _filter_params(args)
    if not params:
        raise cli.CliError(
            "name at least one field to match (--principal, --resource-type, --name, "
            "--pattern, --operation, --permission)",
            2,
        )
    doc = _call(args, "DELETE", "/v1/acls", params=params)
    if args.json:
        cli._print_json(doc)
        return 0
    removed = doc["removed"]
    print(f"removed {len(removed)} ACL(s)" + (":" if removed else ""))
    if removed:
        print(_acl_table(removed))
    return 0


# -- quotas ----------------------------------------------------------------------------------------


def _entity(args: argparse.Namespace) -> dict[str, str]:
    """``{"user": …, "client_id": …}`` of the entity options, ``<default>`` for a default."""
    out = {}
    if args.user is not None or args.user_default:
        out["user"] = DEFAULT_ENTITY if args.user_default else args.user
    if args.client_id is not None or args.client_id_default:
        out["client_id"] = DEFAULT_ENTITY if args.client_id_default else args.client_id
    return out


_ENTITY_OPTIONS = "--user, --user-default, --client-id or --client-id-default"


def _entity_text(entity: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in entity.items())


def _quota_table(entries: list[dict[str, Any]]) -> str:
    rows = [
        (e["entity"].get("user", "-"), e["entity"].get("client_id", "-"), name, _number(value))
        for e in entries
        for name, value in sorted(e["quotas"].items())
    ]
    return cli._table(["USER", "CLIENT-ID", "QUOTA", "VALUE"], rows)


def _quotas_set(args: argparse.Namespace) -> int:
    entity = _entity(args)
    if not entity:
        raise cli.CliError(f"name the entity: {_ENTITY_OPTIONS}", 2)
    values = {q: getattr(args, q) for q in QUOTA_TYPES if getattr(args, q) is not None}
    if not values:
        raise cli.CliError(
            "name at least one quota: --producer-byte-rate, --consumer-byte-rate, "
            "--request-percentage or --controller-mutation-rate",
            2,
        )
    body = {"entity": entity, "quotas": values}
    doc = _call(args, "PUT", "/v1/quotas", json=body)
    if args.json:
        cli._print_json(doc)
        return 0
    print(f"quotas of {_entity_text(entity)} now:")
    print(_quota_table(doc["quotas"]))
    return 0


def _quotas_list(args: argparse.Namespace) -> int:
    doc = _call(args, "GET", "/v1/quotas", params=_entity(args))
    if args.json:
        cli._print_json(doc)
        return 0
    print(_quota_table(doc["quotas"]) if doc["quotas"] else "no quotas")
    return 0


def _quotas_delete(args: argparse.Namespace) -> int:
    entity = _entity(args)
    if not entity:
        raise cli.CliError(f"name the entity: {_ENTITY_OPTIONS}", 2)
    params: dict[str, Any] = dict(entity)
    if args.quota:
        params["quota"] = list(dict.fromkeys(args.quota))
    _call(args, "DELETE", "/v1/quotas", params=params)
    which = ", ".join(params.get("quota", [])) or "all quotas"
    if args.json:
        cli._print_json({"entity": entity, "deleted": params.get("quota", "all")})
    else:
        print(f"deleted {which} of {_entity_text(entity)}")
    return 0


# -- whoami ----------------------------------------------------------------------------------------


def _whoami(args: argparse.Namespace) -> int:
    doc = _call(args, "GET", "/v1/whoami")
    if args.json:
        cli._print_json(doc)
    elif doc["authenticated"]:
        print(f"{doc['principal']} (by {doc['method']})")
    else:
        print(f"{doc['principal']} (authentication is off on this broker)")
    return 0
