"""``api.streams.sse_events`` against a per-record reference: the same events, byte for byte.

The events are built without a Python loop per record (one ``bytes %`` of a template); the
reference below is the loop it replaced, kept here as the definition of what a stream sends.
Inputs are rendered by the real JSON renderer, with consecutive offsets and with gaps between
batches (compaction, transaction markers), for a partition stream and a member's stream.
"""

from __future__ import annotations

import orjson
import pytest

from api.rendering import encode_json_within
from api.streams import sse_events
from core_log.batch import Record, build_batch


def reference(body: bytes, count: int, topic: str | None = None, partition: int = -1) -> bytes:
    if not count:
        return b""
    parts = []
    for line in body.split(b"\n"):
        offset = int(line[10 : line.index(b",", 10)])
        if topic is not None:
            head = b'%s,"topic":%s,"partition":%d}' % (line[:-1], orjson.dumps(topic), partition)
            event_id = b"%s/%d/%d" % (topic.encode(), partition, offset + 1)
            parts.append(b"id: %s\ndata: %s\n\n" % (event_id, head))
        else:
            parts.append(b"id: %d\ndata: %s\n\n" % (offset + 1, line))
    return b"".join(parts)


VALUES = [
    b'"plain"',
    b'{"nested":{"a":[1,2,{"b":"}"}]}}',  # braces inside the record's own JSON
    b'"a line\\nbreak and }\\n inside a string"',
    b"not json at all } \n with a raw newline",  # rendered as an escaped string
    "ünïcødé %d %s".encode(),
    b"",
]


def rendered(base_offsets: list[int], per_batch: int) -> tuple[bytes, int]:
    data = b"".join(
        build_batch(
            [
                Record(VALUES[(base + i) % len(VALUES)], key=b"k%d" % i, headers=(("h", b"v"),))
                for i in range(per_batch)
            ],
            base_offset=base,
            default_timestamp=1_700_000_000_000,
        )
        for base in base_offsets
    )
    r = encode_json_within(data, base_offsets[0], 10_000, 1 << 30, sep=b"\n")
    assert r.count == len(base_offsets) * per_batch
    return r.body, r.count


@pytest.mark.parametrize(
    ("bases", "per_batch"),
    [([0], 1), ([7], 5), ([0, 5, 10], 5), ([0, 10, 11, 40], 3), ([123_456_789_012], 2)],
    ids=["one", "one-batch", "consecutive", "gaps", "large-offsets"],
)
@pytest.mark.parametrize("topic", [None, "orders", "a.b_c-%d"])
def test_events_match_the_per_record_reference(
    bases: list[int], per_batch: int, topic: str | None
) -> None:
    body, count = rendered(bases, per_batch)
    got = sse_events(body, count, topic, 3)
    assert got == reference(body, count, topic, 3)
    events = got.split(b"\n\n")[:-1]
    assert len(events) == count
    if topic is None:  # ids: the next offset of each record, gaps included
        offsets = [b + i for b in bases for i in range(per_batch)]
        assert [int(e.split(b"\n")[0][4:]) for e in events] == [o + 1 for o in offsets]


def test_no_records_no_events() -> None:
    assert sse_events(b"", 0) == b""
    assert sse_events(b"", 0, "t", 0) == b""
