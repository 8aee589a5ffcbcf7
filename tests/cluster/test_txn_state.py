"""The transaction coordinator's state machine (cluster/txn_state.py): every transition and
error, the KIP-890 delayed-request scenario, zombie fencing, timeouts, records and replay."""

from __future__ import annotations

import itertools
import zlib

import orjson
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from cluster.txn_state import (
    MAX_EPOCH,
    MAX_PARTITIONS_PER_TXN,
    PERSISTED_STATES,
    TRANSACTION_MAX_TIMEOUT_MS,
    TRANSACTIONAL_ID_EXPIRATION_MS,
    TRANSITIONS,
    IllegalTransitionError,
    TxnConfig,
    TxnCoordinatorState,
    TxnMetadata,
    TxnRecord,
    TxnRecordError,
    TxnResult,
    TxnState,
    check_transition,
    decode_key,
    decode_metadata,
    encode_key,
    encode_metadata,
    encode_record,
    txn_state_partition,
    validate_transactional_id,
)
from core_log.errors import CorruptRecordError, ErrorCode, LogbusError

T0 = 1_700_000_000_000
TIMEOUT_MS = 60_000
E = ErrorCode


class Coordinator:
    """The state plus what a caller does with results: write the record, then apply."""

    def __init__(self, coordinator_epoch: int = 3, config: TxnConfig | None = None) -> None:
        self.state = TxnCoordinatorState(coordinator_epoch=coordinator_epoch)
        if config is not None:
            self.state.config = config
        self.records: list[TxnRecord] = []
        self.now = T0
        self._ids = itertools.count(1000)

    def allocate(self) -> int:
        return next(self._ids)

    def run(self, result: TxnResult) -> TxnResult:
        if result.record is not None:
            self.records.append(result.record)
            self.state.apply(result)
        return result

    def init(self, txn: str = "t", timeout_ms: int = TIMEOUT_MS) -> TxnResult:
        return self.run(self.state.init_producer_id(txn, timeout_ms, self.now, self.allocate))

    def add(self, pid: int, epoch: int, *tps: tuple[str, int], txn: str = "t") -> TxnResult:
        return self.run(self.state.add_partitions(txn, pid, epoch, tps, self.now))

    def offsets(self, pid: int, epoch: int, group: str, txn: str = "t") -> TxnResult:
        return self.run(self.state.add_offsets(txn, pid, epoch, group, self.now))

    def end(self, pid: int, epoch: int, commit: bool, txn: str = "t") -> TxnResult:
        return self.run(self.state.end_txn(txn, pid, epoch, commit, self.now, self.allocate))

    def complete(self, txn: str = "t") -> TxnResult:
        return self.run(self.state.complete(txn, self.now))

    def meta(self, txn: str = "t") -> TxnMetadata:
        return self.state.transactions[txn]

    def reloaded(self) -> TxnCoordinatorState:
        return TxnCoordinatorState.load(self.records, coordinator_epoch=4)


def began(c: Coordinator, txn: str = "t") -> tuple[int, int]:
    """An initialised producer with an open transaction on ("a", 0): (pid, epoch)."""
    r = c.init(txn)
    assert r.ok
    assert c.add(r.producer_id, r.producer_epoch, ("a", 0), txn=txn).ok
    return r.producer_id, r.producer_epoch


def fails(r: TxnResult, code: ErrorCode) -> None:
    assert r.error is code, (r.error, r.message)
    assert r.record is None and r.markers is None


# -- table, ids, partitions -----------------------------------------------------------------------


def test_transition_table_is_checked_for_every_pair() -> None:
    for old, new in itertools.product(TxnState, TxnState):
        if new in TRANSITIONS[old]:
            check_transition(old, new)
        else:
            with pytest.raises(IllegalTransitionError):
                check_transition(old, new)
    check_transition(None, TxnState.EMPTY)
    with pytest.raises(IllegalTransitionError):
        check_transition(None, TxnState.ONGOING)
    m = TxnMetadata("t", 1, 0, TIMEOUT_MS, TxnState.PREPARE_COMMIT)
    with pytest.raises(IllegalTransitionError):
        m.to(TxnState.ONGOING)
    assert issubclass(IllegalTransitionError, AssertionError)  # a bug, not a client's error


def test_kafka_transitions() -> None:
    assert TRANSITIONS[TxnState.ONGOING] >= {TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT}
    assert TRANSITIONS[TxnState.PREPARE_COMMIT] == {TxnState.COMPLETE_COMMIT}
    assert TRANSITIONS[TxnState.PREPARE_EPOCH_FENCE] == {TxnState.PREPARE_ABORT}
    assert TRANSITIONS[TxnState.DEAD] == frozenset()
    assert TxnState.DEAD not in PERSISTED_STATES
    assert TxnState.PREPARE_EPOCH_FENCE not in PERSISTED_STATES


