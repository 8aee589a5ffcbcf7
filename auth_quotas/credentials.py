"""Credentials: API keys, HTTP ``Authorization`` headers, scoped tokens, JWTs, client certificates.

Theory of operation
-------------------
Every credential resolves to an :class:`Identity` (a ``User:<name>`` principal and how it was
proven) or raises an :class:`~auth_quotas.errors.AuthenticationError` (401). Nothing here does
I/O: stored keys are passed in (or looked up through a callable), clocks are ``now_ms``
arguments, randomness is injectable.

*API keys* are ``lbk.<key id>.<secret>``: 16 hex characters of id (the lookup key, stored in
the clear) and 256 random bits of secret (``secrets``), shown once. The store keeps only an
argon2id hash (argon2-cffi ``PasswordHasher``) of the whole token. With 256-bit secrets a slow
hash is defence in depth (a leaked store is useless), not brute-force resistance, so the
production cost is OWASP's argon2id minimum (m=19 MiB, t=2, p=1: ~0.12 s on the 2-core CI
machine; argon2-cffi's own default of 64 MiB x 3 took ~1 s there). Paying that per request
would cap a broker at a few requests per second, so :class:`ApiKeyVerifier` remembers verified
tokens in a bounded LRU keyed by a BLAKE2b digest of the presented token: a repeat costs one
hash of ~50 bytes and a dict lookup (~1 us). Revoking a key id evicts its entry
(:meth:`ApiKeyVerifier.invalidate`), and an entry older than a TTL (5 min) is re-verified in
case a revocation notice was missed. Failed verifications are not cached.

*Headers*: ``Bearer <token>`` (an API key, a scoped token or a JWT, told apart by prefix) and
``Basic base64(user:key)``, at most 8 KiB, parsed strictly (RFC 7235 token68, strict base64,
UTF-8) with a message that says what is wrong.

*Scoped tokens* let a browser's ``EventSource``/WebSocket (which cannot set headers) carry a
credential in the query string: ``lbt.<payload>.<HMAC-SHA256>``, the payload naming subject,
topics and expiry (minutes). They are signed with the cluster secret, compared in constant time,
and checked before the payload is parsed. Several secrets may verify (rotation).

*JWTs* are validated with PyJWT against a configured issuer, audience and JWKS: asymmetric
algorithms only (no ``none``, no HMAC: a public key must never be usable as an HMAC secret),
the key chosen by ``kid`` and required to match the header's algorithm, ``exp``/``iss``/``aud``/
``sub`` required, expiry checked against the injected clock with a leeway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import jwt
import orjson
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from .acl import PatternType, ResourceType, principal_for, validate_resource_name
from .errors import (
    AuthenticationError,
    ExpiredCredentialsError,
    InvalidAclError,
    InvalidCredentialsError,
    InvalidTokenRequestError,
    MalformedCredentialsError,
    MissingCredentialsError,
)
from .limits import (
    KEY_ID_BYTES,
    KEY_SECRET_BYTES,
    MAX_AUTHORIZATION_HEADER_BYTES,
    MAX_JWKS_BYTES,
    MAX_JWT_BYTES,
    MAX_PRINCIPAL_CHARS,
    MAX_SCOPED_TOKEN_BYTES,
    MAX_SCOPED_TOKEN_TOPICS,
    SCOPED_TOKEN_TTL_MS_DEFAULT,
    SCOPED_TOKEN_TTL_MS_MAX,
    VERIFIED_KEY_CACHE_ENTRIES,
    VERIFIED_KEY_CACHE_TTL_MS,
)

API_KEY_PREFIX: Final = "lbk"
SCOPED_TOKEN_PREFIX: Final = "lbt"
_API_KEY = re.compile(r"lbk\.([0-9a-f]{16})\.([A-Za-z0-9_-]{43})")
_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Method = Literal["api_key", "basic", "jwt", "scoped", "mtls", "internal"]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is: the principal and how it was proven. ``topics`` limits a scoped
    token (``None``: no limit beyond the ACLs); ``expires_ms`` is when the credential lapses
    (a long-lived WebSocket is closed then)."""

    user: str
    method: Method
    key_id: str | None = None
    topics: frozenset[str] | None = None
    expires_ms: int | None = None

    @property
    def principal(self) -> str:
        return principal_for(self.user)


