"""The ASGI application: FastAPI for admin, the lean fast path for records, offline docs."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline

from cluster.broker import Broker, BrokerConfig
from cluster.coordinator import Coordinator
from cluster.replica_manager import FORWARD_HEADER_BYTES, ReplicationConfig
from cluster.txn_coordinator import TxnCoordinator
from cluster.txn_state import TxnConfig
from core_log.datadir import DataDirLock

from . import access, errors
from .budgets import Budgets
from .fastpath import FastPath
from .guard import BrowserPolicy
from .loop_lag import LoopLagProbe
from .metrics import Metrics
from .params import NAME_PATTERN, UINT_PATTERN
from .problems import PROBLEM_JSON
from .proxy import Proxy
from .quota_state import QuotaState, quota_config
from .routes import (
    cluster,
    groups,
    producers,
    quotas,
    records,
    security,
    topics,
    transactions,
    ws,
)
from .routes.common import errors as errors_doc
from .schemas import FetchResponse, Problem
from .security import Security
from .settings import Settings
from .state import AppState

DESCRIPTION = """\
Kafka semantics over HTTP: topics of partitioned, retained commit logs addressed by offsets.

* Produce JSON, NDJSON or Kafka record batches; fetch JSON, NDJSON or raw batches, with
  long-poll (`min_bytes`, `wait_ms`).
* Errors are `application/problem+json` with a stable Kafka-style `code` and `retriable`.
"""


def peer_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """How this broker reaches its peers' client listeners when they serve TLS: trusting
    ``ssl_cafile`` (the cluster's CA, else the system's) and presenting its own certificate,
    which a peer requiring client certificates verifies (the forwarded request itself is
    authenticated by the cluster credential)."""
    if settings.ssl_certfile is None:
        return None
    context = ssl.create_default_context(cafile=settings.ssl_cafile)
    context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    return context


def broker_config(settings: Settings) -> BrokerConfig:
    return BrokerConfig(
        data_dir=settings.data_dir,
        broker_id=settings.broker_id,
        host=settings.host,
        port=settings.port,
        rack=settings.rack,
        metadata_url=settings.metadata_url,
        max_open_handles=settings.max_open_handles,
        retention_check_interval_ms=settings.retention_check_interval_ms,
        log_cleaner_backoff_ms=settings.log_cleaner_backoff_ms,
        idempotency_window_ms=settings.idempotency_window_ms,
        max_broker_partitions=settings.max_broker_partitions,
        advertised_url=settings.advertised_url
        or (f"https://{settings.host}:{settings.port}" if settings.tls else None),
        replication_port=settings.replication_port,
        replication_advertised_port=settings.replication_advertised_port,
        replication=ReplicationConfig(
            broker_id=settings.broker_id,
            heartbeat_interval_ms=settings.broker_heartbeat_interval_ms,
            session_timeout_ms=settings.broker_session_timeout_ms,
            replica_lag_time_max_ms=settings.replica_lag_time_max_ms,
            fetch_wait_max_ms=settings.replica_fetch_wait_max_ms,
            fetch_max_bytes=settings.replica_fetch_max_bytes,
            fetch_response_max_bytes=settings.replica_fetch_response_max_bytes,
            socket_timeout_ms=settings.replica_socket_timeout_ms,
            metadata_refresh_interval_ms=settings.metadata_refresh_interval_ms,
            request_timeout_ms=settings.request_timeout_ms,
            # A forwarded produce: one partition's share of a request, and a small header.
            forward_max_bytes=settings.max_request_bytes + FORWARD_HEADER_BYTES,
        ),
        default_replication_factor=settings.default_replication_factor,
        auto_leader_rebalance_enable=settings.auto_leader_rebalance_enable,
        leader_imbalance_check_interval_ms=settings.leader_imbalance_check_interval_seconds * 1000,
    )


def create_fastapi(settings: Settings) -> FastAPI:
    """The FastAPI app alone (also used to render the OpenAPI document without a broker)."""
    app = FastAPIOffline(
        title="Logbus",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    errors.install(app)
    app.include_router(topics.router)
    app.include_router(records.router)
    app.include_router(producers.router)
    app.include_router(transactions.router)
    app.include_router(groups.router)
    app.include_router(ws.router)
    app.include_router(cluster.router)
    app.include_router(quotas.router)
    app.include_router(security.router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, corrected: validation errors are 400 problem+json here, not 422."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    bad_request = errors_doc(400)[400]
    bad_request["content"] = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for ops in schema["paths"].values():
        for op in ops.values():
            responses = op.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault("400", {k: v for k, v in bad_request.items() if k != "model"})
    _document_names(schema)
    _document_limits(schema, app.state.settings)
    _document_route(schema)
    _document_security(schema)
    components = schema.get("components", {}).get("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    for model in (Problem, FetchResponse):  # referenced by hand in the record routes
        doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(doc.pop("$defs", {}))
        components[model.__name__] = doc
    _exact_int_bounds(schema)
    app.openapi_schema = schema
    return schema


# Every call about a partition or a group may be routed by the client (api.fastpath, api.proxy).
_ROUTE_HEADER = {
    "name": "Logbus-Route",
    "in": "header",
    "required": False,
    "description": "In a cluster: `forward` (default) lets this broker pass the call to the "
    "partition's leader, the group's coordinator or the controller; `direct` answers here, "
    "421 NOT_LEADER_OR_FOLLOWER (naming the leader) where this broker does not lead.",
    "schema": {"type": "string", "enum": ["forward", "direct"], "default": "forward"},
}


def _document_route(schema: dict[str, Any]) -> None:
    for path, ops in schema["paths"].items():
        if not path.startswith(("/v1/topics/{topic}", "/v1/groups/{group}", "/v1/ws")):
            continue
        for op in ops.values():
            op.setdefault("parameters", []).append(dict(_ROUTE_HEADER))
            op.setdefault("responses", {}).setdefault(
                "421",
                {
                    "description": "Logbus-Route: direct and this broker does not lead the "
                    "partition (or coordinate the group): the body names the one that does",
                    "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                },
            )


def _document_security(schema: dict[str, Any]) -> None:
    """Bearer (API key, scoped token, JWT) and Basic (user + API key) for every route that
    is not public (api.access.TABLE), so the docs UI's Authorize button fills them in."""
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (lbk.…), a scoped token (lbt.…) or a JWT",
        },
        "basic": {
            "type": "http",
            "scheme": "basic",
            "description": "User name and API key, for tools that speak only Basic",
        },
    }
    unauthorized = errors_doc(401)[401]
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            rule, _ = access.match(method.upper(), path)
            if rule.kind is access.Kind.PUBLIC:
                op["security"] = []
                continue
            op["security"] = [{"bearer": []}, {"basic": []}]
            op.setdefault("responses", {}).setdefault(
                "401", {k: v for k, v in unauthorized.items() if k != "model"}
            )


