"""ReplicaManager.apply never goes back to an older metadata snapshot."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cluster.metadata import MetadataStore, PartitionMeta, TopicMeta
from cluster.replica_manager import ReplicaManager, ReplicationConfig
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.manager import LogManager


def test_an_older_snapshot_applied_after_a_newer_one_is_ignored(tmp_path: Path) -> None:
    """Two refreshes can overlap (the metadata watcher and a caller's refresh after creating a
    topic); the one that read the older snapshot may take the lock second. Applying it brought
    back a topic list without the topic just created — the broker then failed its start-up
    looking up ``__consumer_offsets``, which it led."""
    config = LogConfig()

    async def main() -> None:
        logs = LogManager(
            tmp_path / "data", clock=ManualClock(1_700_000_000_000), auto_high_watermark=False
        )
        await logs.start(background=False)
        store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
        try:
            rm = ReplicaManager(
                ReplicationConfig(broker_id=1), logs, store, ManualClock(0), lambda _t: config
            )
            seen: list[list[str]] = []
            rm.on_topics.append(lambda ts: seen.append([t.name for t in ts]))
            row = PartitionMeta("t", 0, [2], [2], 2, 0, 0)  # led elsewhere: no fetcher needed
            topic = TopicMeta("t", "id", 1, 1, {}, 0, 1, [row])
            await rm.apply(7, [topic], [])
            await rm.apply(6, [], [])  # the stale one, late
            assert rm.metadata_version == 7 and ("t", 0) in rm.rows
            assert seen == [["t"]]
            await rm.apply(8, [], [])  # a newer one still applies
            assert rm.metadata_version == 8 and not rm.rows
            await rm.close()
        finally:
            await logs.close()
            store.close()

    asyncio.run(main())