# --- API keys ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewApiKey:
    """A freshly generated key: ``token`` is shown to the user once, ``key_id`` and the hash
    (:func:`hash_api_key`) are stored."""

    key_id: str
    token: str


def generate_api_key(token_bytes: Callable[[int], bytes] = secrets.token_bytes) -> NewApiKey:
    """A new ``lbk.<16 hex>.<43 base64url>`` key from ``token_bytes`` (``secrets`` by default;
    tests inject a seeded source)."""
    key_id = token_bytes(KEY_ID_BYTES).hex()
    secret = base64.urlsafe_b64encode(token_bytes(KEY_SECRET_BYTES)).rstrip(b"=").decode()
    return NewApiKey(key_id, f"{API_KEY_PREFIX}.{key_id}.{secret}")


def parse_api_key(token: str) -> str:
    """The key id of a well-formed API key; raises :class:`MalformedCredentialsError`."""
    m = _API_KEY.fullmatch(token)
    if m is None:
        raise MalformedCredentialsError("not an API key (expected lbk.<16 hex>.<43 base64url>)")
    return m.group(1)


def default_hasher() -> PasswordHasher:
    """Production argon2id cost (OWASP's minimum: 19 MiB, 2 passes, 1 lane; see module doc).
    Tests inject ``PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)``."""
    return PasswordHasher(time_cost=2, memory_cost=19_456, parallelism=1)


def hash_api_key(token: str, hasher: PasswordHasher) -> str:
    """The storage form of a key: a salted argon2id hash in PHC string format."""
    parse_api_key(token)
    return hasher.hash(token)


@dataclass(frozen=True, slots=True)
class StoredKey:
    """What the store keeps of a key. A revoked or deleted key is simply not found."""

    key_id: str
    user: str
    hash: str


@dataclass(slots=True)
class _Verified:
    key_id: str
    user: str
    verified_ms: int


def _digest(token: str) -> bytes:
    return hashlib.blake2b(token.encode(), digest_size=16).digest()


# Brute-force guard (:class:`KeyFailureLimiter`): this many failed secrets for one key id
# within the window, and that key id's un-cached presentations are refused without a hash
# until the window ends. An attacker who knows a key id (ids are not secret: listings show
# them) then costs 5 argon2 hashes a minute per id (~0.6 CPU-s), not a core per 8 guesses/s;
# an unknown id never costs a hash. The rightful holder's verified key stays cached and works.
KEY_FAILURES_MAX: Final = 5
KEY_FAILURES_WINDOW_MS: Final = 60_000
KEY_FAILURES_ENTRIES: Final = 10_000


class KeyFailureLimiter:
    """Failed API-key verifications per key id in fixed windows (sans-I/O, bounded: the least
    recently failed id is forgotten first)."""

    def __init__(
        self,
        max_failures: int = KEY_FAILURES_MAX,
        window_ms: int = KEY_FAILURES_WINDOW_MS,
        max_entries: int = KEY_FAILURES_ENTRIES,
    ) -> None:
        assert max_failures > 0 and window_ms > 0 and max_entries > 0
        self.max_failures = max_failures
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._failures: OrderedDict[str, tuple[int, int]] = OrderedDict()  # id -> (start, n)

    def __len__(self) -> int:
        return len(self._failures)

    def blocked(self, key_id: str, now_ms: int) -> bool:
        entry = self._failures.get(key_id)
        if entry is None:
            return False
        start, count = entry
        if now_ms - start >= self.window_ms:
            del self._failures[key_id]
            return False
        return count >= self.max_failures

    def failed(self, key_id: str, now_ms: int) -> None:
        entry = self._failures.pop(key_id, None)
        if entry is None or now_ms - entry[0] >= self.window_ms:
            entry = (now_ms, 0)
        self._failures[key_id] = (entry[0], entry[1] + 1)
        while len(self._failures) > self.max_entries:
            self._failures.popitem(last=False)

    def succeeded(self, key_id: str) -> None:
        self._failures.pop(key_id, None)


