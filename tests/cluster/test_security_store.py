"""The security store (users, API keys, ACLs, quotas, cluster secrets) on SQLite and on
PostgreSQL, its version counter, its caps, migration 0004 both ways, and the watcher that
brings changes to every broker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st

from auth_quotas import limits as auth_limits
from auth_quotas.quotas import DEFAULT, QuotaEntity
from cluster import migrate
from cluster.metadata import MetadataStore, TopicMeta
from cluster.security_store import (
    DEFAULT_ENTITY,
    MAX_ACLS,
    AclFilter,
    AclRow,
    DuplicateResourceError,
    InvalidSecurityRowError,
    QuotaRow,
    SecurityLimitError,
    SecurityLimits,
    SecuritySnapshot,
    SecurityStore,
    UnknownUserError,
)
from cluster.security_watcher import SecurityWatcher
from core_log.errors import ErrorCode, KafkaStorageError

WAIT_S = 30.0  # generous bound for events on a loaded 2-core machine (never a sleep)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'metadata.db'}"
    return str(request.getfixturevalue("postgres_db_url"))


@pytest.fixture
def meta(url: str) -> Iterator[MetadataStore]:
    m = MetadataStore(url)
    yield m
    m.close()


@pytest.fixture
def store(meta: MetadataStore) -> SecurityStore:
    return meta.security


def _acl(principal: str = "User:alice", name: str = "orders", op: str = "write") -> AclRow:
    return AclRow(principal, "topic", name, "literal", op, "allow")


# -- users and keys ---------------------------------------------------------------------------


def test_users_are_created_once_and_deleted(store: SecurityStore) -> None:
    assert store.users() == []
    row = store.create_user("alice", 1000)
    assert (row.name, row.created_ms) == ("alice", 1000)
    with pytest.raises(DuplicateResourceError) as e:
        store.create_user("alice", 2000)
    assert (e.value.code, e.value.http_status) == (ErrorCode.DUPLICATE_RESOURCE, 409)
    store.create_user("bob", 3000)
    assert [u.name for u in store.users()] == ["alice", "bob"]
    assert store.delete_user("alice")
    assert not store.delete_user("alice")
    assert [u.name for u in store.users()] == ["bob"]


def test_keys_belong_to_an_existing_user_and_can_be_revoked(store: SecurityStore) -> None:
    with pytest.raises(UnknownUserError) as e:
        store.add_key("alice", "k1", "$argon2id$h1", "", 1)
    assert e.value.http_status == 404
    store.create_user("alice", 1)
    store.create_user("bob", 1)
    k1 = store.add_key("alice", "k1", "$argon2id$h1", "laptop", 10)
    k2 = store.add_key("alice", "k2", "$argon2id$h2", "", 20)
    with pytest.raises(DuplicateResourceError):
        store.add_key("bob", "k1", "$argon2id$other", "", 30)  # key ids are global
    assert store.keys("alice") == [k1, k2]
    assert store.keys("bob") == []
    assert store.key("k1") == k1
    assert not store.revoke_key("bob", "k1")  # not bob's key
    assert store.revoke_key("alice", "k1")
    assert not store.revoke_key("alice", "k1")
    assert store.key("k1") is None
    assert store.keys("alice") == [k2]
    with pytest.raises(UnknownUserError):
        store.keys("carol")


def test_deleting_a_user_deletes_its_keys_but_keeps_acls_and_quotas(store: SecurityStore) -> None:
    store.create_user("alice", 1)
    store.add_key("alice", "k1", "h", "", 1)
    store.add_key("alice", "k2", "h", "", 1)
    store.add_acls([_acl()], 1)
    store.set_quotas("alice", None, {"producer_byte_rate": 1024.0})
    assert store.delete_user("alice")
    snap = store.snapshot()
    assert (snap.users, snap.keys) == ((), ())
    assert snap.acls == (_acl(),)  # as in Kafka: ACLs outlive the user
    assert snap.quotas == (QuotaRow("alice", None, "producer_byte_rate", 1024.0),)
    store.create_user("alice", 2)  # a new alice does not get the old keys back
    assert store.keys("alice") == []


def test_the_database_cascades_key_rows_with_their_user(meta: MetadataStore) -> None:
    """The foreign key itself: declared on both, enforced by PostgreSQL (SQLite enforces
    foreign keys only with a pragma, which is why delete_user deletes keys explicitly)."""
    store = meta.security
    store.create_user("alice", 1)
    store.add_key("alice", "k1", "h", "", 1)
    fks = sa.inspect(meta.engine).get_foreign_keys("api_keys")
    assert [(f["referred_table"], f["options"].get("ondelete")) for f in fks] == [
        ("users", "CASCADE")
    ]
    if meta.engine.dialect.name == "postgresql":
        with meta.engine.begin() as c:
            c.exec_driver_sql("DELETE FROM users WHERE name = 'alice'")
            assert c.exec_driver_sql("SELECT count(*) FROM api_keys").scalar_one() == 0


# -- ACLs -------------------------------------------------------------------------------------


def test_acls_are_added_once_and_removed_by_filter(store: SecurityStore) -> None:
    a, b, c = _acl(), _acl(op="read"), _acl("User:bob", "payments")
    assert store.add_acls([a, a, b], 1) == 2  # duplicates within a call count once
    assert store.add_acls([a, b, c], 2) == 1
    assert store.add_acls([a], 3) == 0
    assert store.add_acls([], 3) == 0
    assert store.acls() == sorted([a, b, c])
    assert store.remove_acls(AclFilter(principal="User:nobody")) == []
    assert store.remove_acls(AclFilter(principal="User:alice", operation="read")) == [b]
    assert store.remove_acls(AclFilter()) == sorted([a, c])  # all fields "any"
    assert store.acls() == []


_NAMES = st.sampled_from(["a", "b"])
_ACLS = st.builds(
    AclRow,
    principal=st.sampled_from(["User:alice", "User:bob", "User:*"]),
    resource_type=st.sampled_from(["topic", "group"]),
    name=_NAMES,
    pattern=st.sampled_from(["literal", "prefixed"]),
    operation=st.sampled_from(["read", "write"]),
    permission=st.sampled_from(["allow", "deny"]),
)
_FILTERS = st.builds(
    AclFilter,
    principal=st.none() | st.sampled_from(["User:alice", "User:bob", "User:*"]),
    resource_type=st.none() | st.sampled_from(["topic", "group"]),
    name=st.none() | _NAMES,
    pattern=st.none() | st.sampled_from(["literal", "prefixed"]),
    operation=st.none() | st.sampled_from(["read", "write"]),
    permission=st.none() | st.sampled_from(["allow", "deny"]),
)
_OPS = st.lists(
    st.tuples(st.just("add"), st.lists(_ACLS, max_size=6)) | st.tuples(st.just("remove"), _FILTERS),
    max_size=12,
)


def test_acl_changes_match_a_model_set(store: SecurityStore) -> None:
    """Any sequence of adds and filtered removes leaves the store equal to a Python set, each
    call reports exactly what it changed, and the version moves exactly when something did."""

    @settings(max_examples=30, deadline=None)
    @given(ops=_OPS)
    def run(ops: list[tuple[str, object]]) -> None:
        store.remove_acls(AclFilter())
        model: set[AclRow] = set()
        for kind, arg in ops:
            before = store.version()
            if kind == "add":
                assert isinstance(arg, list)
                new = set(arg) - model
                assert store.add_acls(arg, 1) == len(new)
                model |= new
                changed = bool(new)
            else:
                assert isinstance(arg, AclFilter)
                gone = sorted(r for r in model if arg.matches(r))
                assert store.remove_acls(arg) == gone
                model -= set(gone)
                changed = bool(gone)
            assert store.version() == before + changed
            assert store.acls() == sorted(model)

    run()


# -- quotas -----------------------------------------------------------------------------------


def test_quotas_are_upserted_per_entity_and_deleted(store: SecurityStore) -> None:
    v0 = store.version()
    assert store.set_quotas("alice", None, {"producer_byte_rate": 100.0})
    assert store.set_quotas("alice", "app", {"producer_byte_rate": 200.0})
    assert store.set_quotas("alice", DEFAULT_ENTITY, {"producer_byte_rate": 300.0})
    assert store.set_quotas(DEFAULT_ENTITY, None, {"consumer_byte_rate": 5.5})
    assert store.set_quotas(None, DEFAULT_ENTITY, {"request_percentage": 50.0})
    assert store.version() == v0 + 5
    assert not store.set_quotas("alice", None, {"producer_byte_rate": 100.0})  # same value
    assert not store.set_quotas("alice", None, {})
    assert store.version() == v0 + 5
    assert store.set_quotas(
        "alice", None, {"producer_byte_rate": 150.0, "consumer_byte_rate": 10.0}
    )
    assert store.quotas() == [
        QuotaRow(None, DEFAULT_ENTITY, "request_percentage", 50.0),
        QuotaRow(DEFAULT_ENTITY, None, "consumer_byte_rate", 5.5),
        QuotaRow("alice", None, "consumer_byte_rate", 10.0),
        QuotaRow("alice", None, "producer_byte_rate", 150.0),
        QuotaRow("alice", DEFAULT_ENTITY, "producer_byte_rate", 300.0),
        QuotaRow("alice", "app", "producer_byte_rate", 200.0),
    ]
    assert store.delete_quotas("alice", None, ["consumer_byte_rate", "request_percentage"])
    assert not store.delete_quotas("alice", None, ["consumer_byte_rate"])
    assert not store.delete_quotas("alice", None, [])
    assert store.delete_quotas("alice", "app")
    assert not store.delete_quotas("nobody", None)
    assert [(q.user, q.client_id) for q in store.quotas()] == [
        (None, DEFAULT_ENTITY),
        (DEFAULT_ENTITY, None),
        ("alice", None),
        ("alice", DEFAULT_ENTITY),
    ]
    with pytest.raises(InvalidSecurityRowError) as e:
        store.set_quotas(None, None, {"producer_byte_rate": 1.0})
    assert e.value.http_status == 400


def test_quota_rows_convert_to_auth_quotas_entities_directly() -> None:
    """The api layer's conversion: None = absent, "<default>" = DEFAULT."""
    assert DEFAULT.value == DEFAULT_ENTITY
    row = QuotaRow(DEFAULT_ENTITY, "app", "producer_byte_rate", 1.0)
    wire = {k: v for k, v in {"user": row.user, "client_id": row.client_id}.items() if v}
    assert QuotaEntity.from_dict(wire) == QuotaEntity(DEFAULT, "app")


