"""The transaction coordinator's state machine, sans I/O: transactions as values, records out.

Theory of operation
-------------------
* **Who coordinates.** A ``transactional_id`` lives in partition
  ``crc32(transactional_id) % N`` (:func:`txn_state_partition`) of the compacted internal topic
  ``__transaction_state`` (``N`` = Kafka's ``transaction.state.log.num.partitions``, 50), the
  same way a group lives in ``__consumer_offsets``; the leader of that partition coordinates its
  transactions. :class:`TxnCoordinatorState` is what one coordinator holds for the partitions
  it leads: ``transactional_id -> TxnMetadata``. It does no I/O and reads no clock: every call
  takes ``now_ms``; the producer id allocator is passed in where an id may be needed.
* **States** (Kafka's ``TransactionState``, KIP-98)::

      (new) -> EMPTY --add--> ONGOING --end--> PREPARE_COMMIT --markers--> COMPLETE_COMMIT
                 ^              |    \\---end--> PREPARE_ABORT ---markers--> COMPLETE_ABORT
                 |              |                     ^                        |
                 |   init, timeout, admin --> PREPARE_EPOCH_FENCE (in memory)  |
                 +---- init (epoch bump) <--- EMPTY / COMPLETE_* ---add--> ONGOING (next txn)
      EMPTY / COMPLETE_* --idle for transactional.id.expiration.ms (7 days)--> DEAD (tombstone)

  :data:`TRANSITIONS` is the table; every change goes through :meth:`TxnMetadata.to`, which
  raises :class:`IllegalTransitionError` (an ``AssertionError``: a bug, not an operating error)
  on any other move. ``PREPARE_EPOCH_FENCE`` is never written: a coordinator-initiated abort
  (an ``init`` fencing an ongoing transaction, ``transaction.timeout.ms``, an admin abort)
  passes through it to ``PREPARE_ABORT`` within one call; ``DEAD`` is written as a tombstone.
* **An epoch bump per end (KIP-890 part 2).** ``end_txn`` moves ONGOING to PREPARE_* with
  ``producer_epoch + 1``; the markers carry the new epoch (each partition then fences the old
  one) and the answer hands the client the new epoch for its next transaction. A delayed
  ``end`` or ``add`` of transaction 1 carries the old epoch and is refused with
  ``PRODUCER_FENCED`` once transaction 2 has begun: it can neither decide nor join it (the
  Jepsen finding KAFKA-17754). The client's own retry of the end (same decision, the epoch it
  had, kept as ``last_producer_epoch``) gets the same answer again while the transaction is
  PREPARE_* or COMPLETE_* of that decision (Kafka answers ``CONCURRENT_TRANSACTIONS`` during
  PREPARE_*; the decision is durable then, so we answer it). Client epochs stay <= 32766 so a
  marker can always carry one more: an end at 32766 writes its markers with 32767 and gives the
  client a fresh producer id at epoch 0 (``previous_producer_id`` keeps the old id for the
  retry); an ``init`` past 32766 does the same. Coordinator-initiated aborts bump the epoch too
  and clear ``last_producer_epoch``; the new epoch is handed to no one, and until the next
  ``init`` every add or end of that id is ``PRODUCER_FENCED`` (so a guessed fence epoch, which
  may be 32767, can never open a transaction).
* **Prepare -> persist -> apply.** Each operation returns a :class:`TxnResult`: an error or an
  answer, the new metadata, the :class:`TxnRecord` to append to ``__transaction_state`` and,
  for an end, the :class:`TxnMarkers` to write. The caller appends the record with
  ``acks=all``, then calls :meth:`TxnCoordinatorState.apply` (or
  :meth:`~TxnCoordinatorState.abandon` if the write failed), then answers; markers are written
  after the apply, then :meth:`~TxnCoordinatorState.complete` writes COMPLETE_*. While a record
  is in flight the id is reserved: every other call for it answers ``CONCURRENT_TRANSACTIONS``
  (retriable, 409), as Kafka's ``pendingState`` does. A result may carry both a record and an
  error: an ``init`` that fences an ongoing transaction writes its abort and answers
  ``CONCURRENT_TRANSACTIONS``; the client retries the init once the abort completed.
* **What is persisted when.** One record per change of committed state: the new id, every
  init, the first add of a transaction and every add that adds something new (adding nothing
  new writes nothing), the PREPARE_* of an end, the COMPLETE_* after the markers, and the
  tombstone of an expired id. So :meth:`TxnCoordinatorState.load` of the partition's records
  rebuilds exactly the committed map (the property test checks it after every step). Record:
  key ``["txn", transactional_id]`` (JSON), value the metadata as JSON with ``"v": 1``
  (:func:`encode_metadata`); partitions are grouped per topic: at the 10,000-partition cap a
  value is 49 kB for one topic, 180 kB for 10,000 topics of 11 characters, but 2.5 MB at
  worst (10,000 topics of 249 characters), past a 1 MB ``max.message.bytes``: the topic's
  writer must allow that size (or a byte cap must be added here).
* **Failover.** The new leader of a ``__transaction_state`` partition loads it (last record per
  key wins, a tombstone deletes; a malformed record is skipped and counted in
  ``corrupt_records``, never fatal), then writes the markers of every transaction found in
  PREPARE_* (:meth:`~TxnCoordinatorState.pending_markers`) and completes them; ONGOING ones
  continue and time out as usual. A marker written twice is harmless: the second carries the
  same producer id and epoch, which the partition accepts (not older) and which ends nothing
  there, because no transaction of that producer can be open on it again yet: the next one
  begins with an add, which waits (``CONCURRENT_TRANSACTIONS``) until COMPLETE_* is durable,
  i.e. until every marker is written. Markers carry the coordinator epoch (the leader epoch
  of the ``__transaction_state`` partition at load) so that once the new coordinator has
  written them, a deposed coordinator's late copies are fenced by the partitions
  (``TRANSACTION_COORDINATOR_FENCED``, :mod:`core_log.producer_state`).
"""

