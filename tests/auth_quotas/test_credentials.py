"""Credentials: API keys (generation, argon2 storage, cached verification, revocation), header
parsing, scoped tokens, JWTs (forged, expired, wrong audience, oversized, algorithm confusion),
and client-certificate subjects. argon2 runs with test-cheap parameters."""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest
from argon2 import PasswordHasher
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from auth_quotas.credentials import (
    ApiKeyVerifier,
    BasicCredentials,
    BearerCredentials,
    Identity,
    JwtValidator,
    KeyFailureLimiter,
    ScopedTokenSigner,
    StoredKey,
    default_hasher,
    generate_api_key,
    hash_api_key,
    parse_api_key,
    parse_authorization,
    user_from_peercert,
    verify_basic,
)
from auth_quotas.errors import (
    AuthenticationError,
    ExpiredCredentialsError,
    InvalidCredentialsError,
    InvalidTokenRequestError,
    MalformedCredentialsError,
    MissingCredentialsError,
    www_authenticate,
)
from core_log.errors import ErrorCode

CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


class Store:
    """A dict of stored keys that counts lookups (the verifier must not need them when cached)."""

    def __init__(self) -> None:
        self.keys: dict[str, StoredKey] = {}
        self.lookups = 0

    def add(self, user: str) -> str:
        new = generate_api_key()
        self.keys[new.key_id] = StoredKey(new.key_id, user, hash_api_key(new.token, CHEAP))
        return new.token

    def __call__(self, key_id: str) -> StoredKey | None:
        self.lookups += 1
        return self.keys.get(key_id)


# --- API keys ------------------------------------------------------------------------------


def test_generated_keys_are_unique_printable_and_parse() -> None:
    keys = [generate_api_key() for _ in range(200)]
    assert len({k.token for k in keys}) == 200 and len({k.key_id for k in keys}) == 200
    for k in keys:
        assert k.token.isprintable() and " " not in k.token
        assert parse_api_key(k.token) == k.key_id
        assert parse_authorization(f"Bearer {k.token}") == BearerCredentials(k.token)
        assert BearerCredentials(k.token).kind == "api_key"


def test_generation_uses_the_injected_randomness() -> None:
    def seeded() -> Callable[[int], bytes]:
        rng = random.Random(7)
        return lambda n: rng.randbytes(n)

    assert generate_api_key(seeded()) == generate_api_key(seeded())


def test_storage_form_is_a_salted_argon2id_hash() -> None:
    token = generate_api_key().token
    h1, h2 = hash_api_key(token, CHEAP), hash_api_key(token, CHEAP)
    assert h1.startswith("$argon2id$") and h1 != h2  # salted
    assert token not in h1 and token.split(".")[2] not in h1
    prod = default_hasher()
    assert (prod.memory_cost, prod.time_cost, prod.parallelism) == (19_456, 2, 1)


def test_verification_is_cached_and_costs_no_lookup_or_hash() -> None:
    store = Store()
    token = store.add("alice")
    verifier = ApiKeyVerifier(CHEAP)
    assert verifier.verify(token, store, now_ms=0) == Identity("alice", "api_key", token[4:20])
    assert store.lookups == 1
    for now in range(1, 100):
        assert verifier.verify(token, store, now_ms=now).user == "alice"
    assert store.lookups == 1  # every repeat came from the cache
    assert verifier.cached(token, 100) is not None


def test_cached_verification_is_fast_compared_to_argon2() -> None:
    """Relative, not absolute: a cached verify must be far cheaper than one argon2 check at
    production cost (the issue asks for >= 0.90x throughput with auth on)."""
    store = Store()
    token = store.add("alice")
    verifier = ApiKeyVerifier(CHEAP)
    verifier.verify(token, store, 0)
    start = time.perf_counter()
    for _ in range(1000):
        verifier.verify(token, store, 1)
    cached_each = (time.perf_counter() - start) / 1000
    prod = default_hasher()
    stored = prod.hash(token)
    start = time.perf_counter()
    prod.verify(stored, token)
    argon_each = time.perf_counter() - start
    assert cached_each * 100 < argon_each


