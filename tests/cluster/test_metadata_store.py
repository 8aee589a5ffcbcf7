"""The metadata store's cluster rows: broker leases and epochs, the controller lease, ISR and
election compare-and-sets, the metadata version, producer id blocks, and the Alembic schema."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from cluster import migrate
from cluster.metadata import (
    BrokerMeta,
    ConcurrentUpdateError,
    MetadataStore,
    PartitionMeta,
    TopicMeta,
)
from cluster.schema import metadata_obj

LEASE_MS = 60_000  # long: the tests expire leases explicitly (0 ms) instead of waiting


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    """The same store code and migrations on SQLite and on a real PostgreSQL server."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'metadata.db'}"
    else:
        url = request.getfixturevalue("postgres_db_url")
    s = MetadataStore(url)
    yield s
    s.close()


def _broker(i: int) -> BrokerMeta:
    return BrokerMeta(i, "127.0.0.1", 9000 + i, f"rack-{i % 2}", replication_port=7000 + i)


def _topic(name: str = "t") -> TopicMeta:
    p = PartitionMeta(name, 0, [1, 2, 3], [1, 2, 3], 1, 0, 0)
    return TopicMeta(name, "0" * 32, 1, 3, {}, 0, 0, [p])


def test_each_registration_is_a_new_epoch_and_fences_the_old_one(store: MetadataStore) -> None:
    first = store.register_broker(_broker(1), LEASE_MS)
    assert store.heartbeat(1, first, LEASE_MS)
    second = store.register_broker(_broker(1), LEASE_MS)
    assert second == first + 1
    assert not store.heartbeat(1, first, LEASE_MS)  # the old incarnation is fenced
    assert store.heartbeat(1, second, LEASE_MS)
    [b] = store.brokers()
    assert (b.broker_epoch, b.alive, b.replication_port, b.rack) == (second, True, 7001, "rack-1")


def test_a_new_incarnation_leaves_every_isr_it_shares_and_its_leadership(
    store: MetadataStore,
) -> None:
    rows = [
        PartitionMeta("t", 0, [1, 2, 3], [1, 2, 3], 1, 4, 7),  # led by 1
        PartitionMeta("t", 1, [2, 1, 3], [2, 1, 3], 2, 5, 8),  # follower
        PartitionMeta("t", 2, [1, 2, 3], [1], 1, 6, 9),  # last ISR member: stays
        PartitionMeta("t", 3, [2, 3, 1], [2, 3], 2, 1, 2),  # out of sync already
    ]
    store.create_topic(TopicMeta("t", "0" * 32, 4, 3, {}, 0, 0, rows))
    store.register_broker(_broker(1), LEASE_MS)  # the first registration changes no row
    assert store.topic("t").assignments == rows
    store.register_broker(_broker(1), LEASE_MS)  # restarted: it may have lost unsynced data
    after = store.topic("t").assignments
    assert after[0] == PartitionMeta("t", 0, [1, 2, 3], [2, 3], -1, 5, 8)
    assert after[1] == PartitionMeta("t", 1, [2, 1, 3], [2, 3], 2, 5, 9)
    assert after[2:] == rows[2:]


def test_an_expired_lease_cannot_be_renewed(store: MetadataStore) -> None:
    epoch = store.register_broker(_broker(1), 0)  # expires at once (database clock)
    assert not store.brokers()[0].alive
    assert not store.heartbeat(1, epoch, LEASE_MS)  # fenced: it must register again
    again = store.register_broker(_broker(1), LEASE_MS)
    assert store.heartbeat(1, again, LEASE_MS) and store.brokers()[0].alive


def test_clean_shutdown_expires_the_lease_at_once(store: MetadataStore) -> None:
    epoch = store.register_broker(_broker(1), LEASE_MS)
    store.expire_broker(1, epoch)
    assert not store.brokers()[0].alive


def test_controller_lease_is_held_by_one_broker_until_it_expires(store: MetadataStore) -> None:
    assert store.controller() is None
    e1 = store.acquire_controller(1, LEASE_MS)
    assert e1 == 1
    assert store.acquire_controller(2, LEASE_MS) is None  # held, live
    assert store.renew_controller(1, e1, LEASE_MS)
    store.resign_controller(1, e1)  # or: its lease runs out
    e2 = store.acquire_controller(2, LEASE_MS)
    assert e2 == 2
    assert not store.renew_controller(1, e1, LEASE_MS)  # the old controller is fenced
    c = store.controller()
    assert c is not None and (c.broker_id, c.controller_epoch, c.alive) == (2, 2, True)