from __future__ import annotations

import enum
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from core_log.errors import CorruptRecordError, ErrorCode, LogbusError

TXN_STATE_TOPIC = "__transaction_state"
TXN_STATE_PARTITIONS = 50  # transaction.state.log.num.partitions
TRANSACTION_MAX_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms (15 min)
TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
MAX_EPOCH = 2**15 - 1  # int16 in the batch header: markers may reach it, clients stop one short
MAX_PARTITIONS_PER_TXN = 10_000  # 49 kB of record for one topic, 2.5 MB at worst; Kafka: none
MAX_GROUPS_PER_TXN = 1_000
MAX_TRANSACTIONAL_IDS = 100_000  # per coordinator; a new id past it is refused (retriable)
MAX_TRANSACTIONAL_ID_CHARS = 249  # as topic and group names (and POST /v1/producers)
MAX_EXPIRED_PER_CALL = 1_000  # expire() hands out at most this many writes per call
RECORD_VERSION = 1
NO_PRODUCER_ID = -1
NO_EPOCH = -1
_LEGAL_ID = re.compile(r"[a-zA-Z0-9._-]+")  # Kafka's legal characters (topic names)
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

TopicPartition = tuple[str, int]


def txn_state_partition(transactional_id: str, partitions: int = TXN_STATE_PARTITIONS) -> int:
    """The ``__transaction_state`` partition whose leader coordinates ``transactional_id``."""
    return zlib.crc32(transactional_id.encode()) % partitions


def validate_transactional_id(transactional_id: object) -> str:
    """``transactional_id`` itself if it is 1..249 of ``[a-zA-Z0-9._-]``; else raise
    :class:`LogbusError` INVALID_REQUEST (400)."""
    if (
        not isinstance(transactional_id, str)
        or len(transactional_id) > MAX_TRANSACTIONAL_ID_CHARS
        or not _LEGAL_ID.fullmatch(transactional_id)
    ):
        raise LogbusError(
            f"transactional_id must be 1..{MAX_TRANSACTIONAL_ID_CHARS} of [a-zA-Z0-9._-]",
            code=ErrorCode.INVALID_REQUEST,
        )
    return transactional_id


# -- states --------------------------------------------------------------------------------------


class TxnState(enum.Enum):
    """Kafka's transaction states; the value is Kafka's name (shown by admin listings)."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"


_S = TxnState
_IDLE = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})  # no transaction open
_PREPARING = frozenset({_S.PREPARE_COMMIT, _S.PREPARE_ABORT})
_COORDINATOR_ABORTED = frozenset({_S.PREPARE_ABORT, _S.COMPLETE_ABORT})  # with no last epoch
# Every legal move, from -> to (Kafka's validPreviousStates, read the other way round).
TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.ONGOING, _S.DEAD}),
    _S.ONGOING: frozenset(
        {_S.ONGOING, _S.PREPARE_COMMIT, _S.PREPARE_ABORT, _S.PREPARE_EPOCH_FENCE}
    ),
    _S.PREPARE_COMMIT: frozenset({_S.COMPLETE_COMMIT}),
    _S.PREPARE_ABORT: frozenset({_S.COMPLETE_ABORT}),
    _S.COMPLETE_COMMIT: frozenset({_S.EMPTY, _S.ONGOING, _S.DEAD}),
    _S.COMPLETE_ABORT: frozenset({_S.EMPTY, _S.ONGOING, _S.DEAD}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset(),
}
PERSISTED_STATES = frozenset(_S) - {_S.PREPARE_EPOCH_FENCE, _S.DEAD}  # DEAD is a tombstone
_PERSISTED_BY_NAME = {s.name: s for s in PERSISTED_STATES}


class IllegalTransitionError(AssertionError):
    """A move outside :data:`TRANSITIONS`: a bug in the coordinator, never a client's error."""