def test_partition_of_a_transactional_id() -> None:
    assert txn_state_partition("my-app-1") == zlib.crc32(b"my-app-1") % 50
    assert txn_state_partition("my-app-1", 7) == zlib.crc32(b"my-app-1") % 7
    assert {txn_state_partition(f"t{i}") for i in range(2000)} == set(range(50))


@pytest.mark.parametrize("good", ["a", "A.b_c-9", "x" * 249])
def test_valid_transactional_ids(good: str) -> None:
    assert validate_transactional_id(good) == good


@pytest.mark.parametrize("bad", ["", "x" * 250, "a b", "a/b", "é", None, 5])
def test_invalid_transactional_ids(bad: object) -> None:
    with pytest.raises(LogbusError) as e:
        validate_transactional_id(bad)
    assert e.value.code is E.INVALID_REQUEST and e.value.http_status == 400
    c = Coordinator()
    r = c.state.init_producer_id(bad, TIMEOUT_MS, T0, c.allocate)  # type: ignore[arg-type]
    fails(r, E.INVALID_REQUEST)


def test_error_codes_are_kafkas() -> None:
    assert E.INVALID_PRODUCER_ID_MAPPING.kafka_code == 49
    assert E.INVALID_TRANSACTION_TIMEOUT.kafka_code == 50
    assert (E.CONCURRENT_TRANSACTIONS.kafka_code, E.CONCURRENT_TRANSACTIONS.retriable) == (51, True)
    assert E.PRODUCER_FENCED.kafka_code == 90
    assert E.TRANSACTIONAL_ID_NOT_FOUND.kafka_code == 105
    codes = [m.kafka_code for m in E]  # a tuple equal to another would make an alias
    assert len(codes) == len(set(codes))
    for code in (E.INVALID_PRODUCER_ID_MAPPING, E.PRODUCER_FENCED, E.INVALID_TRANSACTION_TIMEOUT):
        assert 400 <= code.http_status < 500 and not code.retriable
    exc = Coordinator().state.add_partitions("nope", 1, 0, [("a", 0)], T0).exception()
    assert exc.code is E.INVALID_PRODUCER_ID_MAPPING and exc.detail["transactional_id"] == "nope"


# -- init -----------------------------------------------------------------------------------------


def test_init_allocates_then_bumps_the_epoch() -> None:
    c = Coordinator()
    r = c.init()
    assert r.ok and (r.producer_id, r.producer_epoch) == (1000, 0)
    assert r.record is not None and r.record.key == b'["txn","t"]'
    m = c.meta()
    assert (m.state, m.timeout_ms, m.last_update_ms, m.start_ms) == (
        TxnState.EMPTY,
        TIMEOUT_MS,
        T0,
        -1,
    )
    c.now += 5
    r2 = c.init(timeout_ms=30_000)
    assert (r2.producer_id, r2.producer_epoch) == (1000, 1)
    assert c.meta().timeout_ms == 30_000 and c.meta().last_update_ms == T0 + 5
    assert len(c.records) == 2


@pytest.mark.parametrize("timeout_ms", [0, -1, TRANSACTION_MAX_TIMEOUT_MS + 1])
def test_init_refuses_a_bad_timeout(timeout_ms: int) -> None:
    c = Coordinator()
    fails(c.init(timeout_ms=timeout_ms), E.INVALID_TRANSACTION_TIMEOUT)
    assert c.init(timeout_ms=TRANSACTION_MAX_TIMEOUT_MS).ok


def test_init_fences_a_zombie_by_aborting_its_transaction() -> None:
    c = Coordinator()
    pid, epoch = began(c)
    assert c.offsets(pid, epoch, "g").ok
    r = c.init()  # a new instance of the application starts
    assert r.error is E.CONCURRENT_TRANSACTIONS and r.error.retriable
    assert r.record is not None and r.markers is not None
    m = c.meta()
    assert (m.state, m.producer_epoch, m.last_producer_epoch) == (TxnState.PREPARE_ABORT, 1, -1)
    mk = r.markers
    assert (mk.producer_id, mk.producer_epoch, mk.commit, mk.coordinator_epoch) == (
        pid,
        1,
        False,
        3,
    )
    assert mk.partitions == {("a", 0)} and mk.groups == {"g"}
    fails(c.init(), E.CONCURRENT_TRANSACTIONS)  # markers not written yet
    # the zombie can neither add nor decide anything any more
    fails(c.add(pid, epoch, ("b", 0)), E.PRODUCER_FENCED)
    fails(c.end(pid, epoch, True), E.PRODUCER_FENCED)
    fails(c.end(pid, epoch, False), E.PRODUCER_FENCED)
    assert c.complete().ok and c.meta().state is TxnState.COMPLETE_ABORT
    r = c.init()
    assert r.ok and (r.producer_id, r.producer_epoch) == (pid, 2)
    fails(c.add(pid, epoch, ("b", 0)), E.PRODUCER_FENCED)
    fails(c.add(pid, 1, ("b", 0)), E.PRODUCER_FENCED)  # the fence epoch was never handed out
    assert c.add(pid, 2, ("b", 0)).ok