# -- versions and snapshots -------------------------------------------------------------------


def test_every_change_bumps_the_security_version_once_and_reads_do_not(
    meta: MetadataStore,
) -> None:
    store = meta.security
    metadata_version = meta.metadata_version()
    changes: list[Callable[[], object]] = [
        lambda: store.create_user("alice", 1),
        lambda: store.add_key("alice", "k1", "h", "", 1),
        lambda: store.add_acls([_acl()], 1),
        lambda: store.set_quotas("alice", None, {"producer_byte_rate": 1.0}),
        lambda: store.set_quotas("alice", None, {"producer_byte_rate": 2.0}),
        lambda: store.ensure_cluster_secret(),
        lambda: store.rotate_cluster_secret(),
        lambda: store.delete_quotas("alice", None),
        lambda: store.remove_acls(AclFilter(principal="User:alice")),
        lambda: store.revoke_key("alice", "k1"),
        lambda: store.delete_user("alice"),
    ]
    reads: list[Callable[[], object]] = [
        store.snapshot,
        store.users,
        store.acls,
        store.quotas,
        store.cluster_secrets,
        lambda: store.key("k1"),
    ]
    for change in changes:
        before = store.version()
        change()
        assert store.version() == before + 1
        for read in reads:
            read()
        assert store.version() == before + 1
    # The counters are separate: topic churn does not reload auth state, nor the reverse.
    assert meta.metadata_version() == metadata_version
    before = store.version()
    meta.create_topic(TopicMeta("t", "0" * 32, 1, 1, {}, 0, 0))
    assert store.version() == before


