"""The broker keeps metadata and logs consistent: start-up heals a crash between the two."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from cluster.broker import Broker, BrokerConfig


def test_start_recreates_missing_logs_and_removes_stray_ones(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        await broker.create_topic("kept", partitions=2)
        await broker.close()
        # A crash after the topic row was committed but before partition 1's log existed,
        # and one after a topic row was deleted but before its log was.
        shutil.rmtree(tmp_path / "kept-1")
        (tmp_path / "ghost-0").mkdir()
        broker = Broker(BrokerConfig(data_dir=tmp_path))
        await broker.start()
        try:
            assert sorted(broker.logs.topics().items()) == [("kept", [0, 1])]
            assert (tmp_path / "kept-1").is_dir()
            assert not (tmp_path / "ghost-0").exists()
        finally:
            await broker.close()

    asyncio.run(main())