def test_wrong_secret_unknown_and_revoked_keys_are_refused() -> None:
    store = Store()
    token = store.add("alice")
    verifier = ApiKeyVerifier(CHEAP)
    key_id = parse_api_key(token)
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(InvalidCredentialsError):
        verifier.verify(forged, store, 0)
    with pytest.raises(InvalidCredentialsError):
        verifier.verify(generate_api_key().token, store, 0)
    verifier.verify(token, store, 0)
    # a wrong secret for a cached key id still goes to the hash, and fails
    with pytest.raises(InvalidCredentialsError):
        verifier.verify(forged, store, 1)
    del store.keys[key_id]
    verifier.invalidate(key_id)
    with pytest.raises(InvalidCredentialsError) as info:
        verifier.verify(token, store, 2)
    assert info.value.http_status == 401 and info.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "unknown or revoked" in info.value.message


def test_revocation_during_verification_leaves_no_stale_entry() -> None:
    store = Store()
    token = store.add("alice")
    verifier = ApiKeyVerifier(CHEAP)
    key_id = parse_api_key(token)
    epoch = verifier.epoch
    stored = store(key_id)
    verifier.invalidate(key_id)  # lands while the (threaded) hash check runs
    verifier.verify_stored(token, stored, 0, epoch=epoch)
    assert verifier.cached(token, 1) is None
    # the same with the split steps the async wiring uses
    epoch = verifier.epoch
    identity = verifier.check(token, stored)  # would run in a worker thread
    assert len(verifier) == 0  # check never touches the cache
    verifier.invalidate(key_id)
    verifier.remember(token, identity, 0, epoch=epoch)
    assert verifier.cached(token, 1) is None
    verifier.remember(token, identity, 0, epoch=verifier.epoch)
    assert verifier.cached(token, 1) == identity


def test_cache_is_bounded_expires_and_forgets_users() -> None:
    store = Store()
    tokens = [store.add(f"u{i % 3}") for i in range(10)]
    verifier = ApiKeyVerifier(CHEAP, max_entries=4, ttl_ms=1000)
    for t in tokens:
        verifier.verify(t, store, 0)
    assert len(verifier) == 4
    assert verifier.cached(tokens[-1], 999) is not None
    assert verifier.cached(tokens[-1], 1000) is None  # too old: verify again
    verifier.invalidate_user("u0")
    assert all(verifier.cached(t, 1) is None or verifier.cached(t, 1).user != "u0" for t in tokens)  # type: ignore[union-attr]
    verifier.clear()
    assert len(verifier) == 0


def test_key_failures_block_a_key_id_at_the_limit_until_the_window_ends() -> None:
    limiter = KeyFailureLimiter(max_failures=5, window_ms=60_000, max_entries=3)
    for i in range(4):
        limiter.failed("a", 1_000 + i)
        assert not limiter.blocked("a", 1_000 + i)  # below the limit: still verified
    limiter.failed("a", 2_000)
    assert limiter.blocked("a", 2_000) and limiter.blocked("a", 60_999)
    assert not limiter.blocked("b", 2_000)  # per key id
    assert not limiter.blocked("a", 61_000)  # the window (from the first failure) ended
    assert len(limiter) == 0  # and the entry is gone
    for _ in range(5):
        limiter.failed("a", 70_000)
    limiter.succeeded("a")  # a success (a cached key does not get here) forgets the failures
    assert not limiter.blocked("a", 70_001)
    for key_id in "wxyz":  # bounded: the least recently failed id is forgotten first
        for _ in range(5):
            limiter.failed(key_id, 80_000)
    assert len(limiter) == 3 and not limiter.blocked("w", 80_001)
    assert all(limiter.blocked(k, 80_001) for k in "xyz")


def test_a_stored_hash_for_another_key_id_is_refused() -> None:
    store = Store()
    token = store.add("alice")
    other = store.add("bob")
    verifier = ApiKeyVerifier(CHEAP)
    with pytest.raises(InvalidCredentialsError):
        verifier.verify_stored(token, store.keys[parse_api_key(other)], 0)
    with pytest.raises(InvalidCredentialsError):
        verifier.verify_stored(token, StoredKey(parse_api_key(token), "alice", "not-a-hash"), 0)