# What the broker enforces on names in paths, put in the document (see api.params.NameStr).
_NAMED_PARAMS = {"topic": NAME_PATTERN, "group": NAME_PATTERN, "transactional_id": NAME_PATTERN}


def _document_names(schema: dict[str, Any]) -> None:
    for ops in schema["paths"].values():
        for op in ops.values():
            for param in op.get("parameters", []):
                pattern = _NAMED_PARAMS.get(param["name"])
                if param["in"] == "path" and pattern is not None:
                    param["schema"].update(pattern=pattern, minLength=1, maxLength=249)


def _document_limits(schema: dict[str, Any], settings: Settings) -> None:
    """The bounds this broker's settings put on fetch and poll parameters; a fetch needs an
    offset (an SSE stream may give it as Last-Event-ID instead)."""
    maxima = {
        "max_bytes": settings.max_fetch_bytes,
        "min_bytes": settings.max_fetch_bytes,
        "max_records": settings.max_fetch_records,
        "wait_ms": settings.max_wait_ms,
    }
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            for param in op.get("parameters", []):
                _drop_null(param)
                if param["in"] == "header" and param["name"] in _HEADER_PATTERNS:
                    param["schema"]["pattern"] = _HEADER_PATTERNS[param["name"]]
                high = maxima.get(param["name"])
                if param["in"] == "query" and high is not None:
                    for alt in param["schema"].get("anyOf", [param["schema"]]):
                        if alt.get("type") == "integer":
                            alt["maximum"] = high
                if path.endswith("/records") and method == "get" and param["name"] == "offset":
                    param["required"] = True


