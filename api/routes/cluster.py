"""The cluster resource, health probes and metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from ..schemas import BrokerPublic, ClusterPublic
from ..state import BrokerDep, StateDep

router = APIRouter(tags=["cluster"])


@router.get("/v1/cluster", summary="Brokers and the controller")
async def cluster(broker: BrokerDep) -> ClusterPublic:
    rows = await asyncio.to_thread(broker.store.brokers)  # SQL: never on the event loop
    brokers = [
        BrokerPublic(broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack) for b in rows
    ]
    return ClusterPublic(controller=broker.config.broker_id, brokers=brokers)


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: logs recovered and metadata loaded, data directory online",
    responses={503: {"description": "still starting, or the data directory is offline"}},
)
async def readyz(broker: BrokerDep) -> Response:
    if broker.logs.offline:
        return Response(b'{"status":"log_dir_offline"}', 503, media_type="application/json")
    if broker.ready:
        return Response(b'{"status":"ready"}', 200, media_type="application/json")
    return Response(b'{"status":"starting"}', 503, media_type="application/json")


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics(state: StateDep) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")
