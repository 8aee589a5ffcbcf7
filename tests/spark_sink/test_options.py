"""Option parsing: Kafka source names and rules, checked before anything runs."""

from __future__ import annotations

import pytest

from spark_sink.errors import OptionError
from spark_sink.options import (
    parse_duration_ms,
    sink_options,
    source_options,
)

URL = {"url": "http://127.0.0.1:8080"}


def test_defaults_follow_kafka() -> None:
    o = source_options({**URL, "subscribe": "a, b"}, batch=False)
    assert o.subscription.topics == ("a", "b")
    assert o.starting == "latest"
    assert o.fail_on_data_loss is True
    assert o.include_headers is False
    assert o.max_trigger_delay_ms == 15 * 60 * 1000
    assert source_options({**URL, "subscribe": "a"}, batch=True).starting == "earliest"


def test_names_are_case_insensitive_and_json_offsets_parse() -> None:
    o = source_options(
        {
            **URL,
            "SUBSCRIBEPATTERN": "cl.*",
            "startingOffsets": '{"clicks": {"0": 23, "1": -2}}',
            "maxOffsetsPerTrigger": "1000",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
            "failOnDataLoss": "false",
            "includeHeaders": "true",
            "token": "s3cret",
        },
        batch=False,
    )
    assert o.subscription.matches("clicks") and not o.subscription.matches("xclicks")
    assert o.starting == {("clicks", 0): 23, ("clicks", 1): -2}
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger) == (1000, 10)
    assert o.max_trigger_delay_ms == 30_000
    assert not o.fail_on_data_loss and o.include_headers
    assert o.connection.auth_token() == "s3cret"


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"subscribe": "a", "assign": '{"a": [0]}'},
        {"assign": '{"a": "0"}'},
        {"subscribePattern": "("},
        {"subscribe": "a", "maxOffsetsPerTrigger": "0"},
        {"subscribe": "a", "maxOffsetsPerTrigger": "ten"},
        {"subscribe": "a", "failOnDataLoss": "maybe"},
        {"subscribe": "a", "startingOffsets": "middle"},
        {"subscribe": "a", "endingOffsets": "latest"},
        {"subscribe": "a", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "6"},
        {"subscribe": "a", "maxTriggerDelay": "soon"},
    ],
)
def test_bad_stream_options(extra: dict[str, str]) -> None:
    with pytest.raises(OptionError):
        source_options({**URL, **extra}, batch=False)


@pytest.mark.parametrize(
    "extra",
    [
        {"startingOffsets": "latest"},
        {"startingOffsets": '{"a": {"0": -1}}'},
        {"endingOffsets": "earliest"},
        {"endingOffsets": '{"a": {"0": -2}}'},
    ],
)
def test_batch_rules(extra: dict[str, str]) -> None:
    with pytest.raises(OptionError):
        source_options({**URL, "subscribe": "a", **extra}, batch=True)


def test_url_is_required() -> None:
    with pytest.raises(OptionError, match="url"):
        source_options({"subscribe": "a"}, batch=False)
    with pytest.raises(OptionError, match="url"):
        sink_options({"url": "localhost:8080"})


def test_assign_and_sink_options() -> None:
    o = source_options({**URL, "assign": '{"b": [1, 0], "a": [2]}'}, batch=False)
    assert o.subscription.assigned == (("a", 2), ("b", 0), ("b", 1))
    s = sink_options({**URL, "topic": "out", "maxRequestRecords": "10"})
    assert (s.topic, s.max_request_records, s.acks) == ("out", 10, "all")
    assert (s.transactional, s.transaction_timeout_ms) == (True, 900_000)
    s = sink_options({**URL, "kafka.transaction.timeout.ms": "60000"})
    assert s.transaction_timeout_ms == 60_000
    s = sink_options({**URL, "transactional": "false", "acks": "1"})
    assert (s.transactional, s.acks) == (False, "1")
    for bad, message in (
        ({"acks": "1"}, "transactional=false"),
        ({"transaction.timeout.ms": "0"}, "at least 1"),
        ({"transaction.timeout.ms": "1", "kafka.transaction.timeout.ms": "2"}, "differ"),
        ({"transactional": "maybe"}, "true or false"),
    ):
        with pytest.raises(OptionError, match=message):
            sink_options({**URL, **bad})


@pytest.mark.parametrize(
    ("raw", "ms"),
    [
        ("250", 250),
        ("250ms", 250),
        ("30s", 30_000),
        ("15m", 900_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
    ],
)
def test_durations(raw: str, ms: int) -> None:
    assert parse_duration_ms(raw, "maxTriggerDelay") == ms
