"""The fast path's query parser reads every query string as ``urllib.parse.parse_qsl`` does."""

from __future__ import annotations

from urllib.parse import parse_qsl

from hypothesis import given
from hypothesis import strategies as st

from api.fastpath import parse_query

_ALPHABET = st.sampled_from([*"ab=&%+;1 x", "%41", "%zz", "é"])


@given(st.lists(_ALPHABET, max_size=30).map("".join))
def test_parse_query_agrees_with_parse_qsl(text: str) -> None:
    raw = text.encode("latin-1", "replace")
    expected = dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))
    assert parse_query(raw) == expected


def test_common_queries() -> None:
    assert parse_query(b"acks=1") == {"acks": "1"}
    assert parse_query(b"offset=5&max_records=10&wait_ms=") == {
        "offset": "5",
        "max_records": "10",
        "wait_ms": "",
    }
    assert parse_query(b"a=1&a=2") == {"a": "2"}
    assert parse_query(b"a=%31") == {"a": "1"}