def check_transition(old: TxnState | None, new: TxnState) -> None:
    """Raise :class:`IllegalTransitionError` unless ``old -> new`` is legal (``None``: the id
    is new, and starts EMPTY)."""
    legal = new is _S.EMPTY if old is None else new in TRANSITIONS[old]
    if not legal:
        raise IllegalTransitionError(f"illegal transaction transition {old} -> {new}")


# -- values --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """One transactional id's state. Immutable: changes make a new value (:meth:`to`).

    ``producer_id``/``producer_epoch`` are what the client uses now (after an end: the bumped
    epoch, or a fresh id at epoch 0). ``last_producer_epoch`` is the epoch the client ended its
    last transaction with (-1 if none, or if the coordinator aborted it), under
    ``previous_producer_id`` when the end rotated the id (else -1). ``start_ms`` is -1 unless a
    transaction is open (ONGOING or PREPARE_*).
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1
    last_update_ms: int = -1
    last_producer_epoch: int = NO_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID

    def to(self, state: TxnState, **changes: Any) -> TxnMetadata:
        """This metadata moved to ``state`` with ``changes``; raises
        :class:`IllegalTransitionError` for a move outside :data:`TRANSITIONS`."""
        check_transition(self.state, state)
        return replace(self, state=state, **changes)

    def retry_identity(self) -> tuple[int, int] | None:
        """(producer id, epoch) a retry of the last end carries; None if no retry is expected."""
        if self.last_producer_epoch < 0:
            return None
        pid = self.previous_producer_id if self.previous_producer_id >= 0 else self.producer_id
        return pid, self.last_producer_epoch

    def marker_producer(self) -> tuple[int, int]:
        """(producer id, epoch) the markers of this PREPARE_* transaction carry: the bumped
        epoch of the id that wrote the transaction."""
        if self.previous_producer_id >= 0:  # the end rotated the id: the old one at epoch + 1
            return self.previous_producer_id, self.last_producer_epoch + 1
        return self.producer_id, self.producer_epoch

    def duration_ms(self, now_ms: int) -> int:
        """How long its transaction has been open (0 if none is)."""
        return max(0, now_ms - self.start_ms) if self.start_ms >= 0 else 0


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """A record for ``__transaction_state``: JSON key, JSON value or None (a tombstone)."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class TxnMarkers:
    """COMMIT/ABORT markers to write on every partition of a transaction and on the
    ``__consumer_offsets`` partition of each of its groups, all with the same producer id,
    epoch and coordinator epoch."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]
    groups: frozenset[str]


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What an operation decided. ``error`` None means success. ``record`` (if any) is appended
    before answering and then applied; ``markers`` are written after the apply. ``producer_id``
    and ``producer_epoch`` are the answer: what the client uses from now on."""

    transactional_id: str
    error: ErrorCode | None = None
    message: str = ""
    before: TxnMetadata | None = None  # the committed metadata this was computed from
    metadata: TxnMetadata | None = None  # after apply (state DEAD: deleted)
    record: TxnRecord | None = None
    markers: TxnMarkers | None = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH

    @property
    def ok(self) -> bool:
        return self.error is None

    def exception(self) -> LogbusError:
        """The error as a :class:`LogbusError` to raise (only when ``error`` is set)."""
        assert self.error is not None, "a successful result has no exception"
        return LogbusError(
            self.message or self.error.name,
            code=self.error,
            transactional_id=self.transactional_id,
        )


@dataclass(frozen=True, slots=True)
class TxnConfig:
    """Kafka's transaction coordinator settings, with their defaults."""

    transaction_max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS
    transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS
    max_partitions_per_txn: int = MAX_PARTITIONS_PER_TXN
    max_groups_per_txn: int = MAX_GROUPS_PER_TXN
    max_transactional_ids: int = MAX_TRANSACTIONAL_IDS


# -- record codec --------------------------------------------------------------------------------


class TxnRecordError(CorruptRecordError):
    """A ``__transaction_state`` record that does not decode (skipped and counted by load)."""


def encode_key(transactional_id: str) -> bytes:
    return orjson.dumps(["txn", transactional_id])