# --- headers -------------------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_credentials_parse_and_must_match_the_keys_user() -> None:
    store = Store()
    token = store.add("alice")
    verifier = ApiKeyVerifier(CHEAP)
    creds = parse_authorization(basic("alice", token))
    assert creds == BasicCredentials("alice", token)
    assert token not in repr(creds)
    assert isinstance(creds, BasicCredentials)
    assert verify_basic(creds, verifier, store, 0).method == "basic"
    with pytest.raises(InvalidCredentialsError):
        verify_basic(BasicCredentials("mallory", token), verifier, store, 0)
    assert parse_authorization(b"bAsIc " + basic("a", "b:c").split()[1].encode()) == (
        BasicCredentials("a", "b:c")
    )


@pytest.mark.parametrize(
    ("header", "error", "says"),
    [
        (None, MissingCredentialsError, "no credentials"),
        ("", MissingCredentialsError, "no credentials"),
        ("Bearer", MalformedCredentialsError, "credentials missing"),
        ("Bearer    ", MalformedCredentialsError, "credentials missing"),
        ("Digest abc", MalformedCredentialsError, "unsupported"),
        ("Bearer a b", MalformedCredentialsError, "characters"),
        ("Bearer ab\x00c", MalformedCredentialsError, "characters"),
        ("Bearer " + "a" * 9000, MalformedCredentialsError, "8192"),
        (b"Bearer \xff\xfe", MalformedCredentialsError, "ASCII"),
        ("Basic !!!!", MalformedCredentialsError, "characters"),
        ("Basic abc", MalformedCredentialsError, "base64"),
        ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), MalformedCredentialsError, "UTF-8"),
        (basic("alice", ""), MalformedCredentialsError, "both parts"),
        (basic("", "key"), MalformedCredentialsError, "both parts"),
        ("Basic " + base64.b64encode(b"nocolon").decode(), MalformedCredentialsError, "user:key"),
        (basic("al\nice", "k"), MalformedCredentialsError, "control"),
    ],
)
def test_malformed_headers_get_a_clear_401(
    header: str | bytes | None, error: type[AuthenticationError], says: str
) -> None:
    with pytest.raises(error) as info:
        parse_authorization(header)
    assert says in info.value.message
    assert info.value.http_status == 401
    challenge = www_authenticate(info.value)
    assert challenge.startswith('Bearer realm="logbus"') and 'Basic realm="logbus"' in challenge
    assert ("error=" in challenge) is (error is not MissingCredentialsError)


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.binary(max_size=80),
        st.builds(lambda s, t: f"{s} {t}", st.sampled_from(["Bearer", "basic"]), st.text()),
    )
)
def test_any_header_parses_or_raises_an_authentication_error(header: str | bytes) -> None:
    try:
        creds = parse_authorization(header)
    except AuthenticationError as e:
        assert e.http_status == 401
    else:
        assert isinstance(creds, BearerCredentials | BasicCredentials)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_any_bearer_token_is_refused_cleanly_by_every_verifier(token: str) -> None:
    signer = ScopedTokenSigner(b"k" * 32)
    verifier = ApiKeyVerifier(CHEAP)
    for check in (
        lambda: signer.verify(token, 0),
        lambda: verifier.verify(token, Store(), 0),
        lambda: JWT.validate(token, NOW_MS),
    ):
        with pytest.raises(AuthenticationError):
            check()


def test_bearer_kinds() -> None:
    assert BearerCredentials("lbt.x.y").kind == "scoped"
    assert BearerCredentials("eyJhbGciOi.x.y").kind == "jwt"


# --- scoped tokens ---------------------------------------------------------------------------


def test_scoped_token_round_trip_and_expiry() -> None:
    signer = ScopedTokenSigner(b"s" * 32)
    token = signer.issue("alice", ["orders", "payments", "orders"], now_ms=1000, ttl_ms=60_000)
    assert token.startswith("lbt.") and token.isascii() and "=" not in token
    scope = signer.verify(token, now_ms=60_999)
    assert scope.subject == "alice" and scope.topics == {"orders", "payments"}
    assert scope.allows("orders") and not scope.allows("other")
    identity = scope.identity()
    assert identity.method == "scoped" and identity.expires_ms == 61_000
    assert identity.principal == "User:alice"
    with pytest.raises(ExpiredCredentialsError):
        signer.verify(token, now_ms=61_000)


