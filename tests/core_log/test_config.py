"""Tests for core_log.config: LogConfig.from_dict parsing/validation and the dict round trips."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_log.config import (
    CLEANUP_POLICIES,
    COMPRESSION_TYPES,
    DURABILITY_MODES,
    KEYS_BY_NAME,
    LONG_MAX,
    TIMESTAMP_TYPES,
    LogConfig,
)
from core_log.errors import ErrorCode, InvalidConfigError
from core_log.limits import MAX_BATCH_BYTES, MAX_SEGMENT_BYTES, MIN_MESSAGE_BYTES

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)

# Kafka's name -> (attribute, kind, default, low, high); written out here independently of the
# module's own table so a typo in either is caught.
INT_KEYS: dict[str, tuple[str, int, int, int]] = {
    "delete.retention.ms": ("delete_retention_ms", 86_400_000, 0, LONG_MAX),
    "flush.messages": ("flush_messages", LONG_MAX, 1, LONG_MAX),
    "flush.ms": ("flush_ms", 1000, 0, LONG_MAX),
    "index.interval.bytes": ("index_interval_bytes", 4096, 0, 2**31 - 1),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", LONG_MAX, 1, LONG_MAX),
    "max.message.bytes": ("max_message_bytes", 1_048_588, MIN_MESSAGE_BYTES, MAX_BATCH_BYTES),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", 0, 0, LONG_MAX),
    "min.insync.replicas": ("min_insync_replicas", 1, 1, 2**31 - 1),
    "retention.bytes": ("retention_bytes", -1, -1, LONG_MAX),
    "retention.ms": ("retention_ms", 604_800_000, -1, LONG_MAX),
    "segment.bytes": ("segment_bytes", 1_073_741_824, 14, MAX_SEGMENT_BYTES),
    "segment.index.bytes": ("segment_index_bytes", 10_485_760, 8, 2**31 - 1),
    "segment.ms": ("segment_ms", 604_800_000, 1, LONG_MAX),
}
STR_KEYS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "cleanup.policy": ("cleanup_policy", "delete", CLEANUP_POLICIES),
    "compression.type": ("compression_type", "producer", COMPRESSION_TYPES),
    "durability": ("durability", "replicated", DURABILITY_MODES),
    "message.timestamp.type": ("timestamp_type", "CreateTime", TIMESTAMP_TYPES),
}
ALL_KEYS = {*INT_KEYS, *STR_KEYS, "min.cleanable.dirty.ratio", "unclean.leader.election.enable"}


def assert_invalid(values: dict[str, Any], key: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_dict(values)
    err = info.value
    assert err.detail["config"] == key
    assert key in str(err)
    assert err.code is ErrorCode.INVALID_CONFIG


def test_every_kafka_key_is_known_with_kafka_defaults() -> None:
    assert set(KEYS_BY_NAME) == ALL_KEYS
    default = LogConfig()
    d = default.to_dict()
    assert set(d) == ALL_KEYS
    for name, (attr, dflt, _, _) in INT_KEYS.items():
        assert getattr(default, attr) == dflt == d[name]
    for name, (attr, choice, _) in STR_KEYS.items():
        assert getattr(default, attr) == choice == d[name]
    assert d["min.cleanable.dirty.ratio"] == 0.5
    assert d["unclean.leader.election.enable"] is False
    assert LogConfig.from_dict({}) == default
    assert default.overrides() == {}


@SETTINGS
@given(data=st.data())
def test_int_keys_accept_ints_and_decimal_strings_in_range(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(INT_KEYS)))
    attr, _, low, high = INT_KEYS[name]
    value = data.draw(st.integers(low, high) | st.sampled_from([low, high]))
    as_string = data.draw(st.booleans())
    raw: Any = str(value) if as_string else value
    cfg = LogConfig.from_dict({name: raw})
    assert getattr(cfg, attr) == value
    assert type(getattr(cfg, attr)) is int


@SETTINGS
@given(data=st.data())
def test_int_keys_reject_out_of_range_values_naming_the_key(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(INT_KEYS)))
    _, _, low, high = INT_KEYS[name]
    value = data.draw(
        st.integers(max_value=low - 1) | st.integers(min_value=high + 1) | st.just(low - 1)
    )
    raw: Any = str(value) if data.draw(st.booleans()) else value
    assert_invalid({name: raw}, name)


@pytest.mark.parametrize("name", sorted(INT_KEYS))
@pytest.mark.parametrize(
    "raw", ["", "abc", "12abc", "1.5", "0x10", None, [], {}, True, False, 1.5, float("nan")]
)
def test_int_keys_reject_non_integers(name: str, raw: Any) -> None:
    assert_invalid({name: raw}, name)


def test_whole_floats_are_accepted_for_int_keys() -> None:
    assert LogConfig.from_dict({"segment.bytes": 1024.0}).segment_bytes == 1024


@pytest.mark.parametrize("raw", [float("inf"), float("-inf")])
def test_infinite_floats_are_an_invalid_config_not_a_crash(raw: float) -> None:
    # Python's json module (used for request bodies by Starlette) accepts Infinity.
    values = json.loads('{"segment.ms": %s}' % ("Infinity" if raw > 0 else "-Infinity"))
    assert values["segment.ms"] == raw
    assert_invalid(values, "segment.ms")


@pytest.mark.parametrize("name", sorted(STR_KEYS))
def test_string_keys_accept_exactly_their_choices(name: str) -> None:
    attr, _, choices = STR_KEYS[name]
    for choice in choices:
        assert getattr(LogConfig.from_dict({name: choice}), attr) == choice
    for bad in ["", "bogus", choices[0] + "x", 1, None, True, ["delete"]]:
        assert_invalid({name: bad}, name)


def test_cleanup_policy_list_with_spaces_is_normalised() -> None:
    cfg = LogConfig.from_dict({"cleanup.policy": "compact, delete"})
    assert cfg.cleanup_policy == "compact,delete"
    assert cfg.compact and cfg.delete
    compact = LogConfig.from_dict({"cleanup.policy": "compact"})
    assert compact.compact and not compact.delete
    assert LogConfig().delete and not LogConfig().compact


def test_timestamp_type_flag() -> None:
    assert LogConfig.from_dict({"message.timestamp.type": "LogAppendTime"}).log_append_time
    assert not LogConfig().log_append_time


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(True, True), (False, False), ("true", True), ("FALSE", False), ("True", True)],
)
def test_bool_key_accepts_bools_and_strings(raw: Any, expected: bool) -> None:
    cfg = LogConfig.from_dict({"unclean.leader.election.enable": raw})
    assert cfg.unclean_leader_election is expected


@pytest.mark.parametrize("raw", [1, 0, "yes", "1", "", None, 1.0])
def test_bool_key_rejects_everything_else(raw: Any) -> None:
    assert_invalid({"unclean.leader.election.enable": raw}, "unclean.leader.election.enable")


@pytest.mark.parametrize(
    ("raw", "expected"), [(0, 0.0), (1, 1.0), ("0.25", 0.25), (0.75, 0.75), ("1", 1.0)]
)
def test_float_key_accepts_numbers_in_range(raw: Any, expected: float) -> None:
    cfg = LogConfig.from_dict({"min.cleanable.dirty.ratio": raw})
    assert cfg.min_cleanable_dirty_ratio == expected


@pytest.mark.parametrize(
    "raw", [-0.01, 1.01, "2", "nan", float("nan"), float("inf"), "x", None, True]
)
def test_float_key_rejects_out_of_range_and_junk(raw: Any) -> None:
    assert_invalid({"min.cleanable.dirty.ratio": raw}, "min.cleanable.dirty.ratio")


@pytest.mark.parametrize(
    "name", ["retention.size", "segment.byte", "", "Segment.bytes", "log.retention.ms"]
)
def test_unknown_keys_are_rejected_naming_the_key(name: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_dict({"segment.bytes": 1024, name: "1"})
    assert info.value.detail["config"] == name
    assert repr(name) in str(info.value)


def test_the_first_bad_key_is_reported_and_nothing_is_half_applied() -> None:
    base = LogConfig.from_dict({"retention.ms": 5})
    with pytest.raises(InvalidConfigError):
        LogConfig.from_dict({"retention.ms": 10, "segment.bytes": 1}, base)
    assert base.retention_ms == 5


def test_from_dict_overrides_a_base_config() -> None:
    base = LogConfig.from_dict({"retention.ms": "1000", "segment.bytes": "2048"})
    cfg = LogConfig.from_dict({"segment.bytes": 4096}, base)
    assert (cfg.retention_ms, cfg.segment_bytes) == (1000, 4096)
    assert base.segment_bytes == 2048  # frozen: the base is untouched


def _value_for(name: str) -> st.SearchStrategy[Any]:
    if name in INT_KEYS:
        _, _, low, high = INT_KEYS[name]
        return st.integers(low, high)
    if name in STR_KEYS:
        return st.sampled_from(STR_KEYS[name][2])
    if name == "min.cleanable.dirty.ratio":
        return st.floats(0.0, 1.0, allow_nan=False)
    return st.booleans()


@st.composite
def config_inputs(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(ALL_KEYS)), unique=True))
    return {name: draw(_value_for(name)) for name in names}


@SETTINGS
@given(values=config_inputs(), stringify=st.booleans())
def test_to_dict_and_overrides_round_trip(values: dict[str, Any], stringify: bool) -> None:
    if stringify:  # as the admin API / CLI sends them
        values = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in values.items()}
    cfg = LogConfig.from_dict(values)
    full = cfg.to_dict()
    assert LogConfig.from_dict(full) == cfg
    assert LogConfig.from_dict(json.loads(json.dumps(full))) == cfg
    overrides = cfg.overrides()
    assert LogConfig.from_dict(overrides) == cfg
    default = LogConfig().to_dict()
    assert overrides == {k: v for k, v in full.items() if v != default[k]}
    for k in values:
        attr = KEYS_BY_NAME[k].attr
        assert full[k] == getattr(cfg, attr)
    assert dataclasses.asdict(cfg).keys() == {KEYS_BY_NAME[k].attr for k in ALL_KEYS}


@pytest.mark.parametrize(
    "raw", ["+1024", "01024", "1_024", " 1024", "1024 ", "\u0661\u0660\u0662\u0664"]
)
def test_int_keys_given_as_text_are_plain_digits(raw: str) -> None:
    """int() accepts all of these; Kafka's config parser accepts none."""
    assert_invalid({"segment.index.bytes": raw}, "segment.index.bytes")


def test_max_message_bytes_has_a_usable_minimum() -> None:
    """0 (Kafka's minimum) made every produce to the topic fail."""
    assert_invalid({"max.message.bytes": 0}, "max.message.bytes")
    assert LogConfig.from_dict({"max.message.bytes": MIN_MESSAGE_BYTES}).max_message_bytes == 128
