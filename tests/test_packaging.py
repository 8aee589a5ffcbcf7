"""The Docker packaging, checked without a Docker engine.

The compose file and the Dockerfile are parsed and held to what the code does: the image's
command is the ``logbus serve`` the tests run, the volume is mounted where that command keeps its
data, the published port is the one it listens on, and the health check script passes against a
real broker.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import cli
from tests.server import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    start = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[start:]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(x, str) for x in value), args
    return value


def only(stage: list[tuple[str, str]], word: str) -> str:
    found = [args for w, args in stage if w == word]
    assert len(found) == 1, f"expected one {word}, got {found}"
    return found[0]


@pytest.fixture(scope="module")
def stage() -> list[tuple[str, str]]:
    return final_stage(dockerfile_instructions(DOCKERFILE))


@pytest.fixture(scope="module")
def service() -> dict[str, Any]:
    """The compose file's first broker (tests/test_compose.py holds the three to one shape)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    broker: dict[str, Any] = compose["services"]["broker1"]
    broker["_volumes"] = compose.get("volumes") or {}
    return broker


@pytest.fixture(scope="module")
def command(stage: list[tuple[str, str]], service: dict[str, Any]) -> list[str]:
    """What the container runs: ENTRYPOINT + (compose ``command`` or CMD)."""
    entrypoint = exec_form(only(stage, "ENTRYPOINT"))
    assert "entrypoint" not in service
    cmd = service.get("command") or exec_form(only(stage, "CMD"))
    assert isinstance(cmd, list), "write the command in exec form"
    return [*entrypoint, *cmd]


def option(command: list[str], name: str) -> str:
    assert command.count(name) == 1, (name, command)
    return command[command.index(name) + 1]


def healthcheck_script(stage: list[tuple[str, str]]) -> list[str]:
    args = only(stage, "HEALTHCHECK")
    return exec_form(args[args.index("CMD ") + len("CMD ") :])


# -- compose ------------------------------------------------------------------------------------


def test_compose_builds_the_broker_from_the_dockerfile(service: dict[str, Any]) -> None:
    build = service["build"]
    context = ROOT / (build["context"] if isinstance(build, dict) else build)
    assert context.resolve() == ROOT
    dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
    assert (context / dockerfile).resolve() == DOCKERFILE
    assert service["restart"] == "unless-stopped"


def test_data_volume_is_mounted_where_the_command_keeps_data(
    service: dict[str, Any], stage: list[tuple[str, str]], command: list[str]
) -> None:
    data_dir = option(command, "--data-dir")
    assert data_dir == "/data"
    assert "broker1-data" in service["_volumes"]
    mounts = {}
    for v in service["volumes"]:
        if isinstance(v, str):
            source, target = v.split(":")[:2]
        else:
            source, target = v["source"], v["target"]
        mounts[target] = source
    assert mounts[data_dir] == "broker1-data"
    assert data_dir in only(stage, "VOLUME").replace('"', " ").strip("[] ").split()


def test_the_listening_port_is_exposed_and_published(
    service: dict[str, Any], stage: list[tuple[str, str]], command: list[str]
) -> None:
    port = option(command, "--port")
    assert only(stage, "EXPOSE").split("/")[0] == port
    published = []
    for p in service["ports"]:
        if isinstance(p, dict):
            published.append((str(p.get("host_ip", "")), str(p["published"]), str(p["target"])))
        else:
            *host, container = str(p).split(":")
            published.append((":".join(host[:-1]), host[-1], container))
    assert any(container == port and host_port for _, host_port, container in published)


def test_compose_healthcheck_is_the_images(
    service: dict[str, Any], stage: list[tuple[str, str]]
) -> None:
    check = service["healthcheck"]
    assert check["test"][0] == "CMD"
    assert check["test"][1:] == healthcheck_script(stage)
    for key in ("interval", "timeout", "retries"):
        assert key in check


# -- Dockerfile ---------------------------------------------------------------------------------


def test_image_base_user_and_healthcheck(stage: list[tuple[str, str]]) -> None:
    assert only(stage, "FROM").split()[0] == "python:3.11-slim"
    user = only(stage, "USER")
    assert user not in ("root", "0") and not user.startswith(("root:", "0:"))
    script = healthcheck_script(stage)
    assert script[:2] == ["python", "-c"]
    assert "urllib" in script[2] and "/readyz" in script[2]
    installs = [args for word, args in stage if word == "RUN" and "pip install" in args]
    assert installs, "the runtime stage installs Logbus with pip"


