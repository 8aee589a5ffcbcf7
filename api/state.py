"""What every route needs, hung on ``app.state.logbus``; FastAPI dependencies for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from cluster.broker import Broker
from cluster.coordinator import Coordinator
from cluster.txn_coordinator import TxnCoordinator
from core_log.errors import LogbusError

from .budgets import Budgets
from .metrics import Metrics
from .proxy import Proxy
from .quota_state import QuotaState
from .security import Security
from .settings import Settings


@dataclass
class AppState:
    settings: Settings
    broker: Broker
    metrics: Metrics
    coordinator: Coordinator
    transactions: TxnCoordinator
    budgets: Budgets
    proxy: Proxy | None = None  # in a cluster: group and admin calls other brokers answer
    quotas: QuotaState = field(default_factory=QuotaState)  # client quotas (api.quota_gate)
    security: Security | None = None  # users, keys, ACLs, quotas' source (api.security)

    def partition_count(self, topic: str) -> int:
        """A topic's partition count as this broker knows it (0: unknown)."""
        try:
            return self.broker.topic(topic).partitions
        except LogbusError:
            return 0


def get_security(request: Request) -> Security:
    security = get_state(request).security
    assert security is not None, "the app's lifespan sets it"
    return security


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.logbus
    return state


def get_broker(request: Request) -> Broker:
    return get_state(request).broker


StateDep = Annotated[AppState, Depends(get_state)]


def get_coordinator(request: Request) -> Coordinator:
    return get_state(request).coordinator


BrokerDep = Annotated[Broker, Depends(get_broker)]
CoordinatorDep = Annotated[Coordinator, Depends(get_coordinator)]
SecurityDep = Annotated[Security, Depends(get_security)]