class ApiKeyVerifier:
    """Verifies API keys against stored hashes, remembering successes (see the module doc).

    Steps, so the async caller fetches the stored key and runs argon2 off the event loop:
    :meth:`cached` answers from memory or ``None``; :meth:`check` compares the hash (thread-
    safe, no cache access); :meth:`remember` caches the result. Capture :attr:`epoch` before
    reading the store and pass it to :meth:`remember`: a revocation that lands between the
    read and the hash check then cannot leave a stale entry behind. Cache methods are not
    thread-safe: call them on the event loop.

        identity = verifier.cached(token, now_ms)
        if identity is None:
            epoch = verifier.epoch
            stored = await store.api_key(parse_api_key(token))
            identity = await asyncio.to_thread(verifier.check, token, stored)
            verifier.remember(token, identity, now_ms, epoch=epoch)"""

    def __init__(
        self,
        hasher: PasswordHasher,
        *,
        max_entries: int = VERIFIED_KEY_CACHE_ENTRIES,
        ttl_ms: int = VERIFIED_KEY_CACHE_TTL_MS,
    ) -> None:
        assert max_entries > 0 and ttl_ms > 0
        self._hasher = hasher
        self._max_entries = max_entries
        self._ttl_ms = ttl_ms
        self._cache: OrderedDict[bytes, _Verified] = OrderedDict()
        self._by_key_id: dict[str, bytes] = {}
        self.epoch = 0

    def __len__(self) -> int:
        return len(self._cache)

    def cached(self, token: str, now_ms: int) -> Identity | None:
        """The identity of a token verified recently, or ``None`` (then verify it)."""
        digest = _digest(token)
        hit = self._cache.get(digest)
        if hit is None:
            return None
        if now_ms - hit.verified_ms >= self._ttl_ms:
            self._evict(digest)
            return None
        self._cache.move_to_end(digest)
        return Identity(hit.user, "api_key", hit.key_id)

    def check(self, token: str, stored: StoredKey | None) -> Identity:
        """Check ``token`` against its stored hash (``None``: unknown or revoked key) without
        touching the cache, so it may run in a worker thread (argon2 takes ~0.1 s).

        Raises :class:`MalformedCredentialsError` or :class:`InvalidCredentialsError`; the
        message never says whether the key id exists."""
        key_id = parse_api_key(token)
        if stored is None or stored.key_id != key_id:
            raise InvalidCredentialsError("unknown or revoked API key")
        try:
            self._hasher.verify(stored.hash, token)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            raise InvalidCredentialsError("unknown or revoked API key") from None
        return Identity(stored.user, "api_key", key_id)

    def remember(self, token: str, identity: Identity, now_ms: int, *, epoch: int) -> None:
        """Cache a verification :meth:`check` made, unless a revocation happened since
        ``epoch`` (read before the store was asked) — on the event loop, not in a thread."""
        if epoch == self.epoch and identity.key_id is not None:
            self._remember(_digest(token), _Verified(identity.key_id, identity.user, now_ms))

    def verify_stored(
        self, token: str, stored: StoredKey | None, now_ms: int, *, epoch: int | None = None
    ) -> Identity:
        """:meth:`check` then :meth:`remember` (``epoch`` ``None``: the current one)."""
        identity = self.check(token, stored)
        self.remember(token, identity, now_ms, epoch=self.epoch if epoch is None else epoch)
        return identity

    def verify(
        self, token: str, lookup: Callable[[str], StoredKey | None], now_ms: int
    ) -> Identity:
        """:meth:`cached`, else look the key id up and :meth:`verify_stored` (synchronous)."""
        hit = self.cached(token, now_ms)
        if hit is not None:
            return hit
        epoch = self.epoch
        return self.verify_stored(token, lookup(parse_api_key(token)), now_ms, epoch=epoch)

    def invalidate(self, key_id: str) -> None:
        """Forget a key id (revoked, deleted, or its user deleted)."""
        self.epoch += 1
        digest = self._by_key_id.get(key_id)
        if digest is not None:
            self._evict(digest)

    def invalidate_user(self, user: str) -> None:
        self.epoch += 1
        for digest in [d for d, v in self._cache.items() if v.user == user]:
            self._evict(digest)

    def clear(self) -> None:
        self.epoch += 1
        self._cache.clear()
        self._by_key_id.clear()

    def _remember(self, digest: bytes, entry: _Verified) -> None:
        old = self._by_key_id.get(entry.key_id)
        if old is not None and old != digest:
            self._evict(old)
        self._cache[digest] = entry
        self._cache.move_to_end(digest)
        self._by_key_id[entry.key_id] = digest
        while len(self._cache) > self._max_entries:
            self._evict(next(iter(self._cache)))

    def _evict(self, digest: bytes) -> None:
        entry = self._cache.pop(digest, None)
        if entry is not None and self._by_key_id.get(entry.key_id) == digest:
            del self._by_key_id[entry.key_id]


