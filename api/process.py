"""A broker as a child process (``logbus serve`` on a loopback port): for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

# A start is ~2 s of CPU for imports on an idle machine; at load 25-40 (several test runs on the
# 2 cores) three brokers starting at once took more than 30 s. A broker that never starts still
# fails, later.
STARTUP_TIMEOUT_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on ``host`` now (IPv4 or IPv6)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class BrokerProcess:
    """Start, stop, SIGKILL and restart a broker on one data directory."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *extra_args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: settings for this broker (``LOGBUS_*``) on top of the inherited ones."""
        self.data_dir = data_dir
        self.env = env or {}
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"broker-{self.port}.log"
        # A broker serving TLS (--ssl-certfile): how the readiness probe trusts it (and
        # presents a client certificate, where the broker requires one).
        self.tls: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        scheme = "https" if "--ssl-certfile" in self.extra_args else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        assert self.proc is None, "already running"
        cmd = [
            sys.executable,
            "-m",
            "api.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.log()}")
            try:
                verify = self.tls if self.tls is not None else True
                r = httpx.get(f"{self.url}/readyz", timeout=1.0, verify=verify)
                if r.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        log = self.log()
        self.kill()  # a broker that missed its start is not left running past its test
        raise TimeoutError(f"broker not ready after {STARTUP_TIMEOUT_S}s: {log}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Graceful stop (SIGTERM): a clean shutdown."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no chance to flush or write the clean-shutdown marker."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()
