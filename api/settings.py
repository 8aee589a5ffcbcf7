"""Broker settings: command-line flags override ``LOGBUS_*`` environment variables."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import PositiveInt, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core_log.limits import DEFAULT_MAX_BROKER_PARTITIONS

from .access_log import parse_rate

# A list setting from the environment: comma-separated (or a JSON array).
NameList = Annotated[list[str], NoDecode]
# Kafka's super.users syntax: semicolon-separated principals (or a JSON array).
SemicolonList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOGBUS_")

    data_dir: Path = Path("./logbus-data")
    host: str = "127.0.0.1"
    port: int = 8080
    broker_id: int = 1
    rack: str | None = None
    metadata_url: str | None = None  # default: sqlite:///{data_dir}/metadata.db
    # -- the replicated cluster (docs/operations.md); Kafka's names and defaults --------------
    advertised_url: str | None = None  # how clients and peers reach this broker
    replication_port: int = 0  # the h2c replication listener; 0 = ephemeral, advertised
    # The replication port peers are told to use when it differs from the bound one (a proxy
    # or NAT in front of it; the chaos tests route followers through a TCP proxy); 0 = bound.
    replication_advertised_port: int = 0
    broker_heartbeat_interval_ms: int = 2_000  # lease renewal (KRaft's default)
    broker_session_timeout_ms: int = 9_000  # lease length: a silent broker is fenced after it
    replica_lag_time_max_ms: int = 30_000  # a follower not caught up this long leaves the ISR
    replica_fetch_wait_max_ms: int = 500  # a follower's long-poll
    replica_fetch_max_bytes: int = 1_048_576  # per partition per fetch
    replica_fetch_response_max_bytes: int = 10_485_760  # per fetch
    replica_socket_timeout_ms: int = 30_000  # a replica fetch with no answer is retried
    metadata_refresh_interval_ms: int = 200  # how often a broker looks for metadata changes
    default_replication_factor: int = 1
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_seconds: int = 300
    request_timeout_ms: int = 30_000  # how long acks=all waits for the ISR (Kafka's timeout)
    insecure: bool = False  # allow a non-loopback bind without authentication
    # -- authentication and authorization (docs/security.md; Kafka's names where they exist) --
    # Off: every request is User:ANONYMOUS and allowed (a loopback broker on a desktop).
    auth: bool = False
    # The first admin's API key for automation (lbk.<16 hex>.<43 base64url>; `logbus keys`
    # format). Used only when auth is on and the store has no user yet.
    bootstrap_key: str | None = None
    # The same read from a file (a Docker or Kubernetes secret); bootstrap_key wins.
    bootstrap_key_file: Path | None = None
    # Kafka's super.users: principals allowed everything, "User:a;User:b".
    super_users: SemicolonList = []
    # Kafka's allow.everyone.if.no.acl.found: a resource no ACL names is open to everyone.
    allow_everyone_if_no_acl_found: bool = False
    # Bearer JWTs from an identity provider: all three or none.
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_jwks_file: Path | None = None
    # TLS on the client listener (docs/security.md): a PEM certificate chain and its key. With
    # ssl_cafile, Kafka's ssl.client.auth: "requested" asks for a client certificate signed by
    # that CA and "required" refuses a connection without one (mTLS); a verified certificate's
    # subject is the request's principal when it sends no other credential, mapped as Kafka's
    # ssl.principal.mapping.rules DEFAULT ("dn": CN=alice,OU=eng,O=corp) or the CN alone.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_cafile: Path | None = None
    ssl_client_auth: Literal["none", "requested", "required"] = "none"
    ssl_principal_mapping: Literal["dn", "cn"] = "dn"
    # Scoped tokens (POST /v1/tokens): the lifetime when the request names none, and the most.
    token_ttl_minutes: int = 5
    # Browsers (api/guard.py, docs/security.md): Host names besides the bound ones (loopback
    # names for a loopback bind; "*" = any), and origins of web pages allowed to call the
    # broker cross-origin, with CORS (none: same-origin only; "*" = any page).
    allowed_hosts: NameList = []
    allowed_origins: NameList = []

    # Limits (every body, list and wait has one).
    max_request_bytes: int = 64 * 1024 * 1024
    max_records_per_request: int = 100_000
    max_fetch_bytes: int = 64 * 1024 * 1024
    default_fetch_bytes: int = 1024 * 1024
    max_fetch_records: int = 100_000
    default_fetch_records: int = 10_000
    max_wait_ms: int = 60_000
    max_open_handles: int = 1024
    retention_check_interval_ms: int = 300_000
    log_cleaner_backoff_ms: int = 15_000  # Kafka's log.cleaner.backoff.ms: compaction cadence
    # The loop-lag probe's timer (api.loop_lag); 0 turns it off. 100 wake-ups a second cost
    # ~1 % of a core on the 2-core VM.
    loop_lag_interval_ms: int = 10
    idempotency_window_ms: int = 86_400_000  # how long an Idempotency-Key is remembered
    offsets_topic_partitions: int = 4  # __consumer_offsets, fixed when the topic is created
    offsets_retention_ms: int = 7 * 86_400_000  # offsets of a group empty this long expire
    # __transaction_state (cluster.txn_coordinator): partitions fixed at creation (Kafka: 50;
    # 4 like the offsets topic, each partition is a log and a replica to fetch), Kafka's
    # transaction.max.timeout.ms, transactional.id.expiration.ms and the abort task's interval.
    transaction_state_log_num_partitions: int = 4
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 86_400_000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    max_ws_message_bytes: int = 8 * 1024 * 1024  # a client's WebSocket message (produce)
    # permessage-deflate costs 2.3-2.7x the CPU of binary push and gains nothing on a LAN;
    # browsers offer it always, so it is off unless asked for.
    ws_compression: bool = False

    # Connections, bodies and answers in flight (api/connections.py, api/budgets.py): a flood
    # of idle sockets, slow uploads or clients that never read costs bounded memory and time.
    # max_connections (Kafka: max.connections): past it the longest-idle connection is
    # closed; clamped below the process's open-file limit at start.
    max_connections: PositiveInt = 10_000
    header_timeout_ms: PositiveInt = 10_000  # a request head must arrive whole within this
    keep_alive_timeout_ms: PositiveInt = 5_000  # an idle keep-alive connection closes after
    body_timeout_ms: PositiveInt = 30_000  # no request-body bytes for this long: 408, closed
    send_timeout_ms: PositiveInt = 30_000  # a client taking no answer bytes this long: closed
    max_inflight_body_bytes: PositiveInt = 256 * 1024 * 1024  # bodies being read, all clients
    max_inflight_response_bytes: PositiveInt = 256 * 1024 * 1024  # produce/fetch answers sent
    max_queued_stream_bytes: PositiveInt = 128 * 1024 * 1024  # WebSocket/SSE reads being pushed

    # Client quotas (api/quota_state.py, docs/security.md#quotas), Kafka's names and defaults:
    # rates are measured over quota.window.num samples of quota.window.size.seconds.
    quota_window_num: PositiveInt = 11
    quota_window_size_seconds: PositiveInt = 1
    # The longest a throttled request is held; 0: one measurement span (11 s by default).
    quota_max_throttle_ms: int = 0
    # Sensors (measured clients) kept per broker; past it the least recently used are dropped.
    quota_max_sensors: PositiveInt = 10_000

    fast_path: bool = True  # serve produce/fetch from the lean ASGI route
    # Partitions on this broker, internal topics included (core_log.limits has the reason).
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS
    # One line per request (api.access_log): off, on, or a sample rate in [0, 1].
    access_log: str = "off"

    @field_validator("access_log")
    @classmethod
    def _access_log_rate(cls, value: str) -> str:
        parse_rate(value)
        return value

    @property
    def access_log_rate(self) -> float:
        return parse_rate(self.access_log)

    @model_validator(mode="after")
    def _budgets_fit_one_request(self) -> Settings:
        """Each budget admits at least one request of the largest size a client may send."""
        if self.max_inflight_body_bytes < self.max_request_bytes:
            raise ValueError("max_inflight_body_bytes must be >= max_request_bytes")
        if self.max_inflight_response_bytes < self.max_fetch_bytes:
            raise ValueError("max_inflight_response_bytes must be >= max_fetch_bytes")
        return self

    @field_validator("super_users", mode="before")
    @classmethod
    def _split_principals(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(";") if part.strip()]
        return value

    @field_validator("super_users")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        from auth_quotas.acl import validate_principal
        from auth_quotas.errors import InvalidAclError

        for principal in value:
            try:
                validate_principal(principal)
            except InvalidAclError as e:
                raise ValueError(f"super_users: {e.message}") from None
        return value

    @field_validator("bootstrap_key")
    @classmethod
    def _bootstrap_key(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        from auth_quotas.credentials import parse_api_key
        from auth_quotas.errors import AuthenticationError

        try:
            parse_api_key(value.strip())
        except AuthenticationError:
            raise ValueError(
                "bootstrap_key: expected an API key lbk.<16 hex>.<43 base64url>"
            ) from None
        return value.strip()

    @field_validator("token_ttl_minutes")
    @classmethod
    def _token_ttl(cls, value: int) -> int:
        if not 1 <= value <= 60:
            raise ValueError("token_ttl_minutes: 1..60 (a scoped token lives minutes)")
        return value

    @model_validator(mode="after")
    def _jwt_all_or_none(self) -> Settings:
        given = [self.jwt_issuer, self.jwt_audience, self.jwt_jwks_file]
        if any(v is not None for v in given) and not all(v is not None for v in given):
            raise ValueError("jwt_issuer, jwt_audience and jwt_jwks_file go together")
        return self

    @model_validator(mode="after")
    def _bootstrap_key_from_file(self) -> Settings:
        if self.bootstrap_key is None and self.bootstrap_key_file is not None:
            try:
                text = self.bootstrap_key_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"bootstrap_key_file: cannot read it: {e}") from None
            self.bootstrap_key = Settings._bootstrap_key(text)
        return self

    @model_validator(mode="after")
    def _tls_consistent(self) -> Settings:
        if self.ssl_certfile is None and (self.ssl_keyfile or self.ssl_cafile):
            raise ValueError("ssl_keyfile and ssl_cafile need ssl_certfile (TLS)")
        if self.ssl_client_auth != "none" and self.ssl_cafile is None:
            raise ValueError(
                "ssl_client_auth needs ssl_cafile (the CA that signs client certificates)"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
