"""The history of a Jepsen-style transactions test: what the clients did and saw, as values.

A history is a list of operations, each with the process that ran it, its invoke and complete
times (``*_ns``: nanoseconds of ``time.monotonic_ns()``; CLOCK_MONOTONIC is one clock for every
process on the machine, so times of different processes compare) and its outcome:

* ``ok`` — it happened, and what it returned is recorded;
* ``fail`` — it definitely did not happen (a 4xx answer that says so);
* ``info`` — unknown: a timeout, a lost connection, a 5xx, a killed client. It may have
  happened, then or later.

Three kinds of operation:

* :class:`Txn` — one transaction of one transactional producer: the records it wrote
  (:class:`Write`: topic, partition, value and the offset its produce acknowledged, if it was
  acknowledged), the consumer-group offsets it added (:class:`GroupOffset`), and its end
  (:class:`TxnEnd`: commit or abort, with the end request's own times and outcome; ``None`` when
  the client never sent an end — a client that cannot tell whether it sent its commit, because it
  was killed, records a commit with outcome ``info``). The single-request form
  (``POST /v1/transactions``) is a Txn whose end spans the same request. A Txn's outcome is
  derived from its end (:attr:`Txn.outcome`), so the two cannot disagree.
* :class:`Poll` — one poll of one consumer in one *session* (a run of polls that continue from
  each other's position; a rebalance, a seek or a restart starts a new session) at one isolation
  level, with the records it returned in order. A session's polls appear in the history in the
  order the consumer made them.
* :class:`FinalRead` — after the test, once every fault has healed and every transaction has
  ended (waited past ``transaction.timeout.ms``), every partition read whole, from its log start
  (0: these tests run without retention or compaction) to its end, both ``read_committed`` and
  ``read_uncommitted``, and the groups' committed offsets. It is the ground truth of what the log
  holds. At most one per history.

Values are integers unique per test: one value is written by one transaction, except that a
consume-transform-produce loop writes the same output again when it retries an input after an
abort (so several Txns may carry one value; every Txn the loop ran, aborted ones included, must
be recorded, or the aborted copies read ``read_uncommitted`` count as duplicates).

Every class is a frozen dataclass of JSON types; :meth:`History.save` writes JSON lines (a header,
then one operation per line) and :func:`load` reads them back, raising ``ValueError`` naming the
malformed line, so a failing run's history can be kept and re-checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias, get_args

Outcome: TypeAlias = Literal["ok", "fail", "info"]
Isolation: TypeAlias = Literal["read_committed", "read_uncommitted"]
EndKind: TypeAlias = Literal["commit", "abort"]
Slot: TypeAlias = tuple[int, int]  # (offset, value) in one partition
TopicPartition: TypeAlias = tuple[str, int]

FORMAT: Final = "logbus-jepsen-history/1"
READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"


@dataclass(frozen=True, slots=True)
class Write:
    """One record a transaction wrote; ``offset`` is None unless its produce was acknowledged."""

    topic: str
    partition: int
    value: int
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class GroupOffset:
    """A consumer group's committed position on one partition: the next offset to consume."""

    group: str
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class TxnEnd:
    """The end request of a transaction (``POST …/commit`` or ``…/abort``)."""

    kind: EndKind
    invoke_ns: int
    complete_ns: int
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Txn:
    """One transaction: begin, its writes and group offsets, and its end (None: never sent)."""

    process: int
    invoke_ns: int
    complete_ns: int
    transactional_id: str
    writes: tuple[Write, ...]
    end: TxnEnd | None
    group_offsets: tuple[GroupOffset, ...] = ()
    producer_id: int | None = None
    producer_epoch: int | None = None

    @property
    def outcome(self) -> Outcome:
        """``ok``: the commit was acknowledged. ``fail``: definitely not committed — aborted,
        commit refused, or never asked to commit (only the client's commit request makes a
        coordinator commit; timeouts and fencing abort). ``info``: the commit's answer is unknown.
        """
        if self.end is None or self.end.kind == "abort" or self.end.outcome == "fail":
            return "fail"
        return self.end.outcome


@dataclass(frozen=True, slots=True)
class Record:
    """One record a poll returned."""

    topic: str
    partition: int
    offset: int
    value: int