def test_changes_that_change_nothing_do_not_bump_the_version(store: SecurityStore) -> None:
    store.create_user("alice", 1)
    store.add_acls([_acl()], 1)
    store.ensure_cluster_secret()
    before = store.version()
    assert not store.delete_user("nobody")
    assert not store.revoke_key("alice", "nope")
    assert store.add_acls([_acl()], 2) == 0
    assert store.remove_acls(AclFilter(principal="User:nobody")) == []
    assert not store.delete_quotas("alice", None)
    store.ensure_cluster_secret()
    with pytest.raises(DuplicateResourceError):
        store.create_user("alice", 2)
    assert store.version() == before


def test_a_snapshot_is_one_consistent_state(meta: MetadataStore) -> None:
    """A writer adds ACLs one per transaction while snapshots are read: every snapshot's rows
    are exactly the state its version names (READ COMMITTED would mix two states)."""
    store = meta.security
    base = store.version()
    writes = 40
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(writes):
                store.add_acls([_acl(name=f"t{i}")], i)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen = 0
    while not done.is_set() or seen == 0:
        snap = store.snapshot()
        assert len(snap.acls) == snap.version - base
        seen += 1
    writer.join()
    assert not errors
    final = store.snapshot()
    assert (final.version - base, len(final.acls)) == (writes, writes)


