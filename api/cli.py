"""The ``logbus`` command: run a broker, or talk to one over HTTP."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .settings import Settings


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (tests parse docker-compose.yml's commands with it)."""
    from . import client_cli, cluster_cli

    parser = argparse.ArgumentParser(prog="logbus", description="Logbus event streaming")
    # Client options may also come before the command: `logbus --url URL topics list`.
    client_cli.add_connection_options(parser, dest_prefix="global_")
    parser.add_argument(
        "--json", dest="global_json", action="store_true", help="print JSON instead of tables"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a broker")
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--broker-id", type=int)
    serve.add_argument(
        "--metadata-url",
        help="SQLAlchemy URL of the cluster's metadata store: sqlite:///path.db (brokers on one "
        "host) or postgresql+psycopg://user@host/db; default: SQLite in the data dir, one broker",
    )
    serve.add_argument("--rack", help="rack (or zone) name: replicas spread across racks")
    serve.add_argument(
        "--advertised-url", help="the URL clients and brokers use to reach this broker"
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding a non-loopback address without authentication",
    )
    serve.add_argument(
        "--auth",
        action="store_true",
        help="require credentials (API keys, Basic, JWT, scoped tokens) and enforce ACLs",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        help="a Host name (name or name:port) clients may use besides the bound ones; repeat",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        dest="allowed_origins",
        help="a web page origin (https://app.example) allowed cross-origin, with CORS; repeat",
    )
    serve.add_argument("--ssl-certfile", type=Path, help="serve TLS: PEM certificate (chain)")
    serve.add_argument("--ssl-keyfile", type=Path, help="the certificate's PEM private key")
    serve.add_argument(
        "--ssl-cafile", type=Path, help="CA bundle that client certificates must chain to"
    )
    serve.add_argument(
        "--ssl-client-auth",
        choices=("none", "requested", "required"),
        help="ask clients for a certificate (mTLS); its subject is the principal (default none)",
    )
    serve.add_argument(
        "--ssl-principal-mapping",
        choices=("dn", "cn"),
        help="a client certificate's principal: its full subject DN (default) or its CN",
    )
    serve.add_argument("--no-fast-path", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)

    metadata = sub.add_parser("metadata", help="the metadata store's schema")
    msub = metadata.add_subparsers(dest="metadata_command", required=True)
    upgrade = msub.add_parser(
        "upgrade", help="create or migrate the schema (brokers also do it at start)"
    )
    upgrade.add_argument("--metadata-url", help="SQLAlchemy URL (default: SQLite in the data dir)")
    upgrade.add_argument("--data-dir", type=Path)
    upgrade.set_defaults(func=_metadata_upgrade)

    cluster_cli.add_commands(sub)
    client_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from . import client_cli

    parser = build_parser()
    args = parser.parse_args(argv)
    if (error := client_cli.apply_global_options(args)) is not None:
        parser.error(error)
    result: int = args.func(args)
    return result


def _serve(args: argparse.Namespace) -> int:
    from .server import serve

    overrides = {
        k: v
        for k, v in {
            "data_dir": args.data_dir,
            "host": args.host,
            "port": args.port,
            "broker_id": args.broker_id,
            "metadata_url": args.metadata_url,
            "rack": args.rack,
            "advertised_url": args.advertised_url,
            "insecure": args.insecure or None,
            "auth": args.auth or None,
            "fast_path": False if args.no_fast_path else None,
            "allowed_hosts": args.allowed_hosts,
            "allowed_origins": args.allowed_origins,
            "ssl_certfile": args.ssl_certfile,
            "ssl_keyfile": args.ssl_keyfile,
            "ssl_cafile": args.ssl_cafile,
            "ssl_client_auth": args.ssl_client_auth,
            "ssl_principal_mapping": args.ssl_principal_mapping,
        }.items()
        if v is not None
    }
    from pydantic import ValidationError

    try:
        settings = Settings(**overrides)
    except ValidationError as e:
        for error in e.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            print(f"invalid setting {where}: {message}" if where else message, file=sys.stderr)
        return 2
    return serve(settings)


def _metadata_upgrade(args: argparse.Namespace) -> int:
    from cluster import migrate

    settings = Settings(**{k: v for k, v in {"data_dir": args.data_dir}.items() if v is not None})
    url = args.metadata_url or settings.metadata_url
    if url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{settings.data_dir / 'metadata.db'}"
    before, after = migrate.upgrade_url(url)
    print(f"metadata schema at revision {after} (was {before or 'empty'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
