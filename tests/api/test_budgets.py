"""The sans-I/O parts of the limits: byte budgets and the connection gate."""

from __future__ import annotations

import asyncio

import pytest

from api.budgets import ByteBudget
from api.connections import ConnectionGate, connection_cap
from api.settings import Settings


def test_a_budget_admits_what_fits_and_one_oversize_when_empty() -> None:
    b = ByteBudget("bodies", 100)
    assert b.try_reserve(60)
    assert not b.try_reserve(41)
    assert b.try_reserve(40)
    b.release(100)
    assert b.try_reserve(1_000)  # alone, a reservation past the cap still goes through
    assert not b.try_reserve(1)
    b.release(1_000)
    assert b.used_bytes == 0
    assert b.fits(1_000)  # fits() says what try_reserve would do, reserving nothing
    assert b.try_reserve(50) and b.fits(50) and not b.fits(51)


def test_a_waiter_gets_room_when_it_is_released() -> None:
    async def scenario() -> list[str]:
        b = ByteBudget("streams", 100)
        order: list[str] = []
        assert b.try_reserve(80)

        async def second() -> None:
            async with b.held(50):
                order.append("second holds")

        task = asyncio.create_task(second())
        await asyncio.sleep(0)
        order.append("first releases")
        b.release(80)
        await asyncio.wait_for(task, 5)
        assert b.used_bytes == 0
        return order

    assert asyncio.run(scenario()) == ["first releases", "second holds"]


def test_a_cancelled_waiter_holds_nothing() -> None:
    async def scenario() -> int:
        b = ByteBudget("streams", 100)
        assert b.try_reserve(100)
        task = asyncio.create_task(b.wait_reserve(10))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        b.release(100)
        return b.used_bytes

    assert asyncio.run(scenario()) == 0


def test_the_gate_closes_the_longest_idle_first_then_refuses() -> None:
    gate = ConnectionGate(2)
    a, b, c, d = object(), object(), object(), object()
    for conn in (a, b):
        assert gate.admit() == (True, None)
        gate.idle(conn)
    gate.idle(a)  # a answered again: b is now idle longest
    assert gate.admit() == (True, b)
    gate.busy(c)
    gate.closed(b)
    gate.busy(a)
    assert gate.admit() == (False, None)  # a and c busy: d is refused at accept
    assert (gate.evicted, gate.refused) == (1, 1)
    gate.closed(a)
    assert gate.admit() == (True, None)
    assert d is not None


def test_the_connection_cap_leaves_descriptors_for_segments() -> None:
    assert connection_cap(10_000, 20_000, 1024) == 10_000
    assert connection_cap(10_000, 1024, 1024) == 1  # never zero
    assert connection_cap(10_000, 4096, 1024) == 4096 - 1024 - 256


def test_budgets_must_admit_the_largest_request() -> None:
    with pytest.raises(ValueError, match="max_inflight_body_bytes"):
        Settings(max_request_bytes=100, max_inflight_body_bytes=99)
    with pytest.raises(ValueError, match="max_inflight_response_bytes"):
        Settings(max_fetch_bytes=100, max_inflight_response_bytes=99)


def test_limits_must_be_positive() -> None:
    for name in ("header_timeout_ms", "body_timeout_ms", "send_timeout_ms", "max_connections"):
        with pytest.raises(ValueError, match=name):
            Settings.model_validate({name: 0})