# --- the Authorization header ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BearerCredentials:
    token: str

    @property
    def kind(self) -> Literal["api_key", "scoped", "jwt"]:
        """Which verifier takes the token, by prefix (a JWT starts ``eyJ``: base64 of ``{"``)."""
        if self.token.startswith(API_KEY_PREFIX + "."):
            return "api_key"
        if self.token.startswith(SCOPED_TOKEN_PREFIX + "."):
            return "scoped"
        return "jwt"


@dataclass(frozen=True, slots=True)
class BasicCredentials:
    user: str
    password: str = ""

    def __repr__(self) -> str:  # never print the key
        return f"BasicCredentials(user={self.user!r}, password=<{len(self.password)} chars>)"


def parse_authorization(value: str | bytes | None) -> BearerCredentials | BasicCredentials:
    """Parse an ``Authorization`` header value (``None`` or empty: no header).

    Raises :class:`MissingCredentialsError` or :class:`MalformedCredentialsError` with a reason
    a client can act on. The scheme is case-insensitive (RFC 7235)."""
    if value is None or value in ("", b""):
        raise MissingCredentialsError("no credentials: send Authorization: Bearer <key>")
    if len(value) > MAX_AUTHORIZATION_HEADER_BYTES:
        raise MalformedCredentialsError(
            f"Authorization header over {MAX_AUTHORIZATION_HEADER_BYTES} bytes"
        )
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise MalformedCredentialsError("Authorization header is not ASCII") from None
    scheme, _, rest = value.strip().partition(" ")
    credentials = rest.strip()
    if not credentials:
        raise MalformedCredentialsError(f"{scheme or 'Authorization'}: credentials missing")
    if not _TOKEN68.fullmatch(credentials):
        raise MalformedCredentialsError("credentials contain characters a token cannot hold")
    scheme = scheme.lower()
    if scheme == "bearer":
        return BearerCredentials(credentials)
    if scheme == "basic":
        return _parse_basic(credentials)
    raise MalformedCredentialsError("unsupported authorization scheme; use Bearer or Basic")


def _parse_basic(encoded: str) -> BasicCredentials:
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise MalformedCredentialsError("Basic: not base64 of UTF-8 'user:key'") from None
    user, sep, password = decoded.partition(":")
    if not sep or not user or not password:
        raise MalformedCredentialsError("Basic: expected 'user:key' with both parts")
    if _CONTROL.search(decoded):
        raise MalformedCredentialsError("Basic: control characters in user or key")
    return BasicCredentials(user, password)


def verify_basic(
    credentials: BasicCredentials,
    verifier: ApiKeyVerifier,
    lookup: Callable[[str], StoredKey | None],
    now_ms: int,
) -> Identity:
    """Basic ``user:key``: the key must verify *and* belong to ``user``."""
    identity = verifier.verify(credentials.password, lookup, now_ms)
    if identity.user != credentials.user:
        raise InvalidCredentialsError("unknown or revoked API key")
    return Identity(identity.user, "basic", identity.key_id)


