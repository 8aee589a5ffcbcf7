"""The chaos tests' fixtures (metadata backend, seed, failure report) for the Jepsen runs."""

from tests.chaos.conftest import (  # noqa: F401  (fixtures and the report hook, re-exported)
    failure_report,
    metadata_url,
    pytest_runtest_makereport,
    seed,
)