def _exact_int_bounds(node: Any) -> None:
    """Integer bounds as integers: pydantic writes ``le=2**63 - 1`` as the double
    9.223372036854776e18, which is 2^63, so a validator took 2^63+191 for a valid offset."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in ("minimum", "maximum"):
                value = node.get(key)
                if isinstance(value, float):
                    node[key] = 2**63 - 1 if value >= 2.0**63 else int(value)
        for value in node.values():
            _exact_int_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _exact_int_bounds(value)


_HEADER_PATTERNS = {
    "Logbus-Producer-Id": UINT_PATTERN,
    "Logbus-Producer-Epoch": UINT_PATTERN,
    "Logbus-Sequence": UINT_PATTERN,
    "Idempotency-Key": "^[\\x21-\\x7e]{1,255}$",
}


def _drop_null(param: dict[str, Any]) -> None:
    """An optional parameter is absent, never the text "null": no null alternative."""
    alternatives = param["schema"].get("anyOf")
    if param["in"] in ("query", "header") and alternatives:
        kept = [a for a in alternatives if a.get("type") != "null"]
        if len(kept) == 1:
            del param["schema"]["anyOf"]
            param["schema"].update(kept[0])


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    budgets: Budgets = getattr(app.state, "budgets", None) or Budgets.from_settings(settings)
    hasher = getattr(app.state, "hasher_factory", None)  # tests pass a cheap argon2 cost
    guard = Security(settings, **({"hasher_factory": hasher} if hasher else {}))
    quotas = QuotaState(
        quota_config(
            settings.quota_window_num,
            settings.quota_window_size_seconds,
            settings.quota_max_throttle_ms,
        ),
        max_sensors=settings.quota_max_sensors,
    )
    # Quotas come from the same snapshots as users and ACLs (one watcher: in force here
    # within ~0.3 s of a change anywhere).
    guard.snapshot_listeners.append(quotas.apply_snapshot)
    broker = Broker(
        broker_config(settings),
        dir_lock=getattr(app.state, "dir_lock", None),
        credential=guard.credential,
    )
    await broker.start()
    assert broker.metadata is not None
    try:
        await guard.start(broker.metadata.security)
    except BaseException:
        await broker.close()
        raise
    coordinator = Coordinator(
        broker,
        offsets_partitions=settings.offsets_topic_partitions,
        offsets_retention_ms=settings.offsets_retention_ms,
    )
    await coordinator.start()
    transactions = TxnCoordinator(
        broker,
        coordinator,
        partitions=settings.transaction_state_log_num_partitions,
        config=TxnConfig(
            transaction_max_timeout_ms=settings.transaction_max_timeout_ms,
            transactional_id_expiration_ms=settings.transactional_id_expiration_ms,
        ),
        abort_interval_ms=settings.transaction_abort_timed_out_transaction_cleanup_interval_ms,
    )
    await transactions.start()
    state = AppState(
        settings=settings,
        broker=broker,
        metrics=Metrics(broker, coordinator, budgets, quotas),
        coordinator=coordinator,
        transactions=transactions,
        budgets=budgets,
        proxy=(
            Proxy(broker, settings.max_wait_ms, guard, peer_tls_context(settings))
            if broker.config.clustered
            else None
        ),
        quotas=quotas,
        security=guard,
    )
    state.metrics.watch_security(guard)
    app.state.logbus = state
    probe = LoopLagProbe(state.metrics.loop_lag, settings.loop_lag_interval_ms / 1000)
    if settings.loop_lag_interval_ms > 0:
        probe.start()
    fast: FastPath | None = getattr(app.state, "fast_path", None)
    if fast is not None:
        fast.state = state
        fast.access.security = guard
    try:
        yield
    finally:
        if fast is not None:
            fast.state = None
        probe.stop()
        if state.proxy is not None:
            await state.proxy.close()
        await transactions.close()
        await coordinator.close()
        await guard.stop()
        await broker.close()


def create_app(
    settings: Settings | None = None,
    dir_lock: DataDirLock | None = None,
    budgets: Budgets | None = None,
) -> FastPath:
    """The whole ASGI app: :class:`FastPath` in front of the FastAPI app. ``dir_lock``: the
    data directory's lock, when the caller took it already (see :func:`api.server.serve`);
    ``budgets``: the connection and byte budgets shared with the server's protocols."""
    settings = settings or Settings()
    budgets = budgets or Budgets.from_settings(settings)
    app = create_fastapi(settings)
    app.state.dir_lock = dir_lock
    app.state.budgets = budgets
    policy = BrowserPolicy(
        settings.host, settings.port, settings.allowed_hosts, settings.allowed_origins
    )
    fast = FastPath(app, settings, budgets, policy)
    app.state.fast_path = fast
    return fast
