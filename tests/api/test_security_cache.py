"""API key verification in :class:`api.security.Security`: one argon2 check per key, however
many requests arrive before it ends (benchmarks/auth.py found 64 connections opening at once
costing 64 hashes: seconds of CPU; the same would recur whenever the cached verification
expired under load)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from argon2 import PasswordHasher

from api.security import Security
from api.settings import Settings
from auth_quotas.credentials import generate_api_key, hash_api_key
from auth_quotas.limits import VERIFIED_KEY_CACHE_TTL_MS
from cluster.security_store import KeyRow, SecuritySnapshot, UserRow


class CountingHasher(PasswordHasher):
    """A cheap argon2 that counts its checks; each waits for ``release`` (so the test, not
    the scheduler, decides when the first check ends)."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.checks = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def verify(self, hash: str | bytes, password: str | bytes) -> bool:
        with self._lock:
            self.checks += 1
        self.started.set()
        assert self.release.wait(30), "the test never released the check"
        return super().verify(hash, password)


def _security(
    tmp_path: Path, clock: list[int] | None = None
) -> tuple[Security, CountingHasher, str, str]:
    """Security with auth on and user alice's key; ``clock``: its time (ms), for the test
    to move. Returns (security, hasher, alice's token, a token with alice's key id and a
    wrong secret)."""
    hasher = CountingHasher()
    clock = clock if clock is not None else [1_000_000]
    security = Security(
        Settings(data_dir=tmp_path, auth=True),
        hasher_factory=lambda: hasher,
        now_ms=lambda: clock[0],
    )
    key = generate_api_key()
    digest = hash_api_key(key.token, PasswordHasher(time_cost=1, memory_cost=8, parallelism=1))
    security.apply(
        SecuritySnapshot(
            1, (UserRow("alice", 0),), (KeyRow(key.key_id, "alice", digest, "", 0),), (), ()
        )
    )
    bad = key.token[:-4] + ("AAAA" if not key.token.endswith("AAAA") else "BBBB")
    return security, hasher, key.token, bad


async def _many(security: Security, hasher: CountingHasher, token: str, n: int) -> list[object]:
    calls = [
        asyncio.ensure_future(security.authenticate(f"Bearer {token}", None)) for _ in range(n)
    ]
    # Every request is waiting before the one check may end.
    await asyncio.to_thread(hasher.started.wait, 30)
    for _ in range(20):
        await asyncio.sleep(0)
    hasher.release.set()
    return list(await asyncio.gather(*calls, return_exceptions=True))


def test_concurrent_first_uses_of_a_key_cost_one_check(tmp_path: Path) -> None:
    security, hasher, token, _ = _security(tmp_path)

    async def scenario() -> None:
        answers = await _many(security, hasher, token, 64)
        assert hasher.checks == 1
        assert {getattr(a, "user", a) for a in answers} == {"alice"}
        # Cached from now on: no further check.
        await security.authenticate(f"Bearer {token}", None)
        assert hasher.checks == 1

    asyncio.run(scenario())


def test_expiry_costs_one_check_for_the_requests_in_flight(tmp_path: Path) -> None:
    clock = [1_000_000]
    security, hasher, token, _ = _security(tmp_path, clock)

    async def scenario() -> None:
        await _many(security, hasher, token, 1)
        assert hasher.checks == 1
        clock[0] += VERIFIED_KEY_CACHE_TTL_MS  # the cached verification expires
        hasher.started.clear()
        hasher.release.clear()
        answers = await _many(security, hasher, token, 32)
        assert hasher.checks == 2
        assert {getattr(a, "user", a) for a in answers} == {"alice"}

    asyncio.run(scenario())


def test_a_waiter_cancelled_does_not_cancel_the_check(tmp_path: Path) -> None:
    security, hasher, token, _ = _security(tmp_path)

    async def scenario() -> None:
        first = asyncio.ensure_future(security.authenticate(f"Bearer {token}", None))
        second = asyncio.ensure_future(security.authenticate(f"Bearer {token}", None))
        await asyncio.to_thread(hasher.started.wait, 30)
        first.cancel()
        hasher.release.set()
        assert (await second).user == "alice"
        assert first.cancelled()

    asyncio.run(scenario())


def test_concurrent_guesses_stop_hashing_at_the_failure_limit(tmp_path: Path) -> None:
    """Guesses at one key id queued behind each other: once KEY_FAILURES_MAX have failed, the
    rest are refused without a hash (checked again after the wait, not only before it)."""
    from auth_quotas.credentials import KEY_FAILURES_MAX

    security, hasher, token, _ = _security(tmp_path)
    prefix = token.rsplit(".", 1)[0]
    guesses = [f"{prefix}.{generate_api_key().token.rsplit('.', 1)[1]}" for _ in range(20)]

    async def scenario() -> list[object]:
        calls = [asyncio.ensure_future(security.authenticate(f"Bearer {g}", None)) for g in guesses]
        await asyncio.to_thread(hasher.started.wait, 30)
        hasher.release.set()
        return list(await asyncio.gather(*calls, return_exceptions=True))

    answers = asyncio.run(scenario())
    assert all(type(a).__name__ == "InvalidCredentialsError" for a in answers), answers
    assert hasher.checks == KEY_FAILURES_MAX