def test_image_command_is_logbus_serve(command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """ENTRYPOINT + CMD is the console script ``logbus serve``, as tests/server.py runs it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] == "logbus" and scripts["logbus"] == "api.cli:main"
    args = command[1:]
    assert args[0] == "serve"
    assert option(command, "--host") == "0.0.0.0"
    assert "--insecure" in args  # a public bind needs it until authentication exists

    seen: list[argparse.Namespace] = []

    def fake_serve(parsed: argparse.Namespace) -> int:
        seen.append(parsed)
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    assert cli.main(args) == 0
    (parsed,) = seen
    assert parsed.command == "serve"
    assert (parsed.data_dir, parsed.host, parsed.port, parsed.insecure) == (
        Path("/data"),
        "0.0.0.0",
        int(option(command, "--port")),
        True,
    )

    helped = subprocess.run(
        [sys.executable, "-m", "api.cli", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: logbus serve")


def test_dockerignore_keeps_local_state_out_but_not_the_sources() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for needed in (".venv", "logbus-data", ".git"):
        assert needed in patterns
    for source in ("pyproject.toml", "setup.py", "README.md", "api/cli.py", "core_log/batch.py"):
        for pattern in patterns:
            assert not fnmatch.fnmatch(source, pattern.removeprefix("**/")), (source, pattern)
            assert not source.startswith(pattern.rstrip("/") + "/"), (source, pattern)


# -- against a broker ---------------------------------------------------------------------------


@pytest.fixture
def insecure_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """The image's flags, on loopback and a free port (no public bind in a test)."""
    b = BrokerProcess(tmp_path / "data", None, "--insecure").start()
    try:
        yield b
    finally:
        b.stop()


def test_healthcheck_script_reports_readiness(
    insecure_broker: BrokerProcess, stage: list[tuple[str, str]], command: list[str]
) -> None:
    _python, flag, script = healthcheck_script(stage)
    port = option(command, "--port")
    assert f"127.0.0.1:{port}/" in script
    script = script.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{insecure_broker.port}/")
    check = [sys.executable, flag, script]
    healthy = subprocess.run(check, capture_output=True, text=True, timeout=30)
    assert healthy.returncode == 0, healthy.stderr
    insecure_broker.stop()
    unhealthy = subprocess.run(check, capture_output=True, text=True, timeout=30)
    assert unhealthy.returncode != 0


def test_serve_refuses_a_public_bind_without_insecure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGBUS_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "api.cli",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "refusing to bind 0.0.0.0" in result.stderr
    assert "--insecure" in result.stderr


# -- what `make run` installs ----------------------------------------------------------------------


def test_the_broker_installs_without_test_tools_or_spark() -> None:
    """`make run` installed the test extras and Spark: a 1.3 GB virtualenv and ~3 minutes
    before the first broker. The broker's dependencies are its runtime ones; Spark is an extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"]).lower()
    for heavy in ("pyspark", "pytest", "hypothesis", "mypy", "matplotlib", "playwright"):
        assert heavy not in runtime, heavy
    extras = project["optional-dependencies"]
    assert any(d.startswith("pyspark[sql]") for d in extras["spark"])
    makefile = (ROOT / "Makefile").read_text()
    recipes = _make_recipes(makefile)
    run_stamp = recipes["run"][0]
    assert recipes[run_stamp][1][0] == "$(BIN)/pip install -q -e .", recipes[run_stamp]
    test_stamp = recipes["test"][0]
    assert "$(BIN)/pip install -q -e '.[test,spark]'" in recipes[test_stamp][1]
    for target in ("example-spark", "bench-spark"):
        stamp = recipes[target][0]
        assert "$(BIN)/pip install -q -e '.[spark]'" in recipes[stamp][1], target


def _make_recipes(makefile: str) -> dict[str, tuple[str, list[str]]]:
    """target → (first prerequisite with variables expanded as written, recipe lines)."""
    variables = dict(
        (name.strip(), value.strip())
        for name, _, value in (
            line.partition(":=") for line in makefile.splitlines() if ":=" in line
        )
    )

    def expand(word: str) -> str:
        for name, value in variables.items():
            word = word.replace(f"$({name})", value)
        return word

    out: dict[str, tuple[str, list[str]]] = {}
    current: list[str] | None = None
    for line in makefile.splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line.strip())
            continue
        current = None
        if ":" in line and not line.startswith((".", "#", " ")) and ":=" not in line:
            target, _, prereqs = line.partition(":")
            first = prereqs.split("|")[0].split()
            current = []
            out[expand(target.strip())] = (expand(first[0]) if first else "", current)
    return out


def test_spark_sink_without_pyspark_says_how_to_get_it() -> None:
    probe = "import sys; sys.modules['pyspark'] = None; import spark_sink"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 1
    assert "pip install 'logbus[spark]'" in result.stderr, result.stderr