def test_init_past_the_last_epoch_takes_a_new_producer_id() -> None:
    c = Coordinator()
    c.init()
    c.state.transactions["t"] = TxnMetadata("t", 7, MAX_EPOCH - 1, TIMEOUT_MS, TxnState.EMPTY)
    r = c.init()
    assert (r.producer_id, r.producer_epoch) == (1001, 0)
    fails(c.add(7, MAX_EPOCH - 1, ("a", 0)), E.INVALID_PRODUCER_ID_MAPPING)


def test_too_many_transactional_ids() -> None:
    c = Coordinator(config=TxnConfig(max_transactional_ids=2))
    assert c.init("a").ok and c.init("b").ok
    r = c.init("c")
    fails(r, E.BROKER_BUSY)
    assert r.error is not None and r.error.retriable
    assert c.init("a").ok  # known ids still re-init


# -- add ------------------------------------------------------------------------------------------


def test_add_begins_then_extends_the_transaction() -> None:
    c = Coordinator()
    r = c.init()
    pid, epoch = r.producer_id, r.producer_epoch
    c.now += 10
    r = c.add(pid, epoch, ("a", 0), ("a", 1))
    assert r.ok and r.record is not None
    m = c.meta()
    assert (m.state, m.start_ms) == (TxnState.ONGOING, T0 + 10)
    assert m.partitions == {("a", 0), ("a", 1)}
    c.now += 10
    assert c.add(pid, epoch, ("a", 1)).record is None  # nothing new: nothing written
    assert c.offsets(pid, epoch, "g").record is not None
    assert c.offsets(pid, epoch, "g").record is None
    r = c.add(pid, epoch, ("b", 3))
    m = c.meta()
    assert r.record is not None and m.start_ms == T0 + 10 and m.last_update_ms == T0 + 20
    assert m.partitions == {("a", 0), ("a", 1), ("b", 3)} and m.groups == {"g"}
    assert len(c.records) == 4


def test_add_of_nothing_begins_nothing() -> None:
    c = Coordinator()
    r = c.init()
    r2 = c.add(r.producer_id, r.producer_epoch)
    assert r2.ok and r2.record is None and c.meta().state is TxnState.EMPTY


def test_add_fencing() -> None:
    c = Coordinator()
    fails(c.add(1, 0, ("a", 0), txn="unknown"), E.INVALID_PRODUCER_ID_MAPPING)
    fails(c.offsets(1, 0, "g", txn="unknown"), E.INVALID_PRODUCER_ID_MAPPING)
    r = c.init()
    c.init()  # epoch 1
    pid = r.producer_id
    fails(c.add(pid + 1, 1, ("a", 0)), E.INVALID_PRODUCER_ID_MAPPING)
    fails(c.add(pid, 0, ("a", 0)), E.PRODUCER_FENCED)
    fails(c.offsets(pid, 0, "g"), E.PRODUCER_FENCED)
    fails(c.add(pid, 2, ("a", 0)), E.PRODUCER_FENCED)  # an epoch never handed out
    assert c.add(pid, 1, ("a", 0)).ok


def test_add_during_prepare_is_retriable() -> None:
    c = Coordinator()
    pid, epoch = began(c)
    r = c.end(pid, epoch, True)
    fails(c.add(r.producer_id, r.producer_epoch, ("a", 1)), E.CONCURRENT_TRANSACTIONS)
    fails(c.offsets(r.producer_id, r.producer_epoch, "g"), E.CONCURRENT_TRANSACTIONS)
    c.complete()
    assert c.add(r.producer_id, r.producer_epoch, ("a", 1)).ok
    m = c.meta()
    assert m.state is TxnState.ONGOING and m.partitions == {("a", 1)}  # a new transaction


@pytest.mark.parametrize(
    "tp", [("", 0), ("a", -1), ("a", 2**31), ("x" * 250, 0), ("a", True), ("a",), "a0"]
)
def test_add_refuses_a_bad_partition(tp: object) -> None:
    c = Coordinator()
    r = c.init()
    bad = c.state.add_partitions("t", r.producer_id, 0, [tp], T0)  # type: ignore[list-item]
    fails(bad, E.INVALID_REQUEST)


def test_add_offsets_refuses_a_bad_group() -> None:
    c = Coordinator()
    r = c.init()
    fails(c.offsets(r.producer_id, 0, "a b"), E.INVALID_GROUP_ID)
    fails(c.offsets(r.producer_id, 0, ""), E.INVALID_GROUP_ID)


def test_limits_on_partitions_and_groups() -> None:
    assert MAX_PARTITIONS_PER_TXN == 10_000
    c = Coordinator(config=TxnConfig(max_partitions_per_txn=3, max_groups_per_txn=1))
    r = c.init()
    pid = r.producer_id
    assert c.add(pid, 0, ("a", 0), ("a", 1)).ok
    r = c.add(pid, 0, ("a", 2), ("a", 3))
    fails(r, E.INVALID_REQUEST)
    assert r.error is not None and r.error.http_status == 400 and "3 partitions" in r.message
    assert c.add(pid, 0, ("a", 2)).ok
    assert c.offsets(pid, 0, "g1").ok
    fails(c.offsets(pid, 0, "g2"), E.INVALID_REQUEST)
    assert c.meta().partitions == {("a", 0), ("a", 1), ("a", 2)}


