"""Producer sessions for idempotent produce: ids and epochs, as Kafka's InitProducerId."""

from __future__ import annotations

from fastapi import APIRouter, Request

from auth_quotas.acl import Operation, Resource, ResourceType

from ..access import require
from ..schemas import ProducerInit, ProducerPublic
from ..state import BrokerDep, StateDep
from .common import errors

router = APIRouter(prefix="/v1/producers", tags=["producers"])


@router.post(
    "",
    status_code=201,
    summary="Start a producer session: a producer id and epoch for idempotent produce",
    responses=errors(400, 409),
)
async def init_producer(
    body: ProducerInit, broker: BrokerDep, request: Request, state: StateDep
) -> ProducerPublic:
    if body.transactional_id is not None:  # Kafka: WRITE on the transactional id
        resource = Resource(ResourceType.TRANSACTIONAL_ID, body.transactional_id)
        require(state.security, request.scope, Operation.WRITE, resource)
        # The transaction coordinator owns a transactional id's producer id and epoch.
        pid, epoch = await state.transactions.init_producer(body.transactional_id)
        return ProducerPublic(producer_id=pid, producer_epoch=epoch)
    pid, epoch = await broker.init_producer(None)
    return ProducerPublic(producer_id=pid, producer_epoch=epoch)