def test_scoped_tokens_cannot_be_forged_or_altered() -> None:
    signer = ScopedTokenSigner(b"s" * 32)
    token = signer.issue("alice", ["orders"], now_ms=0)
    prefix, payload, signature = token.split(".")
    with pytest.raises(InvalidCredentialsError):
        ScopedTokenSigner(b"t" * 32).verify(token, 0)
    widened = base64.urlsafe_b64encode(
        orjson.dumps({"v": 1, "sub": "alice", "topics": ["secret"], "exp": 10**15})
    ).rstrip(b"=")
    with pytest.raises(InvalidCredentialsError):
        signer.verify(f"{prefix}.{widened.decode()}.{signature}", 0)
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    with pytest.raises(InvalidCredentialsError):
        signer.verify(f"{prefix}.{payload}.{flipped}", 0)
    for bad in ("lbt.", "lbt.abc", "xyz.a.b", "lbt.a.b!c", "lbt." + "a" * 5000 + ".b"):
        with pytest.raises(MalformedCredentialsError):
            signer.verify(bad, 0)


def test_scoped_token_secret_rotation() -> None:
    old, new = b"o" * 32, b"n" * 32
    token = ScopedTokenSigner(old).issue("alice", ["orders"], now_ms=0)
    assert ScopedTokenSigner(new, previous=[old]).verify(token, 1).subject == "alice"
    with pytest.raises(InvalidCredentialsError):
        ScopedTokenSigner(new).verify(token, 1)
    with pytest.raises(ValueError, match="32 bytes"):
        ScopedTokenSigner(b"short")


@pytest.mark.parametrize(
    ("subject", "topics", "ttl_ms"),
    [
        ("alice", [], 60_000),
        ("alice", ["bad topic"], 60_000),
        ("alice", ["*"], 60_000),
        ("alice", [f"t{i}" for i in range(65)], 60_000),
        ("alice", ["orders"], 0),
        ("alice", ["orders"], 2 * 3600_000),
        ("", ["orders"], 60_000),
        ("a\nb", ["orders"], 60_000),
    ],
)
def test_bad_scoped_token_requests_are_400(subject: str, topics: list[str], ttl_ms: int) -> None:
    with pytest.raises(InvalidTokenRequestError) as info:
        ScopedTokenSigner(b"s" * 32).issue(subject, topics, 0, ttl_ms)
    assert info.value.http_status == 400


# --- JWT ----------------------------------------------------------------------------------