def encode_metadata(m: TxnMetadata) -> bytes:
    """The record value of ``m`` (a persisted state), deterministic (sorted keys and lists)."""
    assert m.state in PERSISTED_STATES, f"{m.state} is never written"
    by_topic: dict[str, list[int]] = {}
    for topic, partition in m.partitions:
        by_topic.setdefault(topic, []).append(partition)
    doc = {
        "v": RECORD_VERSION,
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "last_producer_epoch": m.last_producer_epoch,
        "previous_producer_id": m.previous_producer_id,
        "timeout_ms": m.timeout_ms,
        "state": m.state.name,
        "partitions": {t: sorted(ps) for t, ps in by_topic.items()},
        "groups": sorted(m.groups),
        "start_ms": m.start_ms,
        "last_update_ms": m.last_update_ms,
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def encode_record(m: TxnMetadata) -> TxnRecord:
    """The record of ``m``: its value, or a tombstone when it is DEAD."""
    value = None if m.state is _S.DEAD else encode_metadata(m)
    return TxnRecord(encode_key(m.transactional_id), value)


def decode_key(key: bytes | None) -> str:
    """The transactional id of a record key; raises :class:`TxnRecordError`."""
    try:
        doc = orjson.loads(key or b"")
    except orjson.JSONDecodeError as e:
        raise TxnRecordError(f"transaction state key is not JSON: {e}") from None
    if not (isinstance(doc, list) and len(doc) == 2 and doc[0] == "txn"):
        raise TxnRecordError(f"transaction state key is not ['txn', id]: {doc!r:.100}")
    try:
        return validate_transactional_id(doc[1])
    except LogbusError as e:
        raise TxnRecordError(f"transaction state key: {e.message}") from None


def _int(doc: dict[str, Any], name: str, low: int, high: int = _INT64_MAX) -> int:
    v = doc.get(name)
    if type(v) is not int or not low <= v <= high:
        raise TxnRecordError(f"transaction state field {name!r} must be an int in [{low}, {high}]")
    return v


def decode_metadata(transactional_id: str, value: bytes) -> TxnMetadata:
    """The metadata in a record value; raises :class:`TxnRecordError` for anything malformed
    (not JSON, another version, a missing or mistyped field, an unwritable state, partitions or
    groups in a state that has none)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise TxnRecordError(f"transaction state value is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise TxnRecordError("transaction state value is not a JSON object")
    if doc.get("v") != RECORD_VERSION:
        raise TxnRecordError(f"transaction state value version {doc.get('v')!r} is not 1")
    name = doc.get("state")
    state = _PERSISTED_BY_NAME.get(name) if isinstance(name, str) else None
    if state is None:
        raise TxnRecordError(f"transaction state {name!r:.40} is not one that is written")
    raw_parts, raw_groups = doc.get("partitions"), doc.get("groups")
    if not isinstance(raw_parts, dict) or not isinstance(raw_groups, list):
        raise TxnRecordError("transaction state partitions/groups must be an object/a list")
    partitions: set[TopicPartition] = set()
    for topic, ps in raw_parts.items():
        if not topic or not isinstance(ps, list):
            raise TxnRecordError("transaction state partitions must map topics to lists")
        for p in ps:
            if type(p) is not int or not 0 <= p <= _INT32_MAX:
                raise TxnRecordError(f"transaction state partition {p!r:.40} is not valid")
            partitions.add((topic, p))
    if not all(isinstance(g, str) and g for g in raw_groups):
        raise TxnRecordError("transaction state groups must be non-empty strings")
    if state in _IDLE and (partitions or raw_groups):
        raise TxnRecordError(f"transaction state {name} cannot hold partitions or groups")
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=_int(doc, "producer_id", 0),
        producer_epoch=_int(doc, "producer_epoch", 0, MAX_EPOCH),
        timeout_ms=_int(doc, "timeout_ms", 1, _INT32_MAX),
        state=state,
        partitions=frozenset(partitions),
        groups=frozenset(raw_groups),
        start_ms=_int(doc, "start_ms", -1),
        last_update_ms=_int(doc, "last_update_ms", -1),
        last_producer_epoch=_int(doc, "last_producer_epoch", NO_EPOCH, MAX_EPOCH - 1),
        previous_producer_id=_int(doc, "previous_producer_id", NO_PRODUCER_ID),
    )


class KeyValue(Protocol):
    """Anything with a record's key and value (:class:`TxnRecord`, a read ``Record``)."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


# -- the coordinator's state ---------------------------------------------------------------------


def _error(
    txn_id: str, code: ErrorCode, message: str, before: TxnMetadata | None = None
) -> TxnResult:
    return TxnResult(txn_id, error=code, message=message, before=before, metadata=before)


def _answer(m: TxnMetadata) -> TxnResult:
    """Success without a write: the client keeps or learns its producer id and epoch."""
    return TxnResult(
        m.transactional_id,
        before=m,
        metadata=m,
        producer_id=m.producer_id,
        producer_epoch=m.producer_epoch,
    )


@dataclass(eq=False)
class TxnCoordinatorState:
    """The transactions of the ``__transaction_state`` partitions one coordinator leads.

    ``transactions`` holds only committed state (what the log holds); ``pending`` the results
    whose record is being written (one per id at most). Not thread-safe: one owner (the
    coordinator's event loop) calls it.
    """

    coordinator_epoch: int = 0
    config: TxnConfig = field(default_factory=TxnConfig)
    transactions: dict[str, TxnMetadata] = field(default_factory=dict)
    pending: dict[str, TxnResult] = field(default_factory=dict)
    corrupt_records: int = 0

    # -- load / apply ----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        records: Iterable[KeyValue],
        *,
        coordinator_epoch: int = 0,
        config: TxnConfig | None = None,
    ) -> TxnCoordinatorState:
        """Rebuild from the records of ``__transaction_state`` partitions in log order: the
        last record of an id wins, a tombstone deletes it. A record that does not decode is
        skipped and counted in ``corrupt_records`` (a corrupt record must not stop a
        coordinator from loading; the id's earlier record, if any, stays)."""
        state = cls(coordinator_epoch=coordinator_epoch, config=config or TxnConfig())
        for r in records:
            try:
                txn_id = decode_key(r.key)
                if r.value is None:
                    state.transactions.pop(txn_id, None)
                else:
                    state.transactions[txn_id] = decode_metadata(txn_id, r.value)
            except TxnRecordError:
                state.corrupt_records += 1
        return state

    def apply(self, result: TxnResult) -> None:
        """Install ``result`` once its record is durable (``acks=all``)."""
        assert result.record is not None and result.metadata is not None, "nothing to apply"
        txn_id = result.transactional_id
        assert self.pending.get(txn_id) is result, "apply of a result that is not pending"
        assert self.transactions.get(txn_id) is result.before, "state changed under a write"
        del self.pending[txn_id]
        if result.metadata.state is _S.DEAD:
            del self.transactions[txn_id]
        else:
            self.transactions[txn_id] = result.metadata

    def abandon(self, result: TxnResult) -> None:
        """Forget ``result``: its record was certainly not written (refused before the append,
        e.g. NOT_ENOUGH_REPLICAS). Nothing changes; the caller answers the write's error and the
        client retries. If the outcome is unknown (a timeout, a lost leadership) the record may
        still land in the log: do not abandon then, drop this state and :meth:`load` the
        partition again (as after a leadership change) so that memory agrees with the log."""
        if self.pending.get(result.transactional_id) is result:
            del self.pending[result.transactional_id]

    def _write(self, before: TxnMetadata | None, after: TxnMetadata, **answer: Any) -> TxnResult:
        """A result that writes ``after``'s record; the id is reserved until apply/abandon."""
        answer.setdefault("producer_id", after.producer_id)
        answer.setdefault("producer_epoch", after.producer_epoch)
        result = TxnResult(
            after.transactional_id,
            before=before,
            metadata=after,
            record=encode_record(after),
            **answer,
        )
        self.pending[after.transactional_id] = result
        return result

    def _busy(self, txn_id: str) -> TxnResult | None:
        if txn_id in self.pending:
            return _error(
                txn_id,
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"transactional id {txn_id!r} has a state change in flight; retry",
                self.transactions.get(txn_id),
            )
        return None

    # -- operations ------------------------------------------------------------------------------

    def init_producer_id(
        self,
        txn_id: str,
        timeout_ms: int,
        now_ms: int,
        allocate_producer_id: Callable[[], int],
    ) -> TxnResult:
        """Begin a producer session for ``txn_id``: a new producer id at epoch 0 on first use,
        else the epoch bumped (a fresh id at epoch 0 past 32766), which fences every older
        session. An open transaction is aborted first: the answer is then
        CONCURRENT_TRANSACTIONS with the abort's record and markers, and the client retries.
        Errors: INVALID_REQUEST (bad id), INVALID_TRANSACTION_TIMEOUT (not in 1 ..
        ``transaction.max.timeout.ms``), CONCURRENT_TRANSACTIONS (an end is completing),
        BROKER_BUSY (too many ids on this coordinator)."""
        try:
            validate_transactional_id(txn_id)
        except LogbusError as e:
            return _error(str(txn_id), e.code, e.message)
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return _error(
                txn_id,
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction timeout {timeout_ms} ms is not in 1.."
                f"{self.config.transaction_max_timeout_ms} (transaction.max.timeout.ms)",
            )
        if busy := self._busy(txn_id):
            return busy
        m = self.transactions.get(txn_id)
        if m is None:
            if len(self.transactions) + len(self.pending) >= self.config.max_transactional_ids:
                return _error(
                    txn_id,
                    ErrorCode.BROKER_BUSY,
                    f"this coordinator holds {self.config.max_transactional_ids} transactional "
                    "ids already; retry later (idle ids expire)",
                )
            check_transition(None, _S.EMPTY)
            pid = allocate_producer_id()
            assert pid >= 0, "producer ids are not negative"
            new = TxnMetadata(txn_id, pid, 0, timeout_ms, _S.EMPTY, last_update_ms=now_ms)
            return self._write(None, new)
        if m.state is _S.ONGOING:
            return self._fence(
                m,
                now_ms,
                error=ErrorCode.CONCURRENT_TRANSACTIONS,
                message=f"the open transaction of {txn_id!r} is being aborted; retry the init",
            )
        if m.state in _PREPARING:
            return _error(
                txn_id,
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"the transaction of {txn_id!r} is completing; retry",
                m,
            )
        pid, epoch = m.producer_id, m.producer_epoch + 1
        if epoch > MAX_EPOCH - 1:
            pid, epoch = allocate_producer_id(), 0
            assert pid >= 0 and pid != m.producer_id, "a rotated producer id must be new"
        new = m.to(
            _S.EMPTY,
            producer_id=pid,
            producer_epoch=epoch,
            timeout_ms=timeout_ms,
            last_update_ms=now_ms,
            last_producer_epoch=NO_EPOCH,
            previous_producer_id=NO_PRODUCER_ID,
        )
        return self._write(m, new)

    def add_partitions(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
    ) -> TxnResult:
        """Add partitions to the producer's transaction, beginning one if none is open.
        Errors: INVALID_PRODUCER_ID_MAPPING (unknown id, or another producer id),
        PRODUCER_FENCED (another epoch), CONCURRENT_TRANSACTIONS (an end is completing; retry),
        INVALID_REQUEST (a bad partition, or past ``max_partitions_per_txn``)."""
        parts = frozenset(partitions)
        for tp in parts:
            if not (
                isinstance(tp, tuple)
                and len(tp) == 2
                and isinstance(tp[0], str)
                and 0 < len(tp[0]) <= 249
                and type(tp[1]) is int
                and 0 <= tp[1] <= _INT32_MAX
            ):
                return _error(txn_id, ErrorCode.INVALID_REQUEST, f"bad partition {tp!r:.300}")
        return self._add(txn_id, producer_id, epoch, parts, frozenset(), now_ms)

    def add_offsets(
        self, txn_id: str, producer_id: int, epoch: int, group: str, now_ms: int
    ) -> TxnResult:
        """Add a consumer group (whose offsets the transaction commits) to the producer's
        transaction; errors as :meth:`add_partitions` (INVALID_GROUP_ID for a bad group id)."""
        if not isinstance(group, str) or not re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", group):
            return _error(
                txn_id, ErrorCode.INVALID_GROUP_ID, "group id must be 1..249 of [a-zA-Z0-9._-]"
            )
        return self._add(txn_id, producer_id, epoch, frozenset(), frozenset({group}), now_ms)

    def _add(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        parts: frozenset[TopicPartition],
        groups: frozenset[str],
        now_ms: int,
    ) -> TxnResult:
        m = self.transactions.get(txn_id)
        if m is None:
            return _unknown(txn_id)
        if busy := self._busy(txn_id):
            return busy
        if fenced := _check_producer(m, producer_id, epoch):
            return fenced
        if m.state in _PREPARING:
            return _error(
                txn_id,
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"the previous transaction of {txn_id!r} is completing; retry",
                m,
            )
        assert m.state is _S.ONGOING or m.state in _IDLE, f"{m.state} is never committed"
        beginning = m.state is not _S.ONGOING
        new_parts, new_groups = m.partitions | parts, m.groups | groups
        if new_parts == m.partitions and new_groups == m.groups:
            return _answer(m)  # nothing new: nothing to write (nor begun)
        if len(new_parts) > self.config.max_partitions_per_txn:
            return _error(
                txn_id,
                ErrorCode.INVALID_REQUEST,
                f"a transaction spans at most {self.config.max_partitions_per_txn} partitions",
                m,
            )
        if len(new_groups) > self.config.max_groups_per_txn:
            return _error(
                txn_id,
                ErrorCode.INVALID_REQUEST,
                f"a transaction spans at most {self.config.max_groups_per_txn} groups",
                m,
            )
        changes: dict[str, Any] = {"partitions": new_parts, "groups": new_groups}
        if beginning:
            changes.update(
                start_ms=now_ms, last_producer_epoch=NO_EPOCH, previous_producer_id=NO_PRODUCER_ID
            )
        return self._write(m, m.to(_S.ONGOING, last_update_ms=now_ms, **changes))

    def end_txn(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        now_ms: int,
        allocate_producer_id: Callable[[], int],
    ) -> TxnResult:
        """Commit or abort the producer's open transaction: ONGOING -> PREPARE_* with the epoch
        bumped (KIP-890 part 2); the answer carries the epoch (or, past 32766, the fresh
        producer id) for the next transaction and the result the markers to write. A retry of
        the same end (the epoch it was sent with) gets the same answer; the other decision
        INVALID_TXN_STATE. An abort with nothing open succeeds without a write; a commit with
        nothing open is INVALID_TXN_STATE. Other errors as :meth:`add_partitions`."""
        m = self.transactions.get(txn_id)
        if m is None:
            return _unknown(txn_id)
        if busy := self._busy(txn_id):
            return busy
        decided = _S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT
        completed = _S.COMPLETE_COMMIT if commit else _S.COMPLETE_ABORT
        if m.state not in (_S.ONGOING, _S.EMPTY) and m.retry_identity() == (producer_id, epoch):
            if m.state in (decided, completed):
                return _answer(m)  # a retry of the end that bumped the epoch: same answer
            return _error(
                txn_id,
                ErrorCode.INVALID_TXN_STATE,
                f"the transaction was already ended the other way ({m.state.value})",
                m,
            )
        if fenced := _check_producer(m, producer_id, epoch):
            return fenced
        if m.state in _PREPARING:
            return _error(
                txn_id,
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"the previous transaction of {txn_id!r} is completing; retry",
                m,
            )
        if m.state in _IDLE:
            if not commit:
                return _answer(m)  # abort with nothing sent: nothing to do
            return _error(
                txn_id, ErrorCode.INVALID_TXN_STATE, "no transaction is open to commit", m
            )
        assert m.state is _S.ONGOING
        assert m.producer_epoch < MAX_EPOCH, "client epochs stay below 32767"
        pid, new_epoch, previous = m.producer_id, m.producer_epoch + 1, NO_PRODUCER_ID
        if new_epoch > MAX_EPOCH - 1:  # markers take 32767; the client a fresh id at 0
            pid, new_epoch, previous = allocate_producer_id(), 0, m.producer_id
            assert pid >= 0 and pid != m.producer_id, "a rotated producer id must be new"
        new = m.to(
            decided,
            producer_id=pid,
            producer_epoch=new_epoch,
            last_producer_epoch=m.producer_epoch,
            previous_producer_id=previous,
            last_update_ms=now_ms,
        )
        return self._write(m, new, markers=self._markers(new))

    def complete(self, txn_id: str, now_ms: int) -> TxnResult:
        """Every marker of the PREPARE_* transaction is written: move it to COMPLETE_*, with no
        partitions or groups. Errors: TRANSACTIONAL_ID_NOT_FOUND, CONCURRENT_TRANSACTIONS (a
        write in flight), INVALID_TXN_STATE (not PREPARE_*)."""
        m = self.transactions.get(txn_id)
        if m is None:
            return _error(
                txn_id, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"unknown transactional id {txn_id!r}"
            )
        if busy := self._busy(txn_id):
            return busy
        if m.state not in _PREPARING:
            return _error(
                txn_id, ErrorCode.INVALID_TXN_STATE, f"{m.state.value} has no markers pending", m
            )
        done = _S.COMPLETE_COMMIT if m.state is _S.PREPARE_COMMIT else _S.COMPLETE_ABORT
        new = m.to(
            done, partitions=frozenset(), groups=frozenset(), start_ms=-1, last_update_ms=now_ms
        )
        return self._write(m, new)

    def expire(self, now_ms: int, limit: int = MAX_EXPIRED_PER_CALL) -> list[TxnResult]:
        """Coordinator-initiated changes due at ``now_ms``, at most ``limit``: an ONGOING
        transaction open longer than its ``transaction.timeout.ms`` is aborted with an epoch
        bump (its result as :meth:`end_txn`'s, with markers); an id idle in EMPTY/COMPLETE_*
        for ``transactional.id.expiration.ms`` becomes DEAD (a tombstone). Ids with a write in
        flight are skipped (seen again at the next call)."""
        out: list[TxnResult] = []
        for txn_id, m in self.transactions.items():
            if len(out) >= limit:
                break
            if txn_id in self.pending:
                continue
            if m.state is _S.ONGOING and now_ms > m.start_ms + m.timeout_ms:
                out.append(self._fence(m, now_ms))
            elif (
                m.state in _IDLE
                and m.last_update_ms <= now_ms - self.config.transactional_id_expiration_ms
            ):
                out.append(self._write(m, m.to(_S.DEAD, last_update_ms=now_ms)))
        return out

    def admin_abort(self, txn_id: str, now_ms: int) -> TxnResult:
        """Abort ``txn_id``'s open transaction for an admin (a hanging transaction), with an
        epoch bump that fences its producer. Errors: TRANSACTIONAL_ID_NOT_FOUND,
        CONCURRENT_TRANSACTIONS (it is already ending), INVALID_TXN_STATE (none is open)."""
        m = self.transactions.get(txn_id)
        if m is None:
            return _error(
                txn_id, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"unknown transactional id {txn_id!r}"
            )
        if busy := self._busy(txn_id):
            return busy
        if m.state in _PREPARING:
            return _error(
                txn_id, ErrorCode.CONCURRENT_TRANSACTIONS, "the transaction is already ending", m
            )
        if m.state is not _S.ONGOING:
            return _error(
                txn_id, ErrorCode.INVALID_TXN_STATE, f"no transaction is open ({m.state.value})", m
            )
        return self._fence(m, now_ms)

    def _fence(self, m: TxnMetadata, now_ms: int, **answer: Any) -> TxnResult:
        """Abort ``m``'s transaction on the coordinator's own account: ONGOING ->
        PREPARE_EPOCH_FENCE (the epoch bumped, in memory) -> PREPARE_ABORT (written)."""
        assert m.producer_epoch < MAX_EPOCH, "client epochs stay below 32767"
        fenced = m.to(_S.PREPARE_EPOCH_FENCE, producer_epoch=m.producer_epoch + 1)
        new = fenced.to(
            _S.PREPARE_ABORT,
            last_producer_epoch=NO_EPOCH,
            previous_producer_id=NO_PRODUCER_ID,
            last_update_ms=now_ms,
        )
        return self._write(m, new, markers=self._markers(new), **answer)

    def _markers(self, m: TxnMetadata) -> TxnMarkers:
        assert m.state in _PREPARING
        pid, epoch = m.marker_producer()
        return TxnMarkers(
            m.transactional_id,
            pid,
            epoch,
            m.state is _S.PREPARE_COMMIT,
            self.coordinator_epoch,
            m.partitions,
            m.groups,
        )

    # -- queries ---------------------------------------------------------------------------------

    def pending_markers(self) -> list[TxnMarkers]:
        """The markers of every committed PREPARE_* transaction: after a load they must be
        (re)written, then :meth:`complete` called. Writing one twice is harmless (see the
        module docstring)."""
        return [self._markers(m) for m in self.transactions.values() if m.state in _PREPARING]

    def list_transactions(
        self,
        now_ms: int,
        states: Iterable[TxnState] | None = None,
        min_duration_ms: int = 0,
    ) -> list[TxnMetadata]:
        """Committed transactions by id, for admins: only those in ``states`` (all if None) and,
        with ``min_duration_ms > 0``, only open ones open at least that long (the hanging
        ones)."""
        wanted = None if states is None else frozenset(states)
        return [
            m
            for _, m in sorted(self.transactions.items())
            if (wanted is None or m.state in wanted)
            and (
                min_duration_ms <= 0
                or (m.start_ms >= 0 and m.duration_ms(now_ms) >= min_duration_ms)
            )
        ]