def test_a_write_in_flight_reserves_the_id() -> None:
    c = Coordinator()
    r = c.init()
    pid = r.producer_id
    held = c.state.add_partitions("t", pid, 0, [("a", 0)], T0)  # not written yet
    assert held.record is not None
    fails(c.add(pid, 0, ("a", 1)), E.CONCURRENT_TRANSACTIONS)
    fails(c.end(pid, 0, False), E.CONCURRENT_TRANSACTIONS)
    fails(c.init(), E.CONCURRENT_TRANSACTIONS)
    fails(c.complete(), E.CONCURRENT_TRANSACTIONS)
    assert c.state.expire(T0 + 10 * TRANSACTIONAL_ID_EXPIRATION_MS) == []
    c.state.abandon(held)  # the write failed: nothing changed
    assert c.meta().state is TxnState.EMPTY and not c.state.pending
    assert c.add(pid, 0, ("a", 1)).ok
    with pytest.raises(AssertionError):
        c.state.apply(held)  # a stale result is never applied


# -- end / complete -------------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_end_bumps_the_epoch_and_returns_markers(commit: bool) -> None:
    c = Coordinator()
    pid, epoch = began(c)
    c.offsets(pid, epoch, "g")
    c.now += 7
    r = c.end(pid, epoch, commit)
    assert r.ok and (r.producer_id, r.producer_epoch) == (pid, epoch + 1)
    m = c.meta()
    prepared = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    assert (m.state, m.producer_epoch, m.last_producer_epoch, m.last_update_ms) == (
        prepared,
        epoch + 1,
        epoch,
        T0 + 7,
    )
    mk = r.markers
    assert mk is not None
    assert (mk.producer_id, mk.producer_epoch, mk.commit, mk.coordinator_epoch) == (
        pid,
        epoch + 1,
        commit,
        3,
    )
    assert mk.partitions == {("a", 0)} and mk.groups == {"g"}
    assert c.state.pending_markers() == [mk]
    c.now += 1
    done = c.complete()
    assert done.ok and done.markers is None
    m = c.meta()
    assert m.state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    assert (m.partitions, m.groups, m.start_ms, m.last_update_ms) == (
        frozenset(),
        frozenset(),
        -1,
        T0 + 8,
    )
    assert c.state.pending_markers() == []


@pytest.mark.parametrize("commit", [True, False])
def test_a_retried_end_gets_the_same_answer(commit: bool) -> None:
    c = Coordinator()
    pid, epoch = began(c)
    first = c.end(pid, epoch, commit)
    for _ in range(2):  # during PREPARE_*, then after COMPLETE_*
        again = c.end(pid, epoch, commit)
        assert again.ok and again.record is None and again.markers is None
        assert (again.producer_id, again.producer_epoch) == (
            first.producer_id,
            first.producer_epoch,
        )
        fails(c.end(pid, epoch, not commit), E.INVALID_TXN_STATE)
        c.complete()


def test_end_errors() -> None:
    c = Coordinator()
    fails(c.end(1, 0, True, txn="unknown"), E.INVALID_PRODUCER_ID_MAPPING)
    r = c.init()
    pid = r.producer_id
    fails(c.end(pid, 0, True), E.INVALID_TXN_STATE)  # commit with nothing open
    aborted = c.end(pid, 0, False)  # abort with nothing sent: a no-op success
    assert aborted.ok and aborted.record is None and aborted.producer_epoch == 0
    fails(c.end(pid + 1, 0, False), E.INVALID_PRODUCER_ID_MAPPING)
    c.add(pid, 0, ("a", 0))
    fails(c.end(pid, 1, True), E.PRODUCER_FENCED)
    r = c.end(pid, 0, True)
    fails(c.end(pid, 1, True), E.CONCURRENT_TRANSACTIONS)  # the new epoch while completing
    c.complete()
    fails(c.end(pid, 1, True), E.INVALID_TXN_STATE)  # nothing open to commit
    assert c.end(pid, 1, False).ok  # nor to abort: a no-op
    assert c.meta().state is TxnState.COMPLETE_COMMIT


def test_complete_errors() -> None:
    c = Coordinator()
    fails(c.complete("unknown"), E.TRANSACTIONAL_ID_NOT_FOUND)
    began(c)
    fails(c.complete(), E.INVALID_TXN_STATE)


