"""A metadata store on a full disk: a retriable storage error, and nothing half-written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cluster.metadata import MetadataStore, TopicMeta
from core_log.errors import KafkaStorageError

MAX_TOPICS_TRIED = 1_000  # a few pages of 4 KiB fill long before this


def test_sqlite_database_full_is_a_storage_error_and_rolls_back(tmp_path: Path) -> None:
    store = MetadataStore(f"sqlite:///{tmp_path / 'metadata.db'}")

    def cap_at_current_size(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA page_count")
        pages = cur.fetchone()[0]
        cur.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own "disk full"
        cur.close()

    sa.event.listen(store.writer, "connect", cap_at_current_size)  # writes go through it
    store.writer.dispose()
    created = []
    with pytest.raises(KafkaStorageError, match="database or disk is full"):
        for i in range(MAX_TOPICS_TRIED):
            name = f"topic-{i:04d}-" + "x" * 200
            store.create_topic(TopicMeta(name, "0" * 32, 1, 1, {"k": "v" * 500}, 0, 0))
            created.append(name)
    assert [t.name for t in store.topics()] == created  # the failed one left no row
    store.close()
