"""The front door's synchronous admission (:meth:`api.access.Access.admit`) against the full
check (:meth:`api.access.Access.check`): admit may only say yes where check says yes, with
the same identity, and a revoked key, a removed ACL or an expired verification stops it at
once. Also the bounds of the per-path caches the front door keeps."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import access, quota_gate
from api.access import IDENTITY_KEY, Access
from api.security import Security
from api.settings import Settings
from auth_quotas.credentials import generate_api_key, hash_api_key
from auth_quotas.limits import VERIFIED_KEY_CACHE_TTL_MS
from cluster.security_store import AclRow, KeyRow, SecuritySnapshot, UserRow

_HASHER = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
ALICE = generate_api_key()
BOB = generate_api_key()
CAROL = generate_api_key()  # a key no snapshot knows
_DIGESTS = {k.key_id: hash_api_key(k.token, _HASHER) for k in (ALICE, BOB)}
_ACLS = (
    AclRow("User:alice", "topic", "t-", "prefixed", "write", "allow"),
    AclRow("User:alice", "topic", "t-a", "literal", "describe", "allow"),
    AclRow("User:alice", "topic", "t-secret", "literal", "write", "deny"),
    AclRow("User:bob", "group", "g", "literal", "read", "allow"),
)


def _snapshot(
    version: int, keys: tuple[str, ...] = ("alice", "bob"), acls: tuple[AclRow, ...] = _ACLS
) -> SecuritySnapshot:
    users = (UserRow("alice", 0), UserRow("bob", 0))
    rows = tuple(
        KeyRow(k.key_id, user, _DIGESTS[k.key_id], "", 0)
        for user, k in (("alice", ALICE), ("bob", BOB))
        if user in keys
    )
    return SecuritySnapshot(version, users, rows, acls, ())


def _front_door(tmp_path: Path, clock: list[int]) -> Access:
    security = Security(
        Settings(data_dir=tmp_path, auth=True),
        hasher_factory=lambda: _HASHER,
        now_ms=lambda: clock[0],
    )
    security.apply(_snapshot(1))
    door = Access(True)
    door.security = security
    return door


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": list(headers),
    }


def _check(door: Access, scope: dict[str, Any]) -> tuple[bool, int]:
    """check's decision and the status it answered (0: none)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    ok = asyncio.run(door.check(scope, receive, send))
    return ok, int(sent[0]["status"]) if sent else 0