def test_end_at_the_last_epoch_rotates_the_producer_id() -> None:
    c = Coordinator()
    c.init()
    top = MAX_EPOCH - 1
    c.state.transactions["t"] = TxnMetadata(
        "t", 7, top, TIMEOUT_MS, TxnState.ONGOING, frozenset({("a", 0)}), start_ms=T0
    )
    r = c.end(7, top, True)
    assert r.ok and (r.producer_id, r.producer_epoch) == (1001, 0)
    mk = r.markers
    assert mk is not None and (mk.producer_id, mk.producer_epoch) == (7, MAX_EPOCH)
    again = c.end(7, top, True)  # the retry carries the old id
    assert again.ok and (again.producer_id, again.producer_epoch) == (1001, 0)
    fails(c.add(7, top, ("a", 1)), E.PRODUCER_FENCED)
    assert c.reloaded().pending_markers()[0].producer_epoch == MAX_EPOCH
    c.complete()
    fails(c.add(7, top, ("a", 1)), E.PRODUCER_FENCED)
    assert c.add(1001, 0, ("a", 1)).ok


# -- KIP-890: a delayed request of transaction 1 cannot touch transaction 2 -----------------------


@pytest.mark.parametrize("commit_first", [True, False])
def test_delayed_end_and_add_cannot_reach_the_next_transaction(commit_first: bool) -> None:
    c = Coordinator()
    pid, e1 = began(c)
    delayed_end = (pid, e1, commit_first)  # sent, answered, but also held by the network
    r = c.end(pid, e1, commit_first)
    c.complete()
    e2 = r.producer_epoch
    assert e2 == e1 + 1
    assert c.add(pid, e2, ("b", 0)).ok  # transaction 2 begins
    # the held copy of transaction 1's end arrives: it decides nothing
    fails(c.end(*delayed_end), E.PRODUCER_FENCED)
    fails(c.end(pid, e1, not commit_first), E.PRODUCER_FENCED)
    # a delayed add of transaction 1 cannot join transaction 2 either
    fails(c.add(pid, e1, ("c", 0)), E.PRODUCER_FENCED)
    fails(c.offsets(pid, e1, "g"), E.PRODUCER_FENCED)
    m = c.meta()
    assert m.state is TxnState.ONGOING and m.partitions == {("b", 0)} and not m.groups
    # transaction 2 ends by its own epoch only; its markers fence e2 at every partition
    r2 = c.end(pid, e2, False)
    assert r2.markers is not None and r2.markers.producer_epoch == e2 + 1
    fails(c.end(*delayed_end), E.PRODUCER_FENCED)


# -- timeouts, expiration, admin ------------------------------------------------------------------


def test_transaction_timeout_aborts_with_an_epoch_bump() -> None:
    c = Coordinator()
    pid, epoch = began(c)
    start = c.meta().start_ms
    assert c.state.expire(start + TIMEOUT_MS) == []  # Kafka: strictly past the deadline
    (r,) = c.state.expire(start + TIMEOUT_MS + 1)
    c.run(r)
    assert r.ok and r.markers is not None and not r.markers.commit
    assert (r.markers.producer_id, r.markers.producer_epoch) == (pid, epoch + 1)
    m = c.meta()
    assert (m.state, m.producer_epoch, m.last_producer_epoch) == (
        TxnState.PREPARE_ABORT,
        epoch + 1,
        -1,
    )
    assert c.state.expire(start + 10 * TIMEOUT_MS) == []  # PREPARE_* waits for its markers
    fails(c.end(pid, epoch, True), E.PRODUCER_FENCED)  # the late client is fenced
    fails(c.end(pid, epoch, False), E.PRODUCER_FENCED)
    fails(c.add(pid, epoch, ("a", 1)), E.PRODUCER_FENCED)
    c.complete()
    assert c.init().producer_epoch == epoch + 2


def test_idle_ids_expire_to_a_tombstone() -> None:
    c = Coordinator()
    c.init("idle")
    began(c, "busy")
    c.now = T0 + TRANSACTIONAL_ID_EXPIRATION_MS - 1
    (timed_out,) = c.state.expire(c.now)  # busy's transaction timed out; idle is not yet idle
    assert timed_out.transactional_id == "busy" and timed_out.markers is not None
    c.run(timed_out)
    c.now += 1
    (dead,) = c.state.expire(c.now)  # busy is PREPARE_ABORT: it waits for its markers
    assert dead.metadata is not None and dead.metadata.state is TxnState.DEAD
    assert dead.record == TxnRecord(b'["txn","idle"]', None)
    c.run(dead)
    assert set(c.state.transactions) == {"busy"}
    assert c.reloaded().transactions == c.state.transactions
    fails(c.end(1, 0, False, txn="idle"), E.INVALID_PRODUCER_ID_MAPPING)
    assert c.init("idle").producer_epoch == 0  # a fresh start
    c.complete("busy")
    c.now += TRANSACTIONAL_ID_EXPIRATION_MS
    assert [r.transactional_id for r in c.state.expire(c.now)] == ["busy", "idle"]


def test_expire_limit() -> None:
    c = Coordinator()
    for i in range(5):
        c.init(f"t{i}")
    later = T0 + TRANSACTIONAL_ID_EXPIRATION_MS
    first = c.state.expire(later, limit=2)
    assert len(first) == 2
    assert len(c.state.expire(later, limit=10)) == 3  # the two pending are skipped


