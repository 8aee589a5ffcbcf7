"""uvicorn's checks of answer fields, remembered (api.connections.RememberedSearch): the same
answers as the patterns', invalid fields still refused, the memory bounded."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from api import connections
from api.connections import HEADER_CHECK_MAX_BYTES, HEADER_CHECKS_MAX, RememberedSearch

NAME = re.compile(b'[\\x00-\\x1f\\x7f()<>@,;:\\[\\]={} \\t\\\\"]')
VALUE = re.compile(b"[\\x00-\\x08\\x0a-\\x1f\\x7f]")


@given(st.lists(st.binary(max_size=300), max_size=40))
def test_a_remembered_search_answers_as_the_pattern(subjects: list[bytes]) -> None:
    remembered = RememberedSearch(VALUE)
    for subject in subjects * 2:  # each seen first, then remembered
        found = remembered.search(subject)
        expected = VALUE.search(subject)
        assert (found is None) == (expected is None)
        if expected is not None:
            assert found is not None and found.span() == expected.span()


def test_what_is_remembered_is_bounded() -> None:
    remembered = RememberedSearch(VALUE)
    for i in range(HEADER_CHECKS_MAX + 10):
        remembered.search(str(i).encode())
    assert len(remembered) <= HEADER_CHECKS_MAX
    remembered.search(b"x" * (HEADER_CHECK_MAX_BYTES + 1))
    assert b"x" * (HEADER_CHECK_MAX_BYTES + 1) not in remembered


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _answer(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    transport = _Transport()
    log = logging.getLogger("test")
    cycle: Any = RequestResponseCycle(
        scope={"type": "http", "method": "GET", "path": "/", "headers": []},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=log,
        access_logger=log,
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    await cycle.send({"type": "http.response.start", "status": 200, "headers": headers})
    return transport.written


@pytest.mark.parametrize(
    "bad",
    [(b"x-ok", b"split\r\nx-injected: 1"), (b"x bad", b"1"), (b"x-ok", b"nul\x00")],
)
def test_uvicorn_still_refuses_an_invalid_field_once_its_checks_are_remembered(
    bad: tuple[bytes, bytes],
) -> None:
    connections.remember_header_checks()
    assert isinstance(httptools_impl.HEADER_RE, RememberedSearch)
    assert isinstance(httptools_impl.HEADER_VALUE_RE, RememberedSearch)
    for _ in range(2):  # seen first, then remembered
        good = asyncio.run(_answer([(b"content-length", b"0"), (b"x-ok", b"fine")]))
        assert b"x-ok: fine\r\n" in good[0]
        with pytest.raises(RuntimeError, match="Invalid HTTP header"):
            asyncio.run(_answer([bad]))
