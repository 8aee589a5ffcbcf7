"""The ASGI application: FastAPI for admin, the lean fast path for records, offline docs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline

from cluster.broker import Broker, BrokerConfig
from cluster.coordinator import Coordinator

from . import errors
from .fastpath import FastPath
from .metrics import Metrics
from .problems import PROBLEM_JSON
from .routes import cluster, groups, producers, records, topics, ws
from .routes.common import errors as errors_doc
from .schemas import FetchResponse, Problem
from .settings import Settings
from .state import AppState

DESCRIPTION = """\
Kafka semantics over HTTP: topics of partitioned, retained commit logs addressed by offsets.

* Produce JSON, NDJSON or Kafka record batches; fetch JSON, NDJSON or raw batches, with
  long-poll (`min_bytes`, `wait_ms`).
* Errors are `application/problem+json` with a stable Kafka-style `code` and `retriable`.
"""


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
        idempotency_window_ms=settings.idempotency_window_ms,
        max_broker_partitions=settings.max_broker_partitions,
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
    app.include_router(groups.router)
    app.include_router(ws.router)
    app.include_router(cluster.router)
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
    components = schema.get("components", {}).get("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    for model in (Problem, FetchResponse):  # referenced by hand in the record routes
        doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(doc.pop("$defs", {}))
        components[model.__name__] = doc
    app.openapi_schema = schema
    return schema


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    broker = Broker(broker_config(settings))
    await broker.start()
    coordinator = Coordinator(
        broker,
        offsets_partitions=settings.offsets_topic_partitions,
        offsets_retention_ms=settings.offsets_retention_ms,
    )
    await coordinator.start()
    state = AppState(
        settings=settings,
        broker=broker,
        metrics=Metrics(broker, coordinator),
        coordinator=coordinator,
    )
    app.state.logbus = state
    fast: FastPath | None = getattr(app.state, "fast_path", None)
    if fast is not None:
        fast.state = state
    try:
        yield
    finally:
        if fast is not None:
            fast.state = None
        await coordinator.close()
        await broker.close()


def create_app(settings: Settings | None = None) -> FastPath:
    """The whole ASGI app: :class:`FastPath` in front of the FastAPI app."""
    settings = settings or Settings()
    app = create_fastapi(settings)
    fast = FastPath(app)
    app.state.fast_path = fast
    return fast