def test_a_coordinator_abort_fences_the_session_until_init() -> None:
    c = Coordinator()
    pid, epoch = began(c)
    c.run(c.state.admin_abort("t", c.now))
    c.complete()
    fence = c.meta().producer_epoch
    assert fence == epoch + 1
    for e in (epoch, fence):  # the old epoch, and the fence epoch nobody was given
        fails(c.add(pid, e, ("a", 1)), E.PRODUCER_FENCED)
        fails(c.end(pid, e, False), E.PRODUCER_FENCED)
        fails(c.end(pid, e, True), E.PRODUCER_FENCED)
    r = c.init()
    assert (r.producer_id, r.producer_epoch) == (pid, fence + 1)
    assert c.add(pid, fence + 1, ("a", 1)).ok


def test_a_fence_at_the_last_epoch_cannot_be_used() -> None:
    c = Coordinator()
    c.init()
    top = MAX_EPOCH - 1
    c.state.transactions["t"] = TxnMetadata(
        "t", 7, top, TIMEOUT_MS, TxnState.ONGOING, frozenset({("a", 0)}), start_ms=T0
    )
    (r,) = c.state.expire(T0 + TIMEOUT_MS + 1)
    c.run(r)
    assert r.markers is not None and r.markers.producer_epoch == MAX_EPOCH
    c.complete()
    fails(c.add(7, MAX_EPOCH, ("a", 0)), E.PRODUCER_FENCED)
    r = c.init()
    assert (r.producer_id, r.producer_epoch) == (1001, 0)


def test_admin_abort() -> None:
    c = Coordinator()
    fails(c.run(c.state.admin_abort("nope", c.now)), E.TRANSACTIONAL_ID_NOT_FOUND)
    r = c.init()
    fails(c.run(c.state.admin_abort("t", c.now)), E.INVALID_TXN_STATE)
    pid, epoch = r.producer_id, r.producer_epoch
    c.add(pid, epoch, ("a", 0))
    a = c.run(c.state.admin_abort("t", c.now))
    assert a.ok and a.markers is not None and a.markers.producer_epoch == epoch + 1
    fails(c.run(c.state.admin_abort("t", c.now)), E.CONCURRENT_TRANSACTIONS)
    fails(c.end(pid, epoch, True), E.PRODUCER_FENCED)


def test_list_transactions() -> None:
    c = Coordinator()
    c.init("idle")
    began(c, "old")
    c.now += 30_000
    began(c, "new")
    c.now += 1_000
    assert [m.transactional_id for m in c.state.list_transactions(c.now)] == ["idle", "new", "old"]
    ongoing = c.state.list_transactions(c.now, states=[TxnState.ONGOING])
    assert [m.transactional_id for m in ongoing] == ["new", "old"]
    hanging = c.state.list_transactions(c.now, min_duration_ms=10_000)
    assert [(m.transactional_id, m.duration_ms(c.now)) for m in hanging] == [("old", 31_000)]
    assert c.state.list_transactions(c.now, states=[TxnState.DEAD]) == []


# -- records and load -----------------------------------------------------------------------------


def test_record_round_trip() -> None:
    m = TxnMetadata(
        "t",
        5,
        9,
        TIMEOUT_MS,
        TxnState.PREPARE_COMMIT,
        frozenset({("b", 1), ("a", 2), ("a", 0)}),
        frozenset({"g2", "g1"}),
        start_ms=T0,
        last_update_ms=T0 + 1,
        last_producer_epoch=8,
        previous_producer_id=4,
    )
    value = encode_metadata(m)
    doc = orjson.loads(value)
    assert doc["v"] == 1 and doc["partitions"] == {"a": [0, 2], "b": [1]}
    assert doc["groups"] == ["g1", "g2"] and doc["state"] == "PREPARE_COMMIT"
    assert decode_metadata("t", value) == m
    assert decode_key(encode_key("t")) == "t"
    assert encode_record(m.to(TxnState.COMPLETE_COMMIT, partitions=frozenset(), groups=frozenset()))
    assert encode_record(TxnMetadata("t", 1, 0, 1, TxnState.EMPTY).to(TxnState.DEAD)).value is None


def _value(**changes: object) -> bytes:
    doc = orjson.loads(encode_metadata(TxnMetadata("t", 1, 0, TIMEOUT_MS, TxnState.EMPTY)))
    doc.update(changes)
    return orjson.dumps(doc)


CORRUPT_VALUES = [
    b"",
    b"not json",
    b"[1, 2]",
    _value(v=2),
    _value(state="PREPARE_EPOCH_FENCE"),
    _value(state="DEAD"),
    _value(state="Nope"),
    _value(state=3),
    _value(producer_id=-1),
    _value(producer_id=True),
    _value(producer_epoch=MAX_EPOCH + 1),
    _value(timeout_ms=0),
    _value(start_ms="0"),
    _value(partitions={"a": [0]}),  # EMPTY holds no partitions
    _value(groups=["g"]),
    _value(partitions=[["a", 0]]),
    _value(partitions={"a": [-1]}, state="ONGOING"),
    _value(partitions={"": [0]}, state="ONGOING"),
    _value(groups=[""], state="ONGOING"),
    _value(groups="g", state="ONGOING"),
]