def _unknown(txn_id: str) -> TxnResult:
    return _error(
        txn_id,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        f"transactional id {txn_id!r} has no producer id: init it first",
    )


def _check_producer(m: TxnMetadata, producer_id: int, epoch: int) -> TxnResult | None:
    """The fencing answer for a request of ``producer_id``/``epoch``, or None if it is the
    current producer session."""
    if producer_id != m.producer_id:
        if producer_id == m.previous_producer_id:
            return _error(
                m.transactional_id,
                ErrorCode.PRODUCER_FENCED,
                f"producer {producer_id} was replaced by producer {m.producer_id}",
                m,
            )
        return _error(
            m.transactional_id,
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"producer {producer_id} is not the producer of {m.transactional_id!r}",
            m,
        )
    if m.state in _COORDINATOR_ABORTED and m.last_producer_epoch == NO_EPOCH:
        return _error(  # nobody was handed the fence epoch: only an init goes on from here
            m.transactional_id,
            ErrorCode.PRODUCER_FENCED,
            f"the transaction of {m.transactional_id!r} was aborted by the coordinator "
            "(timeout, a newer init or an admin); init the producer again",
            m,
        )
    if epoch != m.producer_epoch:
        return _error(
            m.transactional_id,
            ErrorCode.PRODUCER_FENCED,
            f"producer {producer_id} epoch {epoch} is fenced: the current epoch is "
            f"{m.producer_epoch}",
            m,
        )
    return None
