"""The test brokers' fork server (tests/zygote.py): its children are real brokers, their exits
are reported like ``subprocess``'s, none outlives the zygote, and a per-broker environment
variable read at import is honoured."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core_log.fileio import JOURNAL_ENV, read_journal
from tests.server import BrokerProcess
from tests.zygote import Zygote

WAIT_S = 60.0


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def test_a_bad_command_exits_with_the_cli_status(zygote: Zygote, tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = zygote.spawn(["no-such-command"], dict(os.environ), log)
    assert child.wait(WAIT_S) == 2  # argparse's usage error
    assert child.poll() == 2
    assert "usage" in log.read_text()


def test_a_forked_broker_serves_and_its_sigkill_is_reported(zygote: Zygote, tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker", None, zygote=zygote)
    broker.start()
    assert broker.proc is not None
    pid = broker.proc.pid
    assert httpx.get(f"{broker.url}/readyz", timeout=10).status_code == 200
    r = httpx.post(f"{broker.url}/v1/topics", json={"name": "t", "partitions": 1}, timeout=10)
    assert r.status_code == 201, r.text
    os.kill(pid, signal.SIGKILL)
    assert broker.proc.wait(WAIT_S) == -signal.SIGKILL
    broker.kill()  # already dead: forgets the process
    broker.start()  # again, on the same data dir: the topic survived
    r = httpx.get(f"{broker.url}/v1/topics/t/partitions", timeout=10)
    assert r.status_code == 200, r.text
    child = broker.proc
    broker.stop()  # SIGTERM: a clean shutdown, then uvicorn re-raises the signal, as unforked
    assert child is not None and child.returncode == -signal.SIGTERM
    assert "Logbus stopped: signal SIGTERM" in broker.log()


def test_closing_the_zygote_kills_its_children(tmp_path: Path) -> None:
    z = Zygote()
    broker = BrokerProcess(tmp_path / "broker", None, zygote=z)
    broker.start()
    assert broker.proc is not None
    pid = broker.proc.pid
    z.close()
    with pytest.raises(ProcessLookupError):  # killed and reaped, not a zombie
        os.kill(pid, 0)


def test_a_forked_broker_honours_the_journal_variable_read_at_import(tmp_path: Path) -> None:
    """core_log.fileio picks its file operations at import (in the zygote, without the
    variable): the child must re-read them, or power-loss tests would simulate nothing."""
    journal = tmp_path / "journal"
    broker = BrokerProcess(tmp_path / "broker", None, env={JOURNAL_ENV: str(journal)})
    broker.start()
    try:
        r = httpx.post(f"{broker.url}/v1/topics", json={"name": "t", "partitions": 1}, timeout=10)
        assert r.status_code == 201, r.text
        r = httpx.post(f"{broker.url}/v1/topics/t/records", json={"records": [{"value": "v"}]})
        assert r.status_code == 200, r.text
    finally:
        broker.stop()  # a clean shutdown fsyncs the segment: the journal records it
    assert read_journal(journal), "no fsync was journalled"