@dataclass(frozen=True, slots=True)
class Poll:
    """One poll of one consumer session; only an ``ok`` poll carries records."""

    process: int
    invoke_ns: int
    complete_ns: int
    outcome: Outcome
    consumer: str
    session: str
    isolation: Isolation
    records: tuple[Record, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """One partition read whole, at both isolation levels: (offset, value) in offset order."""

    topic: str
    partition: int
    committed: tuple[Slot, ...]
    uncommitted: tuple[Slot, ...]


@dataclass(frozen=True, slots=True)
class FinalRead:
    """Every partition of the test read whole after it, and the groups' committed offsets."""

    process: int
    invoke_ns: int
    complete_ns: int
    partitions: tuple[PartitionRead, ...]
    group_offsets: tuple[GroupOffset, ...] = ()
    outcome: Outcome = "ok"


Op: TypeAlias = Txn | Poll | FinalRead


@dataclass(frozen=True, slots=True)
class History:
    """The operations of one test run, in the order they were recorded."""

    ops: tuple[Op, ...] = field(default_factory=tuple)

    def save(self, path: Path) -> None:
        """Write the history as JSON lines: a header, then one operation per line."""
        with path.open("w", encoding="utf-8") as f:
            f.write(json.dumps({"format": FORMAT, "ops": len(self.ops)}) + "\n")
            for op in self.ops:
                f.write(json.dumps(op_to_json(op), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        return load(path)


def load(path: Path) -> History:
    """The history :meth:`History.save` wrote. Raises ValueError naming a malformed line."""
    ops: list[Op] = []
    with path.open(encoding="utf-8") as f:
        lines = [(n, text) for n, text in enumerate(f, 1) if text.strip()]
    if not lines:
        raise ValueError(f"{path}: empty history file")
    try:
        header = json.loads(lines[0][1])
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')!r}, expected {FORMAT!r}")
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{path}:1: malformed history header: {e}") from e
    for n, text in lines[1:]:
        try:
            ops.append(op_from_json(json.loads(text)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}:{n}: malformed history line: {e!r}") from e
    if len(ops) != header.get("ops"):
        raise ValueError(f"{path}: {len(ops)} operations, the header says {header.get('ops')}")
    return History(tuple(ops))


# -- JSON ----------------------------------------------------------------------------------------


def op_to_json(op: Op) -> dict[str, Any]:
    """One operation as a JSON object, its kind under ``"type"``."""
    base = {"process": op.process, "invoke_ns": op.invoke_ns, "complete_ns": op.complete_ns}
    if isinstance(op, Txn):
        end = op.end
        return base | {
            "type": "txn",
            "transactional_id": op.transactional_id,
            "producer_id": op.producer_id,
            "producer_epoch": op.producer_epoch,
            "writes": [[w.topic, w.partition, w.value, w.offset] for w in op.writes],
            "group_offsets": [_group_offset_to_json(g) for g in op.group_offsets],
            "end": None if end is None else [end.kind, end.invoke_ns, end.complete_ns, end.outcome],
        }
    if isinstance(op, Poll):
        return base | {
            "type": "poll",
            "outcome": op.outcome,
            "consumer": op.consumer,
            "session": op.session,
            "isolation": op.isolation,
            "records": [[r.topic, r.partition, r.offset, r.value] for r in op.records],
        }
    return base | {
        "type": "final_read",
        "outcome": op.outcome,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "committed": [list(s) for s in p.committed],
                "uncommitted": [list(s) for s in p.uncommitted],
            }
            for p in op.partitions
        ],
        "group_offsets": [_group_offset_to_json(g) for g in op.group_offsets],
    }


def op_from_json(obj: dict[str, Any]) -> Op:
    """The operation :func:`op_to_json` made; raises KeyError/TypeError/ValueError if malformed."""
    kind = obj["type"]
    process, invoke_ns = _int(obj["process"]), _int(obj["invoke_ns"])
    complete_ns = _int(obj["complete_ns"])
    if kind == "txn":
        end = obj["end"]
        return Txn(
            process=process,
            invoke_ns=invoke_ns,
            complete_ns=complete_ns,
            transactional_id=_str(obj["transactional_id"]),
            producer_id=_opt_int(obj.get("producer_id")),
            producer_epoch=_opt_int(obj.get("producer_epoch")),
            writes=tuple(
                Write(_str(t), _int(p), _int(v), _opt_int(o)) for t, p, v, o in obj["writes"]
            ),
            group_offsets=tuple(_group_offset_from_json(g) for g in obj["group_offsets"]),
            end=None
            if end is None
            else TxnEnd(
                _choice(end[0], EndKind), _int(end[1]), _int(end[2]), _choice(end[3], Outcome)
            ),
        )
    if kind == "poll":
        return Poll(
            process=process,
            invoke_ns=invoke_ns,
            complete_ns=complete_ns,
            outcome=_choice(obj["outcome"], Outcome),
            consumer=_str(obj["consumer"]),
            session=_str(obj["session"]),
            isolation=_choice(obj["isolation"], Isolation),
            records=tuple(
                Record(_str(t), _int(p), _int(o), _int(v)) for t, p, o, v in obj["records"]
            ),
        )
    if kind == "final_read":
        return FinalRead(
            process=process,
            invoke_ns=invoke_ns,
            complete_ns=complete_ns,
            outcome=_choice(obj["outcome"], Outcome),
            partitions=tuple(
                PartitionRead(
                    _str(p["topic"]),
                    _int(p["partition"]),
                    tuple((_int(o), _int(v)) for o, v in p["committed"]),
                    tuple((_int(o), _int(v)) for o, v in p["uncommitted"]),
                )
                for p in obj["partitions"]
            ),
            group_offsets=tuple(_group_offset_from_json(g) for g in obj["group_offsets"]),
        )
    raise ValueError(f"unknown operation type {kind!r}")


def _group_offset_to_json(g: GroupOffset) -> list[Any]:
    return [g.group, g.topic, g.partition, g.offset]


def _group_offset_from_json(g: list[Any]) -> GroupOffset:
    group, topic, partition, offset = g
    return GroupOffset(_str(group), _str(topic), _int(partition), _int(offset))


def _int(x: object) -> int:
    if type(x) is not int:
        raise TypeError(f"expected an integer, got {x!r}")
    return x


def _opt_int(x: object) -> int | None:
    return None if x is None else _int(x)


def _str(x: object) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, got {x!r}")
    return x


def _choice(x: object, alias: Any) -> Any:
    if x not in get_args(alias):
        raise ValueError(f"{x!r} is not one of {get_args(alias)}")
    return x
