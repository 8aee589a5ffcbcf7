"""Partition.append_built (a one-record produce's append, answered by the run that writes it)
against Partition.append with the same checked headers: the same offsets, answers, errors
and log contents (Hypothesis differential)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_log.batch import (
    BatchHeader,
    Record,
    any_producer_id,
    build_batch,
    build_plain,
    built_headers,
    largest_batch,
)
from core_log.config import LogConfig
from core_log.errors import KafkaStorageError
from core_log.log import PartitionLog
from core_log.manager import LogManager, Partition
from tests.core_log.test_manager import T0, make_manager, read_values, run


def built(values: list[bytes]) -> tuple[bytes, list[BatchHeader]]:
    """A batch as the broker builds one for a produce, with its checked headers."""
    records = [Record(v, timestamp=T0) for v in values]
    if len(records) == 1:
        plain = build_plain(records)
        if plain is not None:
            return plain[0], [plain[1]]
    data = build_batch(records)
    headers = built_headers(data, records)
    assert headers is not None
    return data, headers


async def opened(path: Path, config: LogConfig | None = None) -> tuple[LogManager, Partition]:
    m = make_manager(path) if config is None else make_manager(path, config_for=lambda _t: config)
    await m.start(background=False)
    return m, await m.create("t", 0)


async def both_ways(
    path: Path, requests: list[tuple[list[bytes], bool]], config: LogConfig | None
) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """The requests (values, durable) appended concurrently, in one turn, to one partition by
    ``append`` and to another by ``append_built``: each side's answers and log contents."""
    answers: list[list[Any]] = []
    contents: list[list[Any]] = []
    for fast in (False, True):
        m, p = await opened(path / str(fast), config)
        calls: list[Any] = []
        for values, durable in requests:
            data, checked = built(values)
            if fast:
                calls.append(p.append_built(data, checked, lambda first: first, durable=durable))
            else:
                calls.append(_base_offset(p.append(data, durable=durable, checked=checked)))
        answers.append(list(await asyncio.gather(*calls)))
        contents.append([await read_values(p), p.high_watermark, p.log_end_offset])
        await m.close()
    return answers[0], answers[1], contents[0], contents[1]


async def _base_offset(append: Any) -> int:
    return int((await append).base_offset)


requests_st = st.lists(
    st.tuples(st.lists(st.binary(max_size=40), min_size=1, max_size=4), st.booleans()),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(requests=requests_st, append_time=st.booleans())
def test_append_built_answers_as_append_does(
    tmp_path_factory: pytest.TempPathFactory,
    requests: list[tuple[list[bytes], bool]],
    append_time: bool,
) -> None:
    """Gathered (the default config) or not (LogAppendTime: each its own append, through
    ``answered_by``): the same first offsets, records and high watermark."""
    config = LogConfig(timestamp_type="LogAppendTime") if append_time else None
    path = tmp_path_factory.mktemp("built")
    slow, fast, slow_log, fast_log = run(lambda: both_ways(path, requests, config))
    assert fast == slow
    if not append_time:  # LogAppendTime stamps each batch with the time it is stored
        assert fast_log == slow_log
    assert fast_log[1] == fast_log[2] == sum(len(v) for v, _ in requests)


def test_an_answer_that_raises_fails_its_request_alone(tmp_path: Path) -> None:
    async def main() -> None:
        m, p = await opened(tmp_path)
        data, checked = built([b"a"])

        def broken(first: int) -> int:
            raise ValueError(first)

        good = p.append_built(data, checked, lambda first: first)
        bad = p.append_built(data, checked, broken)
        after = p.append_built(data, checked, lambda first: first)
        assert await good == 0
        with pytest.raises(ValueError, match="1"):
            await bad
        assert await after == 2
        assert [v for _, v in await read_values(p)] == [b"a"] * 3
        await m.close()

    run(main)


def test_an_offline_directory_refuses_before_anything_is_gathered(tmp_path: Path) -> None:
    async def main() -> None:
        m, p = await opened(tmp_path)
        p.log_dir.failed(OSError(5, "EIO"))
        data, checked = built([b"a"])
        with pytest.raises(KafkaStorageError):
            p.append_built(data, checked, lambda first: first)
        assert p.log_end_offset == 0
        await m.close()

    run(main)


def test_a_cancelled_request_is_not_appended(tmp_path: Path) -> None:
    async def main() -> None:
        m, p = await opened(tmp_path)
        data, checked = built([b"a"])
        gone = asyncio.ensure_future(p.append_built(data, checked, lambda first: first))
        kept = p.append_built(data, checked, lambda first: first)
        gone.cancel()
        assert await kept == 0
        assert gone.cancelled()
        assert p.log_end_offset == 1
        await m.close()

    run(main)


@given(
    producer_id=st.sampled_from([-1, 0, 7]),
    length=st.integers(min_value=49, max_value=300),
    limit=st.integers(min_value=1, max_value=320),
)
def test_gatherable_reads_one_header_as_the_sums_do(
    producer_id: int, length: int, limit: int
) -> None:
    """``PartitionLog.gatherable``'s one-header path against the general one (two headers)."""
    _, [h] = built([b"x"])
    h = h._replace(producer_id=producer_id, batch_length=length)
    log = SimpleNamespace(
        config=LogConfig(max_message_bytes=limit), _target_compression=lambda: None
    )
    general = not any_producer_id([h]) and largest_batch([h]) <= limit
    assert PartitionLog.gatherable(log, [h]) == general  # type: ignore[arg-type]
    assert PartitionLog.gatherable(log, [h, h]) == general  # type: ignore[arg-type]