def test_controller_lease_race_has_one_winner(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    stores = [MetadataStore(url) for _ in range(4)]
    won: list[int] = []
    barrier = threading.Barrier(len(stores))

    def contend(i: int) -> None:
        barrier.wait()
        if stores[i].acquire_controller(i, LEASE_MS) is not None:
            won.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    for s in stores:
        s.close()


def test_isr_change_is_a_compare_and_set_by_a_live_leader(store: MetadataStore) -> None:
    epoch = store.register_broker(_broker(1), LEASE_MS)
    store.create_topic(_topic())
    [seen] = store.topic("t").assignments
    shrunk = store.change_isr(seen, [1, 2], 1, epoch)
    assert (shrunk.isr, shrunk.partition_epoch) == ([1, 2], 1)
    assert store.topic("t").assignments[0] == shrunk
    with pytest.raises(ConcurrentUpdateError):
        store.change_isr(seen, [1], 1, epoch)  # computed from a stale row
    with pytest.raises(ConcurrentUpdateError):
        store.change_isr(shrunk, [1], 2, epoch)  # not the leader
    store.expire_broker(1, epoch)
    with pytest.raises(ConcurrentUpdateError):
        store.change_isr(shrunk, [1], 1, epoch)  # fenced: cannot shrink the ISR to itself


def test_controller_changes_need_a_live_lease_and_skip_moved_rows(store: MetadataStore) -> None:
    store.create_topic(_topic("a"))
    store.create_topic(_topic("b"))
    ctl = (1, store.acquire_controller(1, LEASE_MS) or 0)
    a, b = store.topic("a").assignments[0], store.topic("b").assignments[0]
    new_a = replace(a, leader=2, isr=[2, 3], leader_epoch=1, partition_epoch=1)
    new_b = replace(b, leader=2, isr=[2, 3], leader_epoch=1, partition_epoch=1)
    stale_b = (b.partition_epoch + 5, new_b)  # computed from a row that has since moved
    assert store.apply_controller_changes(ctl, [(a.partition_epoch, new_a), stale_b]) == [new_a]
    assert store.topic("b").assignments[0] == b
    store.resign_controller(*ctl)
    with pytest.raises(ConcurrentUpdateError):
        store.apply_controller_changes(ctl, [(b.partition_epoch, new_b)])
    assert store.topic("b").assignments[0] == b


def test_every_change_moves_the_metadata_version(store: MetadataStore) -> None:
    versions = [store.metadata_version()]
    epoch = store.register_broker(_broker(1), LEASE_MS)
    versions.append(store.metadata_version())
    store.create_topic(_topic())
    versions.append(store.metadata_version())
    store.change_isr(store.topic("t").assignments[0], [1], 1, epoch)
    versions.append(store.metadata_version())
    store.delete_topic("t")
    versions.append(store.metadata_version())
    assert versions == sorted(set(versions))  # strictly increasing


def test_producer_id_blocks_never_overlap(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    a, b = MetadataStore(url), MetadataStore(url)
    blocks = [a.allocate_producer_ids(100), b.allocate_producer_ids(100), a.init_producer(None)]
    ids = [*blocks[0], *blocks[1], blocks[2][0]]
    assert len(ids) == len(set(ids)) == 201
    a.close()
    b.close()


def test_migrations_build_exactly_the_tables_the_code_queries(store: MetadataStore) -> None:
    assert migrate.current(store.engine) == migrate.head()
    inspector = sa.inspect(store.engine)
    for table in metadata_obj.sorted_tables:
        built = {c["name"] for c in inspector.get_columns(table.name)}
        assert built == {c.name for c in table.columns}, table.name


def test_a_store_from_before_alembic_is_stamped_and_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    migrate.upgrade(engine, migrate.BASELINE)
    with engine.begin() as c:  # what an earlier release left: the tables, no version row
        c.exec_driver_sql("DROP TABLE alembic_version")
        c.exec_driver_sql("INSERT INTO topics VALUES ('old', '00', 1, 1, '{}', 0, 0)")
    store = MetadataStore(f"sqlite:///{path}")
    assert [t.name for t in store.topics()] == ["old"]
    assert migrate.current(store.engine) == migrate.head()
    store.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM controller").fetchone() == (0,)


def test_logbus_metadata_upgrade_creates_then_keeps_the_schema(tmp_path: Path) -> None:
    from api.cli import main

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    assert main(["metadata", "upgrade", "--metadata-url", url]) == 0
    assert main(["metadata", "upgrade", "--metadata-url", url]) == 0
    assert migrate.current(sa.create_engine(url)) == migrate.head()


def test_brokers_registering_at_once_on_one_sqlite_file_all_succeed(tmp_path: Path) -> None:
    """A deferred SQLite transaction that reads then writes fails at once ("database is
    locked") when another writer holds the lock; writes begin IMMEDIATE and queue instead."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    MetadataStore(url).close()  # the schema, made once
    stores = [MetadataStore(url) for _ in range(8)]
    start = threading.Barrier(len(stores))
    epochs: dict[int, int] = {}
    errors: list[BaseException] = []

    def register(i: int) -> None:
        start.wait()
        try:
            for _ in range(5):
                epochs[i] = stores[i].register_broker(
                    BrokerMeta(i, "127.0.0.1", 9000 + i, None), 9000
                )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert errors == []
    assert epochs == {i: 5 for i in range(len(stores))}