NOW_MS = 1_800_000_000_000
ISSUER = "https://idp.example"
AUDIENCE = "logbus"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(public: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if alg.startswith("RS") else ECAlgorithm
    d: dict[str, Any] = algorithm.to_jwk(public, as_dict=True)
    return {**d, "kid": kid, "alg": alg, "use": "sig"}


JWKS = {"keys": [jwk(RSA_KEY.public_key(), "r1", "RS256"), jwk(EC_KEY.public_key(), "e1", "ES256")]}
JWT = JwtValidator.from_jwks_json(orjson.dumps(JWKS), issuer=ISSUER, audience=AUDIENCE)


def claims(**over: Any) -> dict[str, Any]:
    base = {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": NOW_MS // 1000 + 300}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def sign(
    payload: dict[str, Any], key: Any = RSA_KEY, alg: str = "RS256", kid: str | None = "r1"
) -> str:
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def test_a_valid_jwt_names_its_subject() -> None:
    identity = JWT.validate(sign(claims()), NOW_MS)
    assert identity == Identity("alice", "jwt", None, None, NOW_MS + 300_000)
    assert JWT.validate(sign(claims(), EC_KEY, "ES256", "e1"), NOW_MS).user == "alice"
    assert JWT.validate(sign(claims(aud=["other", AUDIENCE])), NOW_MS).user == "alice"
    # within the leeway on either side
    assert JWT.validate(sign(claims(exp=NOW_MS // 1000 - 10)), NOW_MS).user == "alice"
    assert JWT.validate(sign(claims(nbf=NOW_MS // 1000 + 10)), NOW_MS).user == "alice"


@pytest.mark.parametrize(
    ("make", "error", "says"),
    [
        (lambda: sign(claims(exp=NOW_MS // 1000 - 31)), ExpiredCredentialsError, "expired"),
        (lambda: sign(claims(nbf=NOW_MS // 1000 + 60)), InvalidCredentialsError, "not valid yet"),
        (lambda: sign(claims(aud="someone-else")), InvalidCredentialsError, "audience"),
        (lambda: sign(claims(iss="https://evil.example")), InvalidCredentialsError, "issuer"),
        (lambda: sign(claims(exp=None)), InvalidCredentialsError, "'exp'"),
        (lambda: sign(claims(sub=None)), InvalidCredentialsError, "'sub'"),
        (lambda: sign(claims(aud=None)), InvalidCredentialsError, "'aud'"),
        (lambda: sign(claims(sub="")), InvalidCredentialsError, "subject"),
        (lambda: sign(claims(exp="soon")), InvalidCredentialsError, "JWT"),
        # forged: signed by another key under a known kid
        (lambda: sign(claims(), OTHER_RSA), InvalidCredentialsError, "signature"),
        (lambda: sign(claims(), kid="nope"), InvalidCredentialsError, "unknown key"),
        (lambda: sign(claims(), kid=None), InvalidCredentialsError, "unknown key"),
        # the EC key's kid with an RSA signature
        (lambda: sign(claims(), RSA_KEY, "RS256", "e1"), InvalidCredentialsError, "match"),
        (
            lambda: jwt.encode(claims(), "", algorithm="none"),
            InvalidCredentialsError,
            "algorithm",
        ),
        (lambda: sign(claims(big="x" * 9000)), MalformedCredentialsError, "8192"),
        (lambda: "eyJhbGciOiJSUzI1NiJ9.not-base64!.sig", MalformedCredentialsError, "not a JWT"),
        (lambda: "a.b", MalformedCredentialsError, "not a JWT"),
    ],
)
def test_bad_jwts_are_refused(make: Callable[[], str], error: type[Exception], says: str) -> None:
    with pytest.raises(error) as info:
        JWT.validate(make(), NOW_MS)
    assert says in str(info.value)


def test_algorithm_confusion_with_the_public_key_as_hmac_secret_fails() -> None:
    pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","kid":"r1","typ":"JWT"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(orjson.dumps(claims())).rstrip(b"=")
    signed = header + b"." + body
    mac = base64.urlsafe_b64encode(hmac.new(pem, signed, hashlib.sha256).digest()).rstrip(b"=")
    with pytest.raises(InvalidCredentialsError, match="algorithm"):
        JWT.validate((signed + b"." + mac).decode(), NOW_MS)
    with pytest.raises(ValueError, match="asymmetric"):
        JwtValidator(
            issuer=ISSUER,
            audience=AUDIENCE,
            jwks=jwt.PyJWKSet.from_dict(JWKS),
            algorithms=["HS256"],
        )


def test_jwks_file_loading(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(orjson.dumps(JWKS))
    validator = JwtValidator.from_jwks_file(path, issuer=ISSUER, audience=AUDIENCE)
    assert validator.validate(sign(claims()), NOW_MS).user == "alice"
    path.write_text("not json")
    with pytest.raises(ValueError, match="JWKS"):
        JwtValidator.from_jwks_file(path, issuer=ISSUER, audience=AUDIENCE)
    path.write_text('{"keys": []}')
    with pytest.raises(ValueError, match="JWKS"):
        JwtValidator.from_jwks_file(path, issuer=ISSUER, audience=AUDIENCE)
    path.write_bytes(b" " * (1 << 20) + b"{}")
    with pytest.raises(ValueError, match="JWKS over"):
        JwtValidator.from_jwks_file(path, issuer=ISSUER, audience=AUDIENCE)


# --- client certificates ----------------------------------------------------------------------

CERT = {
    "subject": (
        (("countryName", "US"),),
        (("organizationName", "Acme, Inc."),),
        (("organizationalUnitName", "eng"),),
        (("commonName", "alice"),),
    )
}


def test_certificate_subject_to_user() -> None:
    assert user_from_peercert(CERT) == r"CN=alice,OU=eng,O=Acme\, Inc.,C=US"
    assert user_from_peercert(CERT, rule="cn") == "alice"
    with pytest.raises(InvalidCredentialsError):
        user_from_peercert({})
    with pytest.raises(InvalidCredentialsError):
        user_from_peercert({"subject": ((("organizationName", "x"),),)}, rule="cn")


def test_www_authenticate_without_basic() -> None:
    assert www_authenticate(MissingCredentialsError("x"), basic=False) == 'Bearer realm="logbus"'
    assert www_authenticate(ExpiredCredentialsError("x"), "r", basic=False) == (
        'Bearer realm="r", error="invalid_token"'
    )