def _basic(user: str, token: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{token}".encode())


AUTHORIZATIONS = [
    None,
    b"",
    f"Bearer {ALICE.token}".encode(),
    f"Bearer {BOB.token}".encode(),
    f"Bearer {CAROL.token}".encode(),
    _basic("alice", ALICE.token),
    _basic("bob", ALICE.token),  # alice's key under another name
    b"Bearer not-a-key",
]
EXTRA_HEADERS = [
    (b"host", b"127.0.0.1"),
    (b"logbus-client-id", b"c"),
    (b"logbus-principal", b"User:admin"),  # only a broker may say this
    (b"logbus-forwarded-by", b"2"),
    (b"logbus-cluster-credential", b"forged"),
]
REQUESTS = [
    ("POST", "/v1/topics/{n}/records"),
    ("POST", "/v1/topics/{n}/partitions/0/records"),
    ("GET", "/v1/topics/{n}/partitions/0/records"),
    ("GET", "/v1/topics/{n}"),
    ("HEAD", "/v1/topics/{n}"),
    ("DELETE", "/v1/topics/{n}"),
    ("GET", "/v1/topics"),
    ("GET", "/healthz"),
    ("POST", "/v1/acls"),
    ("GET", "/v1/groups/{n}"),
    ("GET", "/v1/nowhere/{n}"),
]
NAMES = ["t-a", "t-b", "t-secret", "u", "g"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    request=st.sampled_from(REQUESTS),
    name=st.sampled_from(NAMES),
    authorizations=st.lists(st.sampled_from(AUTHORIZATIONS), min_size=1, max_size=2),
    extra=st.lists(st.sampled_from(EXTRA_HEADERS), max_size=2),
    warm=st.booleans(),
)
def test_admit_says_yes_only_where_check_does(
    tmp_path_factory: Any,
    request: tuple[str, str],
    name: str,
    authorizations: list[bytes | None],
    extra: list[tuple[bytes, bytes]],
    warm: bool,
) -> None:
    door = _front_door(tmp_path_factory.mktemp("admit"), [1_000_000])
    method, template = request
    headers = [(b"authorization", a) for a in authorizations if a is not None] + extra
    path = template.format(n=name)
    if warm:  # the credential verified before (what admit answers from)
        _check(door, _scope(method, path, headers))
    fast = _scope(method, path, headers)
    admitted = door.admit(fast)
    slow = _scope(method, path, headers)
    ok, status = _check(door, slow)
    if admitted:
        assert ok and status == 0
        assert fast.get(IDENTITY_KEY) == slow.get(IDENTITY_KEY)
        assert fast["headers"] == headers  # nothing stripped: nothing to strip
    # The front door's order (admit, then check when admit cannot tell) decides as check.
    door_scope = _scope(method, path, headers)
    if not door.admit(door_scope):
        assert _check(door, door_scope) == (ok, status)
    assert door_scope.get(IDENTITY_KEY) == slow.get(IDENTITY_KEY)


def _alice_writes(door: Access) -> dict[str, Any]:
    return _scope(
        "POST", "/v1/topics/t-a/records", [(b"authorization", f"Bearer {ALICE.token}".encode())]
    )


def test_a_revoked_key_is_not_admitted_after_the_snapshot(tmp_path: Path) -> None:
    door = _front_door(tmp_path, [1_000_000])
    assert door.security is not None
    assert _check(door, _alice_writes(door)) == (True, 0)
    assert door.admit(_alice_writes(door))
    door.security.apply(_snapshot(2, keys=("bob",)))  # alice's key revoked
    assert not door.admit(_alice_writes(door))
    assert _check(door, _alice_writes(door)) == (False, 401)


def test_a_removed_acl_stops_admission_after_the_snapshot(tmp_path: Path) -> None:
    door = _front_door(tmp_path, [1_000_000])
    assert door.security is not None
    assert _check(door, _alice_writes(door)) == (True, 0)
    assert door.admit(_alice_writes(door))
    door.security.apply(_snapshot(2, acls=_ACLS[1:]))  # no WRITE on t- any more
    assert not door.admit(_alice_writes(door))
    assert _check(door, _alice_writes(door)) == (False, 403)


def test_a_verification_past_its_ttl_is_not_admitted(tmp_path: Path) -> None:
    clock = [1_000_000]
    door = _front_door(tmp_path, clock)
    assert _check(door, _alice_writes(door)) == (True, 0)
    clock[0] += VERIFIED_KEY_CACHE_TTL_MS - 1
    assert door.admit(_alice_writes(door))
    clock[0] += 1
    assert not door.admit(_alice_writes(door))  # check verifies it again


def test_the_per_path_caches_stay_bounded() -> None:
    for i in range(access.MATCH_CACHE_ENTRIES + 10):
        access.match("GET", f"/v1/topics/bound-{i}")
        quota_gate.request_kind("GET", f"/v1/topics/bound-{i}")
    assert 0 < len(access._MATCHED) <= access.MATCH_CACHE_ENTRIES
    assert 0 < len(quota_gate._KINDS) <= quota_gate.KIND_CACHE_ENTRIES
    # Answers are the same remembered or not.
    assert quota_gate.request_kind("POST", "/v1/topics/x/records") == "produce"
    assert quota_gate.request_kind("POST", "/v1/topics/x/records") == "produce"
    assert quota_gate.request_kind("DELETE", "/v1/topics/x") == "delete"


def test_the_admitted_requests_stay_bounded(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("api.security.VERIFIED_KEY_CACHE_ENTRIES", 3)
    door = _front_door(tmp_path, [1_000_000])
    assert door.security is not None
    assert _check(door, _alice_writes(door)) == (True, 0)
    bearer = [(b"authorization", f"Bearer {ALICE.token}".encode())]
    for i in range(10):
        assert door.admit(_scope("POST", f"/v1/topics/t-{i}/records", bearer))
        assert 0 < len(door.security._admitted) <= 3
    # Denied requests are never remembered as admitted.
    assert not door.admit(_scope("POST", "/v1/topics/t-secret/records", bearer))
    assert all(path != "/v1/topics/t-secret/records" for _, _, path in door.security._admitted)
