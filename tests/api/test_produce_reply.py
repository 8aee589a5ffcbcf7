"""A produce's answer built by its append (``records._produce_parsed`` through
``Broker.append_built``) against the general path it replaced (each partition's
``Broker.append``, then ``_produce_reply``): the same answers and the same logs (Hypothesis
differential on two fresh brokers given the same requests)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import records
from cluster.broker import Acks, Broker, BrokerConfig
from core_log.batch import Record
from core_log.errors import LogbusError

TOPIC = "t"
PARTITIONS = 3
T0 = 1_700_000_000_000


@given(
    partition=st.integers(min_value=0, max_value=2**31 - 1),
    offset=st.integers(min_value=0, max_value=2**63 - 1),
)
def test_the_one_record_template_is_what_orjson_writes(partition: int, offset: int) -> None:
    expected = orjson.dumps({"offsets": [{"partition": partition, "offset": offset}]})
    assert records.ONE_OFFSET % (partition, offset) == expected


async def general(
    broker: Broker, partition: int | None, acks: Acks, parsed: list[tuple[int | None, Record]]
) -> records.Reply:
    """``_produce_parsed`` as it was: every partition's append, then the offsets encoded."""
    sticky = broker.sticky.next_partition(PARTITIONS)
    groups, placement = records._route(broker, TOPIC, partition, parsed, sticky)
    limit = broker.log_config(TOPIC).max_message_bytes
    payloads = {p: records.build_batches(rs, limit) for p, rs in groups.items()}
    results = await asyncio.gather(
        *(broker.append(TOPIC, p, data, acks) for p, data in payloads.items())
    )
    base = {p: r.base_offset for p, r in zip(payloads, results, strict=True)}
    offsets = [{"partition": p, "offset": base[p] + j} for p, j in placement]
    size = sum(map(len, payloads.values()))
    return records._produce_reply(acks, offsets, len(parsed), size)


record_st = st.builds(
    Record,
    value=st.one_of(st.none(), st.binary(max_size=30)),
    key=st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"])),
    headers=st.sampled_from([(), (("h", b"v"),)]),  # with headers: the log checks the batch
    timestamp=st.sampled_from([T0, -1]),
)
request_st = st.tuples(
    st.sampled_from([None, 0, 2]),  # the path's partition
    st.sampled_from([Acks.NONE, Acks.LEADER, Acks.ALL]),
    st.lists(st.tuples(st.sampled_from([None, None, 1]), record_st), min_size=1, max_size=4),
)


async def answers(data_dir: Path, requests: list[Any], fast: bool) -> tuple[list[Any], list[bytes]]:
    broker = Broker(BrokerConfig(data_dir=data_dir))
    await broker.start()
    try:
        await broker.create_topic(TOPIC, PARTITIONS)
        out: list[Any] = []
        for partition, acks, parsed in requests:
            # Each call its own copy: the log may stamp what it is given.
            parsed = [(e, Record(r.value, r.key, r.headers, r.timestamp)) for e, r in parsed]
            try:
                if fast:
                    reply = await records._produce_parsed(
                        broker, TOPIC, partition, acks, parsed, PARTITIONS
                    )
                else:
                    reply = await general(broker, partition, acks, parsed)
            except LogbusError as e:
                out.append(("error", e.http_status, str(e)))
                continue
            out.append((reply.status, reply.body, reply.headers, reply.records, reply.size_bytes))
        logs = [(await broker.partition(TOPIC, p).read(0, 1 << 20)).data for p in range(PARTITIONS)]
        return out, logs
    finally:
        await broker.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(requests=st.lists(request_st, min_size=1, max_size=6))
def test_produce_answers_as_the_general_path_does(
    tmp_path_factory: pytest.TempPathFactory, requests: list[Any]
) -> None:
    path = tmp_path_factory.mktemp("produce")
    fast = asyncio.run(answers(path / "fast", requests, True))
    slow = asyncio.run(answers(path / "slow", requests, False))
    assert fast == slow
