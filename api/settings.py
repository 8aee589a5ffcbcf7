"""Broker settings: command-line flags override ``LOGBUS_*`` environment variables."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core_log.limits import DEFAULT_MAX_BROKER_PARTITIONS

from .access_log import parse_rate


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOGBUS_")

    data_dir: Path = Path("./logbus-data")
    host: str = "127.0.0.1"
    port: int = 8080
    broker_id: int = 1
    rack: str | None = None
    metadata_url: str | None = None  # default: sqlite:///{data_dir}/metadata.db
    insecure: bool = False  # allow a non-loopback bind without authentication

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
    idempotency_window_ms: int = 86_400_000  # how long an Idempotency-Key is remembered
    offsets_topic_partitions: int = 4  # __consumer_offsets, fixed when the topic is created
    offsets_retention_ms: int = 7 * 86_400_000  # offsets of a group empty this long expire
    max_ws_message_bytes: int = 8 * 1024 * 1024  # a client's WebSocket message (produce)
    # permessage-deflate costs 2.3-2.7x the CPU of binary push and gains nothing on a LAN;
    # browsers offer it always, so it is off unless asked for.
    ws_compression: bool = False

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

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
