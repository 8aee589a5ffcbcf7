"""Module-scoped brokers for the HTTP integration tests.

Starting a broker process costs a couple of seconds, so each test module shares one
(``shared_broker``) and every test uses its own topic names (:func:`tests.api.helpers.unique`).
Tests that restart or kill a broker start their own with :func:`start_broker`.

Modules that want the produce/fetch paths exercised both through the lean ASGI route and through
the FastAPI routes that back it up override ``shared_broker`` with :func:`both_paths_broker`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from tests.server import BrokerProcess

FAST_PATH = "fast_path"
FASTAPI_ROUTES = "fastapi_routes"


def start_broker(
    data_dir: Path, *extra_args: str, env: Mapping[str, str] | None = None
) -> BrokerProcess:
    """Start a broker; ``env`` is set only while the child starts (it inherits os.environ)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in (env or {}).items():
            mp.setenv(k, v)
        return BrokerProcess(data_dir, None, *extra_args).start()


def make_client(broker: BrokerProcess, **kwargs: object) -> httpx.Client:
    return httpx.Client(base_url=broker.url, timeout=30.0, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker (lean fast path on) for a whole test module."""
    b = start_broker(tmp_path_factory.mktemp("shared") / "data")
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def http(shared_broker: BrokerProcess) -> Iterator[httpx.Client]:
    with make_client(shared_broker) as c:
        yield c


_MODES: dict[int, str] = {}


def broker_mode(broker: BrokerProcess) -> str:
    """FAST_PATH or FASTAPI_ROUTES: how this broker serves produce and fetch."""
    return _MODES.get(broker.port, FAST_PATH)


def both_paths_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """Body of a module fixture parametrized over FAST_PATH / FASTAPI_ROUTES."""
    mode: str = request.param
    args = ("--no-fast-path",) if mode == FASTAPI_ROUTES else ()
    b = start_broker(tmp_path_factory.mktemp(mode) / "data", *args)
    _MODES[b.port] = mode
    try:
        yield b
    finally:
        b.stop()