# --- scoped tokens -----------------------------------------------------------------------------


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64d(text: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise binascii.Error("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class ScopedToken:
    subject: str
    topics: frozenset[str]
    expires_ms: int

    def allows(self, topic: str) -> bool:
        return topic in self.topics

    def identity(self) -> Identity:
        return Identity(self.subject, "scoped", None, self.topics, self.expires_ms)


class ScopedTokenSigner:
    """Issues and verifies ``lbt.`` tokens with HMAC-SHA256 over a cluster secret.

    ``secret`` signs; it and each of ``previous`` verify, so a secret can be rotated without
    invalidating tokens minutes old. Secrets are at least 32 bytes (the HMAC-SHA256 key size
    that gives full strength)."""

    def __init__(self, secret: bytes, previous: Sequence[bytes] = ()) -> None:
        for s in (secret, *previous):
            if len(s) < 32:
                raise ValueError("a scoped-token secret must be at least 32 bytes")
        self._secret = secret
        self._verifying = (secret, *previous)

    def _sign(self, key: bytes, signed: bytes) -> bytes:
        return hmac.new(key, signed, hashlib.sha256).digest()

    def issue(
        self,
        subject: str,
        topics: Iterable[str],
        now_ms: int,
        ttl_ms: int = SCOPED_TOKEN_TTL_MS_DEFAULT,
    ) -> str:
        """A token for ``subject`` (a user name) limited to ``topics`` for ``ttl_ms``.

        Raises :class:`InvalidTokenRequestError` (400) for bad topics or lifetime."""
        topic_set = sorted(set(topics))
        if not topic_set or len(topic_set) > MAX_SCOPED_TOKEN_TOPICS:
            raise InvalidTokenRequestError(f"topics: 1..{MAX_SCOPED_TOKEN_TOPICS} topic names")
        for topic in topic_set:
            try:
                validate_resource_name(ResourceType.TOPIC, topic, PatternType.LITERAL)
            except InvalidAclError as e:
                raise InvalidTokenRequestError(f"topics: {e.message}") from None
            if topic == "*":
                raise InvalidTokenRequestError("topics: name topics, not '*'")
        if not 0 < ttl_ms <= SCOPED_TOKEN_TTL_MS_MAX:
            raise InvalidTokenRequestError(f"ttl: 1..{SCOPED_TOKEN_TTL_MS_MAX} ms")
        _check_subject(subject, InvalidTokenRequestError)
        body = {"v": 1, "sub": subject, "topics": topic_set, "exp": now_ms + ttl_ms}
        signed = f"{SCOPED_TOKEN_PREFIX}.{_b64e(orjson.dumps(body))}"
        token = f"{signed}.{_b64e(self._sign(self._secret, signed.encode()))}"
        if len(token) > MAX_SCOPED_TOKEN_BYTES:
            raise InvalidTokenRequestError("topics: too many or too long for one token")
        return token

    def verify(self, token: str, now_ms: int) -> ScopedToken:
        """The scope of a genuine, unexpired token; raises an :class:`AuthenticationError`."""
        if len(token) > MAX_SCOPED_TOKEN_BYTES:
            raise MalformedCredentialsError("scoped token too long")
        prefix, _, rest = token.partition(".")
        payload_b64, _, signature_b64 = rest.partition(".")
        if prefix != SCOPED_TOKEN_PREFIX or not payload_b64 or not signature_b64:
            raise MalformedCredentialsError("not a scoped token (lbt.<payload>.<signature>)")
        try:
            signature = _b64d(signature_b64)
        except (binascii.Error, ValueError):
            raise MalformedCredentialsError("scoped token signature is not base64url") from None
        signed = f"{prefix}.{payload_b64}".encode()
        genuine = False
        for key in self._verifying:  # every key, so timing does not tell which one matched
            genuine |= hmac.compare_digest(self._sign(key, signed), signature)
        if not genuine:
            raise InvalidCredentialsError("scoped token signature does not verify")
        try:
            body = orjson.loads(_b64d(payload_b64))
        except (binascii.Error, ValueError):
            body = None
        if not _is_scope(body):
            # signed by us, so only a version skew can get here
            raise MalformedCredentialsError("scoped token payload not understood")
        subject, topics, expires_ms = body["sub"], body["topics"], body["exp"]
        if now_ms >= expires_ms:
            raise ExpiredCredentialsError("scoped token expired")
        return ScopedToken(subject, frozenset(topics), expires_ms)


def _is_scope(body: Any) -> bool:
    return (
        isinstance(body, dict)
        and body.get("v") == 1
        and isinstance(body.get("sub"), str)
        and isinstance(body.get("exp"), int)
        and isinstance(body.get("topics"), list)
        and all(isinstance(t, str) for t in body["topics"])
    )


def _check_subject(subject: object, error: type[Exception]) -> str:
    if (
        not isinstance(subject, str)
        or not subject
        or len(subject) > MAX_PRINCIPAL_CHARS - len("User:")
        or _CONTROL.search(subject)
    ):
        raise error(f"subject: 1..{MAX_PRINCIPAL_CHARS - 5} characters without controls")
    return subject


# --- JWT -----------------------------------------------------------------------------------

# Asymmetric only: with an HMAC algorithm allowed, a public key from the JWKS could be used as
# the shared secret to forge tokens (the classic algorithm-confusion attack).
JWT_ALGORITHMS_DEFAULT: Final = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")


class JwtValidator:
    """Validates bearer JWTs from an external identity provider.

    ``issuer`` and ``audience`` must match exactly; ``jwks`` holds the provider's public keys
    (PyJWKSet, from the JWKS file the operator configures). The principal is
    ``User:<claim>`` (``sub`` by default). ``leeway_ms`` absorbs clock skew on ``exp``/``nbf``."""

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        jwks: jwt.PyJWKSet,
        algorithms: Sequence[str] = JWT_ALGORITHMS_DEFAULT,
        principal_claim: str = "sub",
        leeway_ms: int = 30_000,
        max_token_bytes: int = MAX_JWT_BYTES,
    ) -> None:
        bad = [a for a in algorithms if a.upper().startswith("HS") or a.lower() == "none"]
        if bad:
            raise ValueError(f"JWT algorithms must be asymmetric; refused: {bad}")
        self.issuer = issuer
        self.audience = audience
        self._keys = list(jwks.keys)
        self._algorithms = frozenset(algorithms)
        self._claim = principal_claim
        self._leeway_ms = leeway_ms
        self._max_bytes = max_token_bytes

    @classmethod
    def from_jwks_json(cls, text: str | bytes, **kwargs: Any) -> JwtValidator:
        if len(text) > MAX_JWKS_BYTES:
            raise ValueError(f"JWKS over {MAX_JWKS_BYTES} bytes")
        try:
            jwks = jwt.PyJWKSet.from_dict(orjson.loads(text))
        except (orjson.JSONDecodeError, jwt.PyJWTError, TypeError, AttributeError) as e:
            raise ValueError(f"not a usable JWKS: {e}") from None
        return cls(jwks=jwks, **kwargs)

    @classmethod
    def from_jwks_file(cls, path: str | Path, **kwargs: Any) -> JwtValidator:
        """Read the operator's JWKS file (at startup; raises ``ValueError``/``OSError``)."""
        with open(path, "rb") as f:
            text = f.read(MAX_JWKS_BYTES + 1)
        return cls.from_jwks_json(text, **kwargs)

    def _key_for(self, header: Mapping[str, Any]) -> jwt.PyJWK:
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise InvalidCredentialsError("JWT algorithm not accepted")
        kid = header.get("kid")
        if kid is None:
            candidates = self._keys if len(self._keys) == 1 else []
        else:
            candidates = [k for k in self._keys if k.key_id == kid]
        if not candidates:
            raise InvalidCredentialsError("JWT signed by an unknown key")
        key = candidates[0]
        if key.algorithm_name != alg:
            raise InvalidCredentialsError("JWT algorithm does not match its key")
        return key

    def validate(self, token: str, now_ms: int) -> Identity:
        """The identity a genuine, current JWT names; raises an :class:`AuthenticationError`."""
        if len(token) > self._max_bytes:
            raise MalformedCredentialsError(f"JWT over {self._max_bytes} bytes")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise MalformedCredentialsError("not a JWT") from None
        key = self._key_for(header)
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.issuer,
                options={
                    "verify_exp": False,  # checked below against the injected clock
                    "verify_nbf": False,
                    "verify_iat": False,
                    "require": ["exp", "iss", "aud", self._claim],
                    "strict_aud": False,
                },
            )
        except jwt.InvalidAudienceError:
            raise InvalidCredentialsError("JWT audience is not this service") from None
        except jwt.InvalidIssuerError:
            raise InvalidCredentialsError("JWT issuer is not the configured one") from None
        except jwt.MissingRequiredClaimError as e:
            raise InvalidCredentialsError(f"JWT lacks the {e.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise InvalidCredentialsError("JWT signature does not verify") from None
        except jwt.PyJWTError:
            raise InvalidCredentialsError("JWT not valid") from None
        return self._check_times(claims, now_ms)

    def _check_times(self, claims: Mapping[str, Any], now_ms: int) -> Identity:
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            raise InvalidCredentialsError("JWT 'exp' is not a number")
        if now_ms - self._leeway_ms >= exp * 1000:
            raise ExpiredCredentialsError("JWT expired")
        if nbf is not None:
            if isinstance(nbf, bool) or not isinstance(nbf, int | float):
                raise InvalidCredentialsError("JWT 'nbf' is not a number")
            if now_ms + self._leeway_ms < nbf * 1000:
                raise InvalidCredentialsError("JWT not valid yet")
        subject = _check_subject(claims[self._claim], InvalidCredentialsError)
        return Identity(subject, "jwt", None, None, int(exp * 1000))


# --- client certificates (mTLS) ------------------------------------------------------------

_DN_SPECIAL = re.compile(r'([,+"\\<>;=])')
_DN_NAMES: Final = {
    "commonName": "CN",
    "organizationalUnitName": "OU",
    "organizationName": "O",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "countryName": "C",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
}


def _dn_value(value: str) -> str:
    escaped = _DN_SPECIAL.sub(r"\\\1", value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped


# Where the server puts a request's verified client-certificate user in its ASGI scope.
PEER_USER_SCOPE_KEY = "logbus.peer_user"


def user_from_peercert(cert: Mapping[str, Any], rule: Literal["dn", "cn"] = "dn") -> str:
    """The user name of a verified client certificate (``ssl.SSLSocket.getpeercert()``).

    ``dn`` is Kafka's default mapping (``ssl.principal.mapping.rules=DEFAULT``): the subject's
    RFC 4514 distinguished name, most specific part first (``CN=alice,OU=eng,O=corp``); ``cn``
    takes the common name alone. Raises :class:`InvalidCredentialsError` without a subject."""
    subject = cert.get("subject") or ()
    rdns: list[str] = []
    common_name = None
    for rdn in subject:
        parts = []
        for name, value in rdn:
            if name == "commonName" and common_name is None:
                common_name = value
            parts.append(f"{_DN_NAMES.get(name, name)}={_dn_value(value)}")
        rdns.append("+".join(parts))
    user = common_name if rule == "cn" else ",".join(reversed(rdns))
    if not user:
        raise InvalidCredentialsError("client certificate has no usable subject")
    return _check_subject(user, InvalidCredentialsError)


__all__ = [
    "API_KEY_PREFIX",
    "JWT_ALGORITHMS_DEFAULT",
    "PEER_USER_SCOPE_KEY",
    "SCOPED_TOKEN_PREFIX",
    "ApiKeyVerifier",
    "AuthenticationError",
    "BasicCredentials",
    "BearerCredentials",
    "Identity",
    "JwtValidator",
    "KeyFailureLimiter",
    "NewApiKey",
    "ScopedToken",
    "ScopedTokenSigner",
    "StoredKey",
    "default_hasher",
    "generate_api_key",
    "hash_api_key",
    "parse_api_key",
    "parse_authorization",
    "user_from_peercert",
    "verify_basic",
]
