"""One broker per data directory, through real processes (issue 10).

Two brokers on one directory handed out the same offsets and the second overwrote what the
first had acknowledged; a broker that could not bind its port still opened the directory.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests import zygote
from tests.api.conftest import make_client, start_broker
from tests.api.helpers import fetch_all, produce
from tests.server import free_port

SECOND_BROKER_TIMEOUT_S = 30  # generous: it must fail at once, this only bounds a hang


def serve_once(data_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    """Run ``logbus serve`` (forked from the zygote: tests/zygote.py) and wait for it to exit
    (it is expected to fail)."""
    argv = ["serve", "--data-dir", str(data_dir), "--port", str(port)]
    return zygote.run(argv, timeout=SECOND_BROKER_TIMEOUT_S)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` with its size and mtime (ns)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def test_second_broker_on_one_data_dir_exits_at_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_broker(data)
    try:
        with make_client(first) as c:
            assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
            produce(c, "t", [{"value": "A1"}, {"value": "A2"}], partition=0)
            second = serve_once(data, free_port())
            assert second.returncode != 0, second
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1, second.stderr
            assert str(data.resolve()) in lines[0]
            assert first.proc is not None
            assert f"pid {first.proc.pid}" in lines[0]
            # The first broker keeps serving and nothing it acknowledged is lost.
            produce(c, "t", [{"value": "A3"}], partition=0)
        first.restart()
        with make_client(first) as c:
            assert [r["value"] for r in fetch_all(c, "t", 0)] == ["A1", "A2", "A3"]
    finally:
        first.stop()


def test_broker_that_cannot_bind_leaves_data_dir_untouched(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start_broker(data)
    with make_client(broker) as c:
        assert c.post("/v1/topics", json={"name": "t"}).status_code == 201
        produce(c, "t", [{"value": "v"}], partition=0)
    broker.stop()
    assert (data / ".clean_shutdown").exists()
    before = tree(data)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve_once(data, port)
        missing = serve_once(tmp_path / "never-created", port)
    assert result.returncode != 0, result
    assert f"127.0.0.1:{port}" in result.stderr and "untouched" in result.stderr, result.stderr
    assert tree(data) == before
    assert (data / ".clean_shutdown").exists()
    assert missing.returncode != 0
    assert not (tmp_path / "never-created").exists()
