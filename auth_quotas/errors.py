"""The errors of ``auth_quotas``, each a :class:`core_log.errors.LogbusError` with its HTTP status.

    LogbusError
    ├── AuthenticationError        SASL_AUTHENTICATION_FAILED   401  (+ WWW-Authenticate)
    │   ├── MissingCredentialsError        (no Authorization header / token at all)
    │   ├── MalformedCredentialsError      (a header or token that does not parse, or too big)
    │   ├── InvalidCredentialsError        (parses, but unknown key, bad secret, bad signature)
    │   └── ExpiredCredentialsError        (a JWT or scoped token past its expiry)
    ├── InvalidAclError            INVALID_REQUEST              400
    ├── InvalidTokenRequestError   INVALID_REQUEST              400  (a scoped token asked badly)
    ├── InvalidQuotaError          INVALID_CONFIG               400
    └── ThrottlingQuotaExceededError THROTTLING_QUOTA_EXCEEDED  429  (carries throttle_time_ms)

Authorization failures are plain ``LogbusError``s with Kafka's TOPIC_/GROUP_/CLUSTER_/
TRANSACTIONAL_ID_AUTHORIZATION_FAILED codes (403), built by ``acl.authorization_error``; the
route decides whether to raise one or answer as if the resource were missing.
Messages of authentication errors name what was wrong with the input, never a secret.
"""

from __future__ import annotations

from typing import Any

from core_log.errors import ErrorCode, LogbusError


class AuthenticationError(LogbusError):
    """A missing or bad credential: the API answers 401 with ``WWW-Authenticate``.

    ``reason`` is a short stable word (``missing``, ``malformed``, ``invalid``, ``expired``)
    for metrics and for the bearer challenge's ``error`` parameter (RFC 6750 §3.1)."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED
    reason = "invalid"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message, reason=self.reason, **detail)


class MissingCredentialsError(AuthenticationError):
    reason = "missing"


class MalformedCredentialsError(AuthenticationError):
    reason = "malformed"


class InvalidCredentialsError(AuthenticationError):
    reason = "invalid"


class ExpiredCredentialsError(AuthenticationError):
    reason = "expired"


class InvalidAclError(LogbusError):
    """An ACL that cannot be stored: unknown enum value, bad name or principal."""

    code = ErrorCode.INVALID_REQUEST


class InvalidTokenRequestError(LogbusError):
    """A request for a scoped token with bad topics or lifetime."""

    code = ErrorCode.INVALID_REQUEST


class InvalidQuotaError(LogbusError):
    """A quota entity or value that cannot be stored (unknown key, negative rate)."""

    code = ErrorCode.INVALID_CONFIG


class ThrottlingQuotaExceededError(LogbusError):
    """KIP-599: a mutation refused because the entity's token bucket is empty; retry after
    ``throttle_time_ms``."""

    code = ErrorCode.THROTTLING_QUOTA_EXCEEDED

    def __init__(self, throttle_time_ms: int) -> None:
        super().__init__(
            f"controller mutation quota exceeded; retry in {throttle_time_ms} ms",
            throttle_time_ms=throttle_time_ms,
        )
        self.throttle_time_ms = throttle_time_ms


def www_authenticate(
    error: AuthenticationError, realm: str = "logbus", *, basic: bool = True
) -> str:
    """The ``WWW-Authenticate`` value for a 401: a Bearer challenge (RFC 6750) naming the error
    when a credential was presented, and (``basic``) a Basic challenge (RFC 7617) for tools
    that speak only Basic. A missing credential gets no ``error`` parameter (RFC 6750 §3.1).
    A browser answers a Basic challenge with a login prompt on navigation; pass
    ``basic=False`` where that is unwanted."""
    bearer = f'Bearer realm="{realm}"'
    if not isinstance(error, MissingCredentialsError):
        kind = (
            "invalid_request" if isinstance(error, MalformedCredentialsError) else "invalid_token"
        )
        bearer += f', error="{kind}"'
    return f'{bearer}, Basic realm="{realm}", charset="UTF-8"' if basic else bearer
