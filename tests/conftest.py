from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker process on its own data directory and port."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=broker.url, timeout=30.0) as c:
        yield c
