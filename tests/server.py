"""Test access to a real broker process (see :mod:`api.process`), forked from a zygote.

:class:`BrokerProcess` is :class:`api.process.BrokerProcess` (same argv, environment, log, port,
signals) except that by default its process is forked from the test run's zygote
(:mod:`tests.zygote`), whose broker modules are already imported: a start costs the broker's own
start-up, not ~2 s of CPU of imports. ``fork=False`` (or ``LOGBUS_TEST_FORK=0`` for the whole
run) starts ``python -m api.cli serve`` instead; ``zygote=`` forks from a given zygote.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import cast

from api import process
from api.process import free_port
from tests import zygote as zygotes

__all__ = ["BrokerProcess", "free_port"]


class BrokerProcess(process.BrokerProcess):
    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *extra_args: str,
        env: dict[str, str] | None = None,
        fork: bool = True,
        zygote: zygotes.Zygote | None = None,
    ) -> None:
        super().__init__(data_dir, port, *extra_args, env=env)
        self.fork = fork and (zygote is not None or zygotes.forking())
        self.zygote = zygote

    def start(self) -> BrokerProcess:
        if not self.fork:
            super().start()
            return self
        assert self.proc is None, "already running"
        argv = ["serve", "--data-dir", str(self.data_dir), "--port", str(self.port)]
        z = self.zygote or zygotes.shared()
        child = z.spawn([*argv, *self.extra_args], {**os.environ, **self.env}, self.log_path)
        # Duck-typed: api.process.BrokerProcess uses only pid, poll, wait, kill and send_signal.
        self.proc = cast("subprocess.Popen[bytes]", child)
        self._wait_ready()
        return self