@pytest.mark.parametrize("value", CORRUPT_VALUES)
def test_malformed_values_are_rejected_clearly(value: bytes) -> None:
    with pytest.raises(TxnRecordError) as e:
        decode_metadata("t", value)
    assert isinstance(e.value, CorruptRecordError) and "transaction state" in e.value.message


@pytest.mark.parametrize(
    "key", [None, b"", b"{}", b'["txn"]', b'["offset","t"]', b'["txn",""]', b'["txn",5]']
)
def test_malformed_keys_are_rejected(key: bytes | None) -> None:
    with pytest.raises(TxnRecordError):
        decode_key(key)


def test_load_skips_and_counts_corrupt_records() -> None:
    c = Coordinator()
    began(c)
    c.init("u")
    good = list(c.records)
    bad = [TxnRecord(b'["txn","t"]', v) for v in CORRUPT_VALUES] + [TxnRecord(b"junk", b"{}")]
    loaded = TxnCoordinatorState.load(good + bad)
    assert loaded.corrupt_records == len(bad)
    assert loaded.transactions == c.state.transactions  # t keeps its last good record


def test_load_replays_in_order_and_tombstones_delete() -> None:
    c = Coordinator()
    pid, epoch = began(c)
    c.end(pid, epoch, True)
    began(c, "u")
    c.records.append(TxnRecord(encode_key("u"), None))
    loaded = TxnCoordinatorState.load(c.records, coordinator_epoch=9)
    assert set(loaded.transactions) == {"t"} and loaded.corrupt_records == 0
    assert loaded.transactions["t"] == c.meta()
    (mk,) = loaded.pending_markers()  # a failover mid-commit: the new leader rewrites them
    assert (mk.producer_id, mk.producer_epoch, mk.commit, mk.coordinator_epoch) == (
        pid,
        epoch + 1,
        True,
        9,
    )
    assert loaded.complete("t", c.now).ok


# -- replay equivalence, a rule-based test --------------------------------------------------------

IDS = ["a", "z"]
TPS = st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 2)), max_size=3)
STEPS_MS = st.one_of(  # mostly short steps, so that transactions get to end
    st.sampled_from([0, 1, 500, 1_000]),
    st.sampled_from([TIMEOUT_MS + 1, TRANSACTIONAL_ID_EXPIRATION_MS]),
)
WHO = st.sampled_from(["current"] * 6 + ["stale", "other"])


