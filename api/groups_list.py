"""``GET /v1/groups`` in a cluster: every group, whichever broker is asked.

Theory of operation
-------------------
A group's state lives only on its coordinator (the leader of its ``__consumer_offsets``
partition), so no broker can list every group alone. As Kafka's admin client does for
ListGroups, the broker asked lists its own groups and asks every other broker that leads an
offsets partition for *its* list — concurrently, one call each with ``LIST_TIMEOUT_S`` — then
merges. The internal call carries ``Logbus-Route: direct`` and ``Logbus-Forwarded-By``, so
the broker asked answers from itself and never fans out again (a client may send
``Logbus-Route: direct`` too: it gets that one broker's list).

Each list names the offsets partitions it covers (``offsets_partitions``: those loaded on that
broker). A partition nobody covered — no leader, a leader whose lease expired, one that did
not answer in time or could not be reached, or one still loading it — is reported in
``unavailable`` with the broker it was asked of and a retriable code; its groups are missing
from ``groups``. The answer is 200 either way: a partial list that says what it lacks is more
use to an operator than a 5xx while one coordinator moves (a failover takes about
``broker_session_timeout_ms``).

Bounds: one call per coordinator (at most one per offsets partition, 50 by Kafka's default),
each answer at most ``limit`` groups (``MAX_GROUPS_LISTED``); the whole listing takes at most
``LIST_TIMEOUT_S`` plus this broker's own describe work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from cluster.broker import OFFSETS_TOPIC
from cluster.coordinator import Coordinator
from core_log.errors import ErrorCode, LogbusError

from .group_schemas import GroupList, GroupSummary, UnlistedPartitions
from .state import AppState

LIST_TIMEOUT_S = 5.0  # per coordinator asked; a healthy one answers in milliseconds
NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE.name
LOADING = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS.name


@dataclass
class Answer:
    """One broker's part of the list: what it covered, or why it could not say."""

    broker_id: int | None
    partitions: list[int] = field(default_factory=list)  # the partitions it was asked about
    doc: dict[str, Any] | None = None  # its GroupList, when it answered
    code: str = NOT_AVAILABLE
    detail: str = ""


def local_list(coordinator: Coordinator, limit: int) -> GroupList:
    """The groups this broker coordinates (and the offsets partitions it is still loading)."""
    out = []
    for group_id in coordinator.group_ids()[:limit]:
        d = coordinator.describe(group_id)
        out.append(
            GroupSummary(group=group_id, state=d["state"], members=len(d["members"]), lag=d["lag"])
        )
    listed, loading = coordinator.listed_partitions()
    me = coordinator.broker.config.broker_id
    gaps = []
    if loading:
        gaps.append(
            UnlistedPartitions(
                partitions=loading,
                broker_id=me,
                code=LOADING,
                detail=f"broker {me} is loading these partitions; try again",
            )
        )
    return GroupList(groups=out, offsets_partitions=listed, unavailable=gaps)


async def cluster_list(
    state: AppState, limit: int, scope: Mapping[str, Any] | None = None
) -> GroupList:
    """Every group of the cluster: this broker's own and every other coordinator's."""
    broker, proxy = state.broker, state.proxy
    replicas = broker.replicas
    if replicas is None or proxy is None:
        return local_list(state.coordinator, limit)
    try:
        n = broker.topic(OFFSETS_TOPIC).partitions
    except LogbusError:  # no offsets topic yet: no group exists
        n = 0
    me = broker.config.broker_id
    by_leader: dict[int, list[int]] = {}
    for p in range(n):
        by_leader.setdefault(replicas.leader_id(OFFSETS_TOPIC, p), []).append(p)

    async def ask(broker_id: int, partitions: list[int]) -> Answer:
        if broker_id == me:
            return Answer(me, partitions, local_list(state.coordinator, limit).model_dump())
        meta = replicas.brokers.get(broker_id)
        if broker_id < 0 or meta is None:
            return Answer(None, partitions, detail="no leader now; one is being elected")
        if not meta.alive:
            return Answer(
                broker_id,
                partitions,
                detail=f"broker {broker_id}'s lease expired; a new coordinator is being elected",
            )
        try:
            r = await proxy.ask(
                meta.base_url, "/v1/groups", {"limit": str(limit)}, LIST_TIMEOUT_S, scope
            )
        except httpx.TimeoutException:
            why = f"did not answer within {LIST_TIMEOUT_S:.0f} s"
            return Answer(broker_id, partitions, detail=f"broker {broker_id} {why}")
        except httpx.HTTPError as e:
            why = f"at {meta.base_url} could not be reached: {e or type(e).__name__}"
            return Answer(broker_id, partitions, detail=f"broker {broker_id} {why}")
        if r.status_code != 200:
            return Answer(broker_id, partitions, detail=f"broker {broker_id} answered {r.text}")
        try:
            doc = r.json()
            GroupList.model_validate(doc)
        except ValueError:
            return Answer(broker_id, partitions, detail=f"broker {broker_id}: unreadable list")
        return Answer(broker_id, partitions, doc)

    answers = await asyncio.gather(*(ask(b, ps) for b, ps in sorted(by_leader.items())))
    return merge(n, answers, limit)


def merge(partitions: int, answers: list[Answer], limit: int) -> GroupList:
    """One list from every broker's answer (sans-I/O). A partition is covered when some
    answer lists it; every other partition is unavailable, named with the broker it was
    asked of and why (that broker's own reason when it gave one, e.g. still loading)."""
    groups: dict[str, GroupSummary] = {}
    covered: set[int] = set()
    gaps: list[UnlistedPartitions] = []
    for a in answers:
        if a.doc is None:
            continue
        part = GroupList.model_validate(a.doc)
        covered.update(p for p in part.offsets_partitions if 0 <= p < partitions)
        for g in part.groups:
            groups.setdefault(g.group, g)
        gaps.extend(part.unavailable)
    told = {p for gap in gaps for p in gap.partitions}
    out = [
        UnlistedPartitions(
            partitions=sorted(p for p in gap.partitions if p not in covered),
            broker_id=gap.broker_id,
            code=gap.code,
            detail=gap.detail,
        )
        for gap in gaps
    ]
    for a in answers:
        missing = sorted(p for p in a.partitions if p not in covered and p not in told)
        if missing:
            detail = a.detail or (
                f"broker {a.broker_id} does not coordinate them now (leadership is moving)"
            )
            out.append(
                UnlistedPartitions(
                    partitions=missing, broker_id=a.broker_id, code=a.code, detail=detail
                )
            )
    out = [gap for gap in out if gap.partitions]
    out.sort(key=lambda gap: gap.partitions[0])
    listed = sorted(groups.values(), key=lambda g: g.group)[:limit]
    return GroupList(groups=listed, offsets_partitions=sorted(covered), unavailable=out)