def test_snapshot_holds_every_kind_of_row_and_hides_secrets_from_repr(
    store: SecurityStore,
) -> None:
    store.create_user("alice", 7)
    store.add_key("alice", "k1", "h", "d", 8)
    store.add_acls([_acl()], 9)
    store.set_quotas(None, "app", {"consumer_byte_rate": 3.0})
    secret = store.ensure_cluster_secret()
    snap = store.snapshot()
    assert snap == SecuritySnapshot(
        snap.version,
        users=tuple(store.users()),
        keys=tuple(store.keys("alice")),
        acls=(_acl(),),
        quotas=(QuotaRow(None, "app", "consumer_byte_rate", 3.0),),
        secrets=(secret,),
    )
    assert secret.hex() not in repr(snap) and repr(secret) not in repr(snap)


# -- caps and bad input -----------------------------------------------------------------------


def test_the_acl_cap_is_the_authorizers(store: SecurityStore) -> None:
    assert MAX_ACLS == auth_limits.MAX_ACLS
    assert store.limits.max_acls == MAX_ACLS


def test_caps_allow_exactly_the_limit_and_refuse_past_it(meta: MetadataStore) -> None:
    limits = SecurityLimits(
        max_users=2, max_keys_per_user=2, max_api_keys=3, max_acls=3, max_quota_rows=2
    )
    store = SecurityStore(meta.engine, meta.writer, limits=limits)

    def refused(change: object) -> None:
        assert callable(change)
        before = store.version()
        with pytest.raises(SecurityLimitError) as e:
            change()
        assert (e.value.code, e.value.http_status) == (ErrorCode.POLICY_VIOLATION, 400)
        assert store.version() == before  # nothing changed

    store.create_user("a", 1)
    store.create_user("b", 1)
    refused(lambda: store.create_user("c", 1))
    store.add_key("a", "a1", "h", "", 1)
    store.add_key("a", "a2", "h", "", 1)
    refused(lambda: store.add_key("a", "a3", "h", "", 1))  # per user
    store.add_key("b", "b1", "h", "", 1)
    refused(lambda: store.add_key("b", "b2", "h", "", 1))  # altogether
    assert store.revoke_key("a", "a1")
    store.add_key("b", "b2", "h", "", 1)  # room again
    assert store.add_acls([_acl(name="x"), _acl(name="y")], 1) == 2
    refused(lambda: store.add_acls([_acl(name="z"), _acl(name="w")], 1))  # all or nothing
    assert store.acls() == sorted([_acl(name="x"), _acl(name="y")])
    assert store.add_acls([_acl(name="x"), _acl(name="z")], 1) == 1  # exactly the cap
    assert store.add_acls([_acl(name="x")], 1) == 0  # a no-op at the cap is no error
    refused(lambda: store.add_acls([_acl(name="w")], 1))
    assert store.set_quotas("a", None, {"producer_byte_rate": 1.0, "consumer_byte_rate": 1.0})
    assert store.set_quotas("a", None, {"producer_byte_rate": 2.0})  # an update needs no room
    refused(lambda: store.set_quotas("b", None, {"producer_byte_rate": 1.0}))


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.create_user("", 1),
        lambda s: s.create_user("x" * 256, 1),
        lambda s: s.add_key("alice", "k" * 65, "h", "", 1),
        lambda s: s.add_key("alice", "k", "", "", 1),
        lambda s: s.add_key("alice", "k", "h", "d" * 1025, 1),
        lambda s: s.add_acls([AclRow("User:a", "topic", "n" * 250, "literal", "read", "allow")], 1),
        lambda s: s.add_acls([AclRow("", "topic", "n", "literal", "read", "allow")], 1),
        lambda s: s.set_quotas("", None, {"producer_byte_rate": 1.0}),
        lambda s: s.set_quotas("alice", None, {"q" * 65: 1.0}),
        lambda s: s.delete_quotas(None, None),
        lambda s: s.rotate_cluster_secret(keep_previous=-1),
    ],
)
def test_bad_input_is_a_400_not_a_database_error(store: SecurityStore, change: object) -> None:
    store.create_user("alice", 1)
    assert callable(change)
    with pytest.raises(InvalidSecurityRowError) as e:
        change(store)
    assert e.value.http_status == 400


