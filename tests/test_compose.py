"""docker-compose.yml describes a cluster the code accepts: no Docker engine runs here, so the
file is parsed and every command is checked against the real command-line parsers — the
brokers' with ``logbus``'s, the click-stream services' with the example's own (the code
tests/spark_sink/test_example.py and tests/test_cli.py run)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from api.cli import build_parser
from examples.clickstream import pipeline, produce_clicks

ROOT = Path(__file__).resolve().parent.parent
BROKERS = ("broker1", "broker2", "broker3")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc


def _dockerfile_stage(target: str | None) -> str:
    """The text of one stage of the Dockerfile (the last one when ``target`` is None)."""
    stages = re.split(r"^(?=FROM )", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)[1:]
    if target is None:
        return stages[-1]
    return next(s for s in stages if s.splitlines()[0].endswith(f" AS {target}"))


def _serve_args(service: dict[str, Any]) -> argparse.Namespace:
    # The broker image's entrypoint is `logbus`; the command is its arguments.
    assert service.get("build", {}).get("target") is None  # the default (broker) stage
    assert 'ENTRYPOINT ["logbus"]' in _dockerfile_stage(None)
    command = service["command"]
    assert isinstance(command, list) and all(isinstance(a, str) for a in command), command
    assert command[0] == "serve", command
    args = build_parser().parse_args(command)
    assert args.func.__name__ == "_serve"
    return args


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", *BROKERS, "clicks", "spark"}
    assert set(compose["volumes"]) >= {"postgres-data", *(f"{b}-data" for b in BROKERS)}


def test_postgres_is_the_official_image_with_a_health_check_and_a_volume(
    compose: dict[str, Any],
) -> None:
    pg = compose["services"]["postgres"]
    assert re.fullmatch(r"postgres:\d+", pg["image"])
    assert pg["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert any(v.startswith("postgres-data:/var/lib/postgresql") for v in pg["volumes"])


def test_brokers_are_logbus_serve_on_one_postgres_store(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pg = services["postgres"]["environment"]
    parsed = {name: _serve_args(services[name]) for name in BROKERS}
    urls = {a.metadata_url for a in parsed.values()}
    assert len(urls) == 1, urls
    url = sa.engine.make_url(urls.pop())
    assert url.drivername == "postgresql+psycopg"  # the driver pyproject installs
    assert (url.host, url.port or 5432) == ("postgres", 5432)
    assert (url.username, url.password, url.database) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        pg["POSTGRES_DB"],
    )
    assert sorted(a.broker_id for a in parsed.values()) == [1, 2, 3]
    for name, a in parsed.items():
        # Peers and the Spark job reach a broker by its service name; one port inside.
        assert a.advertised_url == f"http://{name}:{a.port}"
        assert a.host == "0.0.0.0" and a.insecure  # reachable in its network; no auth yet
        assert a.data_dir == Path("/data")
        service = services[name]
        assert service["volumes"] == [f"{name}-data:/data"]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "readyz" in " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{a.port}" in service["healthcheck"]["test"][-1]
    # One shape (the x-broker anchor): tests/test_packaging.py checks broker1's against the
    # Dockerfile, so the others must be the same.
    for key in ("build", "image", "healthcheck", "restart", "stop_grace_period"):
        assert all(services[n][key] == services["broker1"][key] for n in BROKERS), key
    published = [services[n]["ports"][0] for n in BROKERS]
    assert all(p.startswith("127.0.0.1:") for p in published)  # loopback only: no auth yet
    assert len({p.split(":")[1] for p in published}) == 3


@pytest.mark.parametrize(
    ("name", "module", "parser"),
    [
        ("clicks", "examples.clickstream.produce_clicks", produce_clicks.build_parser),
        ("spark", "examples.clickstream.pipeline", pipeline.build_parser),
    ],
)
def test_click_stream_services_run_the_example_against_the_brokers(
    compose: dict[str, Any], name: str, module: str, parser: Any
) -> None:
    service = compose["services"][name]
    command = service["command"]
    assert command[:3] == ["python", "-m", module], command
    args = parser().parse_args(command[3:])
    broker = re.fullmatch(r"http://(broker\d):(\d+)", args.url)
    assert broker is not None and broker[1] in BROKERS, args.url
    assert service["build"]["target"] == "spark"
    stage = _dockerfile_stage("spark")
    assert "[spark]" in stage and "openjdk-17" in stage  # PySpark and its Java
    assert "COPY --chown=logbus:logbus examples /app/examples" in stage
    assert "WORKDIR /app" in stage  # so `python -m examples...` finds the module
    for b in BROKERS:
        assert service["depends_on"][b]["condition"] == "service_healthy"
    assert args.replication_factor == len(BROKERS)  # the topics it creates are replicated


def test_the_spark_job_reads_what_the_clicks_service_writes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    clicks = produce_clicks.build_parser().parse_args(services["clicks"]["command"][3:])
    spark = pipeline.build_parser().parse_args(services["spark"]["command"][3:])
    assert clicks.topic == spark.topic
    assert spark.dir == Path("/out") and "spark-out:/out" in services["spark"]["volumes"]
    assert not spark.available_now  # a streaming job: it keeps counting until stopped
    condition = services["spark"]["depends_on"]["clicks"]["condition"]
    assert condition == "service_completed_successfully"


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    """The file is valid for Compose itself, when a Compose is installed (it is not in CI)."""
    if shutil.which("docker-compose"):
        command = ["docker-compose"]
    elif shutil.which("docker") and (
        subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        command = ["docker", "compose"]
    else:
        pytest.skip("no docker-compose and no `docker compose` plugin installed")
    result = subprocess.run(
        [*command, "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
