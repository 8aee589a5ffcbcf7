"""Schemathesis, every check, against a real broker: the OpenAPI document is what it does.

Examples are bounded (``MAX_EXAMPLES`` per operation, the examples and coverage phases plus a
short fuzz) so the module runs in well under a minute. Two things are held down on purpose:

* partition counts in topic creation and increase (``MAX_TEST_PARTITIONS``): creating 10,000
  partitions is a cost test of its own (admin), not a conformance question;
* schema-valid requests may meet the broker's state — 404 for a topic that does not exist,
  409 for one that does, 413 over a limit, 416 for an offset past the log — which the
  positive-data check accepts; a 400 for a schema-valid request is a finding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from api.app import create_fastapi  # noqa: E402
from api.settings import Settings  # noqa: E402
from auth_quotas.credentials import generate_api_key  # noqa: E402
from tests.api.conftest import start_broker  # noqa: E402
from tests.server import BrokerProcess  # noqa: E402

MAX_EXAMPLES = 8
MAX_TEST_PARTITIONS = 4
REQUEST_TIMEOUT_S = 30
# Schema-valid, refused by the broker's state (no such topic, exists already, over a limit,
# past the log) or by content negotiation (an Accept it cannot answer).
STATE_STATUSES = ["2xx", "404", "406", "409", "413", "416"]


# The document declares bearer/basic security, so the broker runs with --auth and every case
# carries a super user's key (schemathesis's own check sends a bad one and expects 401).
ADMIN_KEY = generate_api_key().token


@pytest.fixture(scope="module")
def conformance_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    env = {
        "LOGBUS_AUTH": "true",
        "LOGBUS_BOOTSTRAP_KEY": ADMIN_KEY,
        "LOGBUS_SUPER_USERS": "User:admin",  # whatever ACLs the fuzzer removes
    }
    b = start_broker(tmp_path_factory.mktemp("schemathesis") / "data", env=env)
    try:
        yield b
    finally:
        b.stop()


@schemathesis.serializer("application/x-ndjson", "application/vnd.logbus.batch")
def _as_bytes(_: Any, value: Any) -> bytes:
    """Both are documented as a string body: send it as it is."""
    return value if isinstance(value, bytes) else str(value).encode()


schema = schemathesis.openapi.from_dict(
    create_fastapi(Settings()).openapi(),  # what /openapi.json serves, without a broker
    config=SchemathesisConfig.from_dict(
        {
            "checks": {"positive_data_acceptance": {"expected-statuses": STATE_STATUSES}},
            "operations": [
                {
                    # Logbus-Producer-Id/-Epoch/-Sequence come together and exclude an
                    # Idempotency-Key: a rule between parameters OpenAPI cannot state.
                    "include-method": "POST",
                    "include-path-regex": "/records$",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": [*STATE_STATUSES, "400"]}
                    },
                },
                {
                    # A quota deletion names a user and/or a client id: a rule between two
                    # query parameters OpenAPI cannot state.
                    "include-method": "DELETE",
                    "include-path-regex": "/v1/quotas$",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": [*STATE_STATUSES, "400"]}
                    },
                },
                {
                    # A cluster ACL names kafka-cluster, and '*' goes only with literal: rules
                    # between fields OpenAPI cannot state (auth_quotas.acl.parse_acl).
                    "include-method": "POST",
                    "include-path-regex": "/v1/acls$",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": [*STATE_STATUSES, "400"]}
                    },
                },
            ],
        }
    ),
)


def _bounded(case: Any) -> None:
    body = case.body if isinstance(case.body, dict) else None
    if body is None:
        return
    path = case.operation.path
    field = {"/v1/topics": "partitions", "/v1/topics/{topic}/partitions": "count"}.get(path)
    value = body.get(field) if field else None
    if field and isinstance(value, int) and MAX_TEST_PARTITIONS < value <= 10_000:
        body[field] = MAX_TEST_PARTITIONS  # valid but slow; out-of-range values stay as drawn


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,  # the same cases every run: a finding is a regression, not luck
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_the_document_is_the_truth(case: Any, conformance_broker: BrokerProcess) -> None:
    _bounded(case)
    # The generated credential (from the security scheme) is replaced by a real one.
    headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN_KEY}"}
    case.call_and_validate(
        base_url=conformance_broker.url, timeout=REQUEST_TIMEOUT_S, headers=headers
    )
