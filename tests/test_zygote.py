"""The test brokers' fork server (tests/zygote.py): its children are real brokers, their exits
are reported like ``subprocess``'s, none outlives the zygote, and a per-broker environment
variable read at import is honoured; a command run through it (``zygote.run``) sees its stdin,
cwd and environment, and exits as a fresh interpreter would."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core_log.fileio import JOURNAL_ENV, read_journal
from tests import zygote as zygote_module
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


# -- zygote.run: a command forked as a fresh interpreter would run it ---------------------------


def _program(argv: list[str]) -> int | None:
    """A ``main`` for the tests below: ARGV[0] says how to end."""
    import sys
    import threading

    how = argv[0]
    if how == "echo":  # stdin to stdout upper-cased, a line to stderr, cwd and env to stdout
        sys.stdout.write(sys.stdin.read().upper())
        print(os.getcwd(), os.environ.get("ZYGOTE_TEST", "-"))
        print("to stderr", file=sys.stderr)
        return 3
    if how == "none":
        return None
    if how == "exit-none":
        raise SystemExit
    if how == "exit-text":
        raise SystemExit("it went wrong")
    if how == "raise":
        raise ValueError("boom")
    if how == "thread":  # a non-daemon thread still writing when main returns
        done = threading.Event()

        def late() -> None:
            done.wait(0.2)  # not a synchronisation: the thread must outlive main's return
            print("thread finished", flush=True)

        threading.Thread(target=late).start()
        return 0
    if how == "hang":
        threading.Event().wait(600)
    return 99


PROGRAM = "tests.test_zygote:_program"


def test_run_passes_stdin_cwd_env_and_separates_stdout_from_stderr(tmp_path: Path) -> None:
    done = zygote_module.run(
        ["echo"],
        input="abc\n",
        env={**os.environ, "ZYGOTE_TEST": "yes"},
        cwd=tmp_path,
        main=PROGRAM,
    )
    assert done.returncode == 3
    assert done.stdout == f"ABC\n{tmp_path} yes\n"
    assert done.stderr == "to stderr\n"


@pytest.mark.parametrize(
    ("how", "code", "stderr"),
    [
        ("none", 0, ""),
        ("exit-none", 0, ""),
        ("exit-text", 1, "it went wrong\n"),
        ("raise", 1, "ValueError: boom\n"),
        ("thread", 0, ""),
    ],
)
def test_run_exits_as_a_fresh_interpreter_would(how: str, code: int, stderr: str) -> None:
    done = zygote_module.run([how], main=PROGRAM)
    assert done.returncode == code, done
    assert done.stderr.endswith(stderr), done.stderr
    if how == "raise":
        assert done.stderr.startswith("Traceback"), done.stderr
    if how == "thread":  # joined before the exit, as the interpreter does
        assert done.stdout == "thread finished\n"


def test_run_kills_a_command_past_its_timeout() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        zygote_module.run(["hang"], main=PROGRAM, timeout=0.5)


def test_run_is_the_cli_by_default() -> None:
    done = zygote_module.run(["topics", "--help"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: logbus topics")