class TxnMachine(RuleBasedStateMachine):
    """Random operations on a few ids with a fake clock; every record written goes into a log.
    After every step the log replays to the live state; no transition is illegal; no producer
    id's epoch goes back; nothing but the current producer session writes a transaction."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self._ids = itertools.count(1)
        # "z" starts near the last epoch (as if loaded), so ends and inits rotate its id
        seed = TxnMetadata("z", 999, MAX_EPOCH - 3, TIMEOUT_MS, TxnState.EMPTY, last_update_ms=T0)
        self.records: list[TxnRecord] = [encode_record(seed)]
        self.state = TxnCoordinatorState.load(self.records, coordinator_epoch=1)
        self.sessions: dict[str, list[tuple[int, int]]] = {"z": [(999, MAX_EPOCH - 3)]}
        self.top_epoch: dict[int, int] = {999: MAX_EPOCH - 3}
        self.held: TxnResult | None = None

    def allocate(self) -> int:
        return next(self._ids)

    def _who(self, txn: str, who: str) -> tuple[int, int]:
        seen = self.sessions.get(txn, [])
        if who == "current" and seen:
            return seen[-1]
        if who == "stale" and len(seen) > 1:
            return seen[-2]
        return (12345, 0)

    def _epoch_seen(self, pid: int, epoch: int) -> None:
        assert epoch >= self.top_epoch.get(pid, -1), f"producer {pid} epoch went back to {epoch}"
        self.top_epoch[pid] = epoch

    def _resolve(self, r: TxnResult, fail: bool) -> None:
        before, after = r.before, r.metadata
        assert after is not None and r.record is not None
        check_transition(before.state if before else None, after.state)
        if fail:
            self.state.abandon(r)
            return
        self.records.append(r.record)
        self.state.apply(r)
        event(f"{before.state.name if before else 'new'} -> {after.state.name}")
        if r.markers is not None and r.markers.producer_id != after.producer_id:
            event("producer id rotated at an end")
        self._epoch_seen(after.producer_id, after.producer_epoch)
        if r.markers is not None:
            self._epoch_seen(r.markers.producer_id, r.markers.producer_epoch)

    def _run(self, r: TxnResult, fail: bool = False, hold: bool = False) -> TxnResult:
        if r.record is None:
            assert r.transactional_id not in self.state.pending or r.error is not None
            return r
        if hold and self.held is None:
            self.held = r
            return r
        self._resolve(r, fail)
        if not fail:
            self._handed_out(r)
        return r

    def _handed_out(self, r: TxnResult) -> None:
        """Note the session an applied, successful answer gave the client."""
        seen = self.sessions.setdefault(r.transactional_id, [])
        session = (r.producer_id, r.producer_epoch)
        if r.ok and (not seen or seen[-1] != session):
            seen.append(session)

    @rule(
        txn=st.sampled_from(IDS),
        timeout=st.sampled_from([TIMEOUT_MS, TIMEOUT_MS, 1_000, 0]),
        fail=st.booleans(),
    )
    def init(self, txn: str, timeout: int, fail: bool) -> None:
        self._run(self.state.init_producer_id(txn, timeout, self.now, self.allocate), fail)

    @rule(txn=st.sampled_from(IDS), who=WHO, tps=TPS, fail=st.booleans(), hold=st.booleans())
    def add(self, txn: str, who: str, tps: list[tuple[str, int]], fail: bool, hold: bool) -> None:
        pid, epoch = self._who(txn, who)
        r = self.state.add_partitions(txn, pid, epoch, tps, self.now)
        if r.record is not None:
            assert r.before is not None and (pid, epoch) == (
                r.before.producer_id,
                r.before.producer_epoch,
            ), "only the current session joins a transaction"
        self._run(r, fail and not hold, hold)

    @rule(txn=st.sampled_from(IDS), who=WHO, group=st.sampled_from(["g", "h"]))
    def offsets(self, txn: str, who: str, group: str) -> None:
        pid, epoch = self._who(txn, who)
        r = self.state.add_offsets(txn, pid, epoch, group, self.now)
        if r.record is not None:
            assert r.before is not None and (pid, epoch) == (
                r.before.producer_id,
                r.before.producer_epoch,
            )
        self._run(r)

    @rule(txn=st.sampled_from(IDS), who=WHO, commit=st.booleans(), hold=st.booleans())
    def end(self, txn: str, who: str, commit: bool, hold: bool) -> None:
        pid, epoch = self._who(txn, who)
        r = self.state.end_txn(txn, pid, epoch, commit, self.now, self.allocate)
        if r.record is not None:
            assert r.before is not None and r.before.state is TxnState.ONGOING
            assert (pid, epoch) == (r.before.producer_id, r.before.producer_epoch), (
                "only the current session decides a transaction"
            )
            assert r.markers is not None and r.markers.commit == commit
        self._run(r, hold=hold)

    @rule(txn=st.sampled_from(IDS), tps=TPS, commit=st.booleans())
    def whole_transaction(self, txn: str, tps: list[tuple[str, int]], commit: bool) -> None:
        """add, end and complete in one step, so that long runs of transactions happen."""
        self.add(txn, "current", tps or [("x", 0)], False, False)
        self.end(txn, "current", commit, False)
        self.complete(txn)

    @rule(txn=st.sampled_from(IDS))
    def complete(self, txn: str) -> None:
        self._run(self.state.complete(txn, self.now))

    @rule(txn=st.sampled_from(IDS))
    def admin_abort(self, txn: str) -> None:
        self._run(self.state.admin_abort(txn, self.now))

    @rule(step=STEPS_MS)
    def tick_and_expire(self, step: int) -> None:
        self.now += step
        for r in self.state.expire(self.now):
            self._run(r)

    @rule(fail=st.booleans())
    def release(self, fail: bool) -> None:
        if self.held is not None:
            r, self.held = self.held, None
            self._resolve(r, fail)
            if not fail:
                self._handed_out(r)

    @rule()
    def failover(self) -> None:
        """The coordinator moves: a write in flight is lost, the log is reloaded."""
        self.held = None
        self.state = TxnCoordinatorState.load(self.records, coordinator_epoch=2)

    @invariant()
    def log_replays_to_the_live_state(self) -> None:
        loaded = TxnCoordinatorState.load(self.records)
        assert loaded.corrupt_records == 0
        assert loaded.transactions == self.state.transactions
        held = {self.held.transactional_id} if self.held is not None else set()
        assert set(self.state.pending) == held
        for m in self.state.transactions.values():
            assert m.state in PERSISTED_STATES
            assert 0 <= m.producer_epoch <= MAX_EPOCH
            if m.state in (TxnState.ONGOING, TxnState.EMPTY):
                assert m.producer_epoch < MAX_EPOCH  # a client epoch leaves room for the marker


def _machine_test(examples: int, steps: int) -> None:
    run_state_machine_as_test(
        TxnMachine,
        settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None),
    )


def test_replay_equivalence() -> None:
    _machine_test(150, 60)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~130 s alone on this machine (2 shared cores)
def test_replay_equivalence_long() -> None:
    _machine_test(1_000, 80)
