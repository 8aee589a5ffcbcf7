"""The quota gate's handler timer: the C ``api._steptimer.StepTimer`` and its Python twin
``api.quota_gate._TimedPy`` await a coroutine the same way (result, exceptions, values sent
in, cancellation passed into the coroutine) and count only the time its steps ran."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from api.quota_gate import _Timed, _TimedPy

IMPLS: list[Any] = [_TimedPy]
if _Timed is not _TimedPy:
    IMPLS.append(_Timed)


def test_the_c_timer_is_built() -> None:
    """CI builds the extension (setup.py); the twin alone would hide a broken build."""
    assert _Timed is not _TimedPy


@pytest.mark.parametrize("impl", IMPLS)
def test_result_values_and_exceptions_pass_through(impl: Any) -> None:
    async def inner(fut: asyncio.Future[int]) -> int:
        got = await fut  # a value sent into the coroutine
        return got * 2

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        loop.call_soon(fut.set_result, 21)
        assert await impl(inner(fut)) == 42
        with pytest.raises(ValueError, match="boom"):
            await impl(failing())
        assert await impl(asyncio.sleep(0)) is None

    asyncio.run(main())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("value", [None, 7])
def test_driven_by_hand_the_end_is_a_stop_iteration(impl: Any, value: int | None) -> None:
    """``send`` called as a method, as a coroutine's driver does outside the event loop:
    the coroutine's return is StopIteration with its value (the C ``send`` once returned
    an error without an exception for None: SystemError)."""

    async def returns() -> int | None:
        return value

    async def outer() -> int | None:
        return await impl(returns())

    coro = outer()
    with pytest.raises(StopIteration) as stopped:
        coro.send(None)
    assert stopped.value.value == value
    if impl is not _TimedPy:  # the C timer is its own iterator (the twin awaits one)
        with pytest.raises(StopIteration) as stopped:
            impl(returns()).send(None)
        assert stopped.value.value == value


@pytest.mark.parametrize("impl", IMPLS)
def test_cancellation_reaches_the_coroutine(impl: Any) -> None:
    cleaned: list[str] = []

    async def handler(started: asyncio.Event) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(_await(impl(handler(started))))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cleaned == ["cancelled"]


async def _await(awaitable: Any) -> Any:
    return await awaitable


@pytest.mark.parametrize("impl", IMPLS)
def test_only_the_steps_count(impl: Any) -> None:
    """The timer holds at least the CPU time the steps measured themselves, and none of the
    time the coroutine waited."""
    busy_ns: list[int] = []
    seen: list[int] = []

    def spin() -> None:
        start = time.perf_counter_ns()
        while time.perf_counter_ns() - start < 2_000_000:
            pass
        busy_ns.append(time.perf_counter_ns() - start)

    slept: list[int] = []

    async def handler() -> None:
        spin()
        seen.append(timer.so_far())  # counts the step running now
        before = time.perf_counter_ns()
        await asyncio.sleep(0.05)
        slept.append(time.perf_counter_ns() - before)
        spin()

    async def main() -> tuple[int, int]:
        start = time.perf_counter_ns()
        await timer
        return time.perf_counter_ns() - start, timer.ns

    timer = impl(handler())
    wall, ns = asyncio.run(main())
    assert ns >= sum(busy_ns) and seen[0] >= busy_ns[0]
    # The sleep is not in it (as long as the handler saw it, which under uvloop may be less
    # than 50 ms: its timers count from the loop's time cached before the first step), bar
    # the few µs between the handler's clock readings and the timer's around the wait.
    assert slept[0] > 10_000_000 and ns <= wall - slept[0] + 1_000_000


def test_the_c_timer_wants_a_coroutine() -> None:
    if _Timed is _TimedPy:
        pytest.skip("the C extension is not built (LOGBUS_PURE_PYTHON=1)")
    with pytest.raises(TypeError):
        _Timed(42)  # type: ignore[arg-type]

    async def handler() -> None:
        return None

    made = [handler(), handler(), handler()]
    try:
        for args, kwargs in (((), {}), ((made[0], made[1]), {}), ((), {"coro": made[2]})):
            with pytest.raises(TypeError, match="one coroutine"):
                _Timed(*args, **kwargs)
    finally:
        for coro in made:  # never started
            coro.close()


def test_the_c_clocks_read_as_their_twins() -> None:
    """The request path's millisecond clocks (quota sensors, the admission memo's TTL): the C
    functions against their Python twins, read in between."""
    from api import quota_state, security

    if _Timed is _TimedPy:
        pytest.skip("the C extension is not built (LOGBUS_PURE_PYTHON=1)")
    assert quota_state.monotonic_ms is not quota_state._monotonic_ms
    assert security.wall_ms is not security._wall_ms
    for c, twin in (
        (quota_state.monotonic_ms, quota_state._monotonic_ms),
        (security.wall_ms, security._wall_ms),
    ):
        before = twin()
        read = c()
        after = twin()
        assert isinstance(read, int) and before <= read <= after
