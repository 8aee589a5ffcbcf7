"""The cluster resource, health probes and metrics."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Path, Response

from core_log.errors import LogbusError
from core_log.limits import MAX_PARTITIONS_PER_TOPIC

from ..params import PARTITION_MAX, Digits
from ..schemas import BrokerPublic, ClusterPublic, DrainPublic, PartitionHealthPublic
from ..state import AppState, BrokerDep, StateDep
from .common import errors
from .topics import reassignment

router = APIRouter(tags=["cluster"])


@router.get(
    "/v1/cluster",
    summary="Brokers, the controller, partition health and this broker's limits",
)
async def cluster(state: StateDep) -> ClusterPublic:
    broker = state.broker
    view = await broker.cluster_view()
    brokers = [
        BrokerPublic(
            broker_id=b.broker_id,
            host=b.host,
            port=b.port,
            rack=b.rack,
            url=b.base_url,
            alive=b.alive,
            broker_epoch=b.broker_epoch,
        )
        for b in view.brokers
    ]
    return ClusterPublic(
        broker_id=broker.config.broker_id,
        clustered=broker.config.clustered,
        controller=view.controller,
        brokers=brokers,
        partitions=PartitionHealthPublic(**dataclasses.asdict(view.health)),
        limits=limits(state),
    )


@router.post(
    "/v1/cluster/brokers/{broker_id}/drain",
    status_code=202,
    summary="Move every replica off a broker (before removing it)",
    description="Reassigns each partition with a replica on the broker: that replica is "
    "replaced by the live broker holding the fewest replicas (on the same rack where one is "
    "free). The reassignments then run as `PUT …/partitions/{p}/replicas` ones do; the broker "
    "holds nothing once `adding_replicas` is empty everywhere. Any broker forwards the call "
    "to the controller.",
    responses=errors(400, 409, 503),
)
async def drain(
    broker_id: Annotated[int, Path(ge=0, le=PARTITION_MAX, description="broker id"), Digits],
    broker: BrokerDep,
) -> DrainPublic:
    plan = await broker.drain_plan(broker_id)
    started = []
    for (topic, partition), target in sorted(plan.items()):
        try:
            started.append(reassignment(await broker.reassign_partition(topic, partition, target)))
        except LogbusError as e:
            e.detail.setdefault("started", [r.model_dump() for r in started])
            raise
    return DrainPublic(broker_id=broker_id, reassignments=started)


# Settings shown in ``limits`` as they are; max_connections is shown as the cap in force.
_LIMIT_SETTINGS = (
    "max_request_bytes",
    "max_records_per_request",
    "max_fetch_bytes",
    "max_fetch_records",
    "max_wait_ms",
    "max_ws_message_bytes",
    "header_timeout_ms",
    "keep_alive_timeout_ms",
    "body_timeout_ms",
    "send_timeout_ms",
    "max_inflight_body_bytes",
    "max_inflight_response_bytes",
    "max_queued_stream_bytes",
    "max_broker_partitions",
)


def limits(state: AppState) -> dict[str, int]:
    """The caps and timeouts in force, named as the settings."""
    out: dict[str, int] = {
        "max_connections": state.budgets.gate.cap,
        "max_partitions_per_topic": MAX_PARTITIONS_PER_TOPIC,
    }
    for name in _LIMIT_SETTINGS:
        out[name] = int(getattr(state.settings, name))
    return out


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