def test_a_storage_failure_is_a_retriable_503(tmp_path: Path) -> None:
    meta = MetadataStore(f"sqlite:///{tmp_path / 'metadata.db'}")
    with meta.writer.begin() as c:
        c.exec_driver_sql("DROP TABLE acls")
    with pytest.raises(KafkaStorageError) as e:
        meta.security.acls()
    assert (e.value.http_status, e.value.retriable) == (503, True)
    meta.close()


# -- cluster secrets --------------------------------------------------------------------------


def test_brokers_creating_the_cluster_secret_at_once_get_one_secret(url: str) -> None:
    stores = [MetadataStore(url) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    got: list[bytes] = []
    errors: list[BaseException] = []

    def create(s: MetadataStore) -> None:
        try:
            barrier.wait(timeout=WAIT_S)
            got.append(s.security.ensure_cluster_secret())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        assert len(got) == 4 and len(set(got)) == 1 and len(got[0]) == 32
        assert stores[0].security.cluster_secrets() == [got[0]]
    finally:
        for s in stores:
            s.close()


def test_rotation_adds_a_current_secret_and_keeps_a_few_previous(store: SecurityStore) -> None:
    assert store.cluster_secrets() == []
    first = store.ensure_cluster_secret()
    assert store.ensure_cluster_secret() == first
    rotated = [store.rotate_cluster_secret() for _ in range(5)]
    assert len(set([first, *rotated])) == 6  # random, all different
    assert store.cluster_secrets() == rotated[::-1][:4]  # newest first, 3 previous kept
    assert store.ensure_cluster_secret() == rotated[-1]
    after_leak = store.rotate_cluster_secret(keep_previous=0)
    assert store.cluster_secrets() == [after_leak]
    assert store.snapshot().secrets == (after_leak,)


# -- migration ------------------------------------------------------------------------------


def test_migration_0004_downgrades_and_upgrades_again(meta: MetadataStore) -> None:
    store = meta.security
    store.create_user("alice", 1)
    store.ensure_cluster_secret()
    security_tables = {"users", "api_keys", "acls", "quotas", "cluster_secrets"}
    with meta.engine.begin() as c:
        command.downgrade(migrate._config(c), "0003")
    assert migrate.current(meta.engine) == "0003"
    assert not security_tables & set(sa.inspect(meta.engine).get_table_names())
    with meta.engine.connect() as c:
        names = c.exec_driver_sql("SELECT name FROM counters").scalars().all()
    assert "security_version" not in names
    assert migrate.upgrade(meta.engine) == migrate.head() == "0004"
    assert security_tables <= set(sa.inspect(meta.engine).get_table_names())
    assert store.snapshot() == SecuritySnapshot(0, (), (), (), (), ())
    store.create_user("alice", 2)  # usable again
    assert store.version() == 1


# -- the watcher ------------------------------------------------------------------------------


def test_a_change_on_one_broker_reaches_anothers_watcher(url: str) -> None:
    a, b = MetadataStore(url), MetadataStore(url)
    a.security.create_user("alice", 1)
    a.security.add_key("alice", "k1", "h", "", 1)

    async def main() -> None:
        seen: asyncio.Queue[SecuritySnapshot] = asyncio.Queue()
        watcher = SecurityWatcher(b.security, seen.put_nowait, poll_interval_ms=10)
        first = await watcher.refresh()
        assert [k.key_id for k in first.keys] == ["k1"]
        assert await seen.get() == first
        watcher.start()
        await asyncio.to_thread(a.security.revoke_key, "alice", "k1")
        snap = await asyncio.wait_for(seen.get(), WAIT_S)
        assert snap.keys == () and snap.version == first.version + 1
        assert watcher.snapshot == snap
        await watcher.stop()

    try:
        asyncio.run(main())
    finally:
        a.close()
        b.close()


def test_the_watcher_reloads_only_when_the_version_moved(store: SecurityStore) -> None:
    delivered: list[SecuritySnapshot] = []

    async def main() -> None:
        watcher = SecurityWatcher(store, delivered.append)
        assert await watcher.poll_once()  # nothing loaded yet
        assert not await watcher.poll_once()
        assert not await watcher.poll_once()
        await asyncio.to_thread(store.create_user, "alice", 1)
        assert await watcher.poll_once()
        assert not await watcher.poll_once()

    asyncio.run(main())
    assert [len(s.users) for s in delivered] == [0, 1]


class _Sequenced:
    """A store whose snapshot reads finish in the order the test releases them (a refresh
    after a local change racing a poll that read the store before the change)."""

    def __init__(self, store: SecurityStore) -> None:
        self.store = store
        self.snapshots: list[SecuritySnapshot] = []

    def version(self) -> int:
        return self.store.version()

    def snapshot(self) -> SecuritySnapshot:
        return self.snapshots.pop(0)


def test_an_older_snapshot_delivered_late_is_dropped(store: SecurityStore) -> None:
    old = store.snapshot()
    store.create_user("alice", 1)
    new = store.snapshot()
    assert new.version > old.version
    source = _Sequenced(store)
    delivered: list[SecuritySnapshot] = []

    async def main() -> None:
        watcher = SecurityWatcher(source, delivered.append)
        source.snapshots = [new, old]  # the refresh after the change finishes first
        await watcher.refresh()
        await watcher.refresh()  # the poll that read before the change, last
        assert watcher.snapshot == new

    asyncio.run(main())
    assert delivered == [new]


class _Flaky:
    """A store whose reads fail ``failures`` times first (a database restarting)."""

    def __init__(self, store: SecurityStore, failures: int) -> None:
        self.store = store
        self.failures = failures
        self.calls = 0

    def version(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaStorageError("metadata store failed (restarting); nothing was changed")
        return self.store.version()

    def snapshot(self) -> SecuritySnapshot:
        return self.store.snapshot()


def test_the_watcher_survives_store_and_callback_errors(
    store: SecurityStore, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = _Flaky(store, failures=3)
    delivered: list[SecuritySnapshot] = []
    clock = [100.0]

    async def main() -> None:
        got = asyncio.Event()
        callback_failures = [1]

        def on_change(snap: SecuritySnapshot) -> None:
            if callback_failures[0]:
                callback_failures[0] -= 1
                raise RuntimeError("index build failed")
            delivered.append(snap)
            got.set()

        watcher = SecurityWatcher(flaky, on_change, poll_interval_ms=5, clock=lambda: clock[0])
        assert watcher.stale_for_s is None
        task = watcher.start()
        await asyncio.wait_for(got.wait(), WAIT_S)
        assert flaky.calls >= 5  # 3 store failures, 1 callback failure, 1 success
        assert watcher.failures == 0 and watcher.snapshot == delivered[0]
        await watcher.stop()
        assert task.cancelled()
        clock[0] += 2.5  # the injected clock: no poll since
        assert watcher.stale_for_s == 2.5
        await watcher.stop()  # twice is fine

    with caplog.at_level("INFO", logger="cluster.security_watcher"):
        asyncio.run(main())
    assert len(delivered) == 1
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # an outage logs once, not every tick
    assert any("refreshed again" in r.getMessage() for r in caplog.records)


def test_a_watcher_refuses_a_nonpositive_interval(store: SecurityStore) -> None:
    with pytest.raises(ValueError):
        SecurityWatcher(store, print, poll_interval_ms=0)
