"""A Jepsen-style checker for Kafka transactions: ``check(history)`` lists every anomaly.

Theory of operation
-------------------
The history (tests/jepsen/history.py) says what producers wrote in which transactions, how each
transaction ended as far as its client knows, what consumers' polls returned, and — the ground
truth — what every partition holds at the end, read whole at both isolation levels. The checker
is a pure function of that history: it builds a few indexes (who wrote each value, every
(topic, partition, offset) every read saw, the final committed and uncommitted logs) and runs
one pass per anomaly. Linear in the size of the history: about 1 s of CPU per 10^5 records
read (a model history of 7 * 10^4 operations and 5 * 10^5 records read: 4.4 s).

A transaction's status comes from its end (:attr:`Txn.outcome`): *committed* (commit
acknowledged), *not committed* (aborted, commit refused, or no commit ever sent: a Kafka
coordinator commits only on the client's EndTxn(commit); a timeout or a fencing epoch bump
aborts) or *unknown* (the commit's answer was lost). An unknown transaction may have committed or
not; its values may be read, but consistently: a ``read_committed`` poll that returned one makes
the final read owe it.

Below, FC and FU are the final ``read_committed`` and ``read_uncommitted`` reads: maps from
(topic, partition, offset) to value. A *position* is a (topic, partition, offset).

Anomalies
---------
``duplicate``
    A value seen at two or more positions by the ``read_committed`` reads (the polls and FC)
    together; or at more positions by all reads together than the history has writes of it
    (one, except for a consume-transform-produce output rewritten after an abort). Why: a
    record gets its offset once, when its batch is appended; the idempotent producer's sequence
    numbers make a retried batch a no-op, and a retried transaction's aborted copy is never
    visible ``read_committed``. "More than once in the final read" is the same rule applied to
    FC and FU.
``inconsistent-offsets``
    Two reads (polls at either isolation, FC, FU) see different values at one position. Why: an
    offset, once assigned in a committed (high-watermark) log prefix, names one record forever;
    isolation only hides records, it never moves them, so ``read_committed`` and
    ``read_uncommitted`` agree wherever both return a record.
``lost-write``
    A write of a committed transaction that FC does not hold at its partition — or holds at
    another offset than its produce acknowledged. Why: a commit is acknowledged only after the
    COMMIT markers are written with acks=all, so every record of the transaction is below the
    high watermark and committed; nothing may remove it (no retention in these tests).
``G1a`` (aborted read)
    A ``read_committed`` poll or FC returned a value whose writing transactions are all
    definitely not committed; or a poll returned a value that FC does not hold (anywhere in its
    partition) and that no acknowledged-committed transaction wrote (so an aborted value — FU
    holds it but FC not — or an unknown transaction's value that turned out aborted or
    vanished). Why:
    ``read_committed`` returns only records below the last stable offset whose transaction has
    a COMMIT marker; aborted records are filtered by the aborted-transaction index; and a
    transaction's fate, once its marker is written, never changes.
``precommitted-read``
    A ``read_committed`` poll that completed before the commit of the transaction that wrote a
    value it returned was invoked (with several candidate writers: before the earliest commit
    invoked by one that may have committed). Why: the LSO passes a transaction's records only
    when its COMMIT marker is written, which the coordinator does only after it has received
    EndTxn(commit), which the client sends only after invoking commit; one monotonic clock
    orders the two events.
``nonmonotonic-poll``
    Within one consumer session, the offsets of one partition, in the order the session's polls
    returned them (within a poll and across polls), do not strictly increase; or FC or FU lists
    a partition's offsets out of order. Why: a consumer's position only moves forward except by
    a seek, rebalance or restart, which start a new session. A poll with outcome ``info`` does
    not excuse it: a lost answer can move a position forward, never back.
``poll-skip``
    Within one consumer session, between two offsets a < b that it returned consecutively for a
    partition, the final log holds a record at an offset a < o < b that the session's isolation
    must return: a committed record (in FC) for ``read_committed``, any record (in FU) for
    ``read_uncommitted``. Why: offsets are assigned in order, so o existed when b was returned;
    a ``read_committed`` reader got b only below the LSO, so o's transaction was already decided
    — and it committed, as FC shows. Not checked across a poll with outcome ``info`` of the same
    session (its lost answer may have advanced the position over o) nor before the session's
    first record (a session may start anywhere).
``unseen``
    A value of an acknowledged-committed transaction that no poll returned, although some poll
    returned an offset of its partition beyond the value's (acknowledged, else final) offset:
    the consumers passed it and never delivered it. Meaningful when consumers start new sessions
    only at positions whose earlier records were all recorded as polled (commit the group's
    offset after recording the poll). :attr:`Report.never_polled` separately counts the
    acknowledged-committed values no poll returned at all (consumers that stopped early).
``output-mismatch``
    For a consume-transform-produce loop (:class:`Transform`: input topic, output topic, group,
    the function from input to output value): each input in FC below the group's final committed
    offset of its partition must have exactly one output in FC of the output topic (missing:
    none; duplicated: more); an input at or past that offset has none (the offsets and the
    output commit together, so an output without its offset is a torn transaction); and every
    output in FC is the image of some input in FC. Why: the loop writes the output records and
    the group's offsets in one transaction, so they are visible atomically or not at all.

Zero of each means the history is valid. Malformed histories (times going backwards, a poll
that failed yet returned records, a session changing isolation, two final reads) raise
``ValueError``: they are bugs of the harness, not of the broker.

Command line: ``python -m tests.jepsen.checker history.jsonl`` re-checks a saved history, prints
the report and exits 1 when it has anomalies.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

from tests.jepsen.history import (
    READ_COMMITTED,
    FinalRead,
    History,
    Poll,
    TopicPartition,
    Txn,
    load,
)

DUPLICATE: Final = "duplicate"
INCONSISTENT_OFFSETS: Final = "inconsistent-offsets"
LOST_WRITE: Final = "lost-write"
G1A: Final = "G1a"
PRECOMMITTED_READ: Final = "precommitted-read"
NONMONOTONIC_POLL: Final = "nonmonotonic-poll"
POLL_SKIP: Final = "poll-skip"
UNSEEN: Final = "unseen"
OUTPUT_MISMATCH: Final = "output-mismatch"
ANOMALIES: Final = (
    DUPLICATE,
    INCONSISTENT_OFFSETS,
    LOST_WRITE,
    G1A,
    PRECOMMITTED_READ,
    NONMONOTONIC_POLL,
    POLL_SKIP,
    UNSEEN,
    OUTPUT_MISMATCH,
)
EXAMPLES_MAX: Final = 10  # per anomaly in a rendered report: enough to see a pattern

Position: TypeAlias = tuple[str, int, int]  # (topic, partition, offset)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One anomaly: its name, what it is about, and the operations (history indices) showing it."""

    name: str
    detail: str
    values: tuple[int, ...] = ()
    positions: tuple[Position, ...] = ()
    ops: tuple[int, ...] = ()


@dataclass
class Report:
    """Every anomaly found, and what could not be checked."""

    anomalies: list[Anomaly] = field(default_factory=list)
    never_polled: int = 0  # acknowledged-committed values that no poll returned
    unchecked: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(ANOMALIES, 0)
        counts.update(Counter(a.name for a in self.anomalies))
        return counts

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def of(self, name: str) -> list[Anomaly]:
        return [a for a in self.anomalies if a.name == name]

    def render(self, examples_max: int = EXAMPLES_MAX) -> str:
        """A report for a failure message: the counts, then examples of each anomaly."""
        head = "valid" if self.valid else "INVALID"
        lines = [f"history checked: {head}; {self.never_polled} committed values never polled"]
        lines += [f"  not checked: {u}" for u in self.unchecked]
        for name, n in self.counts.items():
            if n:
                lines.append(f"  {name}: {n}")
                lines += [f"    - {a.detail} (ops {list(a.ops)})" for a in self.of(name)][
                    :examples_max
                ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "counts": self.counts,
            "never_polled": self.never_polled,
            "unchecked": list(self.unchecked),
            "anomalies": [
                {
                    "name": a.name,
                    "detail": a.detail,
                    "values": list(a.values),
                    "positions": [list(p) for p in a.positions],
                    "ops": list(a.ops),
                }
                for a in self.anomalies
            ],
        }


@dataclass(frozen=True, slots=True)
class Transform:
    """A consume-transform-produce loop: ``group`` reads ``input_topic`` and writes
    ``fn(value)`` to ``output_topic`` with its offsets, in one transaction per batch."""

    input_topic: str
    output_topic: str
    group: str
    fn: Callable[[int], int]


def check(history: History, transforms: Sequence[Transform] = ()) -> Report:
    """Every anomaly of the module docstring in ``history``; ``transforms`` name the
    consume-transform-produce loops whose outputs to check. Raises ValueError if malformed."""
    validate(history)
    ix = _Index(history)
    report = Report()
    _duplicates(ix, report)
    _inconsistent_offsets(ix, report)
    _aborted_and_precommitted_reads(ix, report)
    _sessions(ix, report)
    if ix.final is None:
        report.unchecked.append(
            "lost-write, unseen, poll-skip, output-mismatch and the final read's part of G1a:"
            " the history has no final read"
        )
    else:
        _lost_writes(ix, report)
        _unseen(ix, report)
        for t in transforms:
            _output_mismatch(ix, t, report)
    return report


def validate(history: History) -> None:
    """Raise ValueError at the first operation that no correct harness could record."""
    finals = 0
    isolation: dict[tuple[str, str], str] = {}
    for i, op in enumerate(history.ops):
        where = f"op {i} ({type(op).__name__})"
        if op.complete_ns < op.invoke_ns:
            raise ValueError(f"{where}: completes before it is invoked")
        if isinstance(op, Txn):
            end = op.end
            if end is not None and (
                end.complete_ns < end.invoke_ns or end.invoke_ns < op.invoke_ns
            ):
                raise ValueError(f"{where}: its end's times are out of order")
        elif isinstance(op, Poll):
            if op.outcome != "ok" and op.records:
                raise ValueError(f"{where}: outcome {op.outcome} but returned records")
            key = (op.consumer, op.session)
            if isolation.setdefault(key, op.isolation) != op.isolation:
                raise ValueError(f"{where}: session {key} changed its isolation level")
        else:
            finals += 1
            if finals > 1:
                raise ValueError(f"{where}: a second final read")
            if op.outcome != "ok":
                raise ValueError(f"{where}: a final read must succeed (outcome {op.outcome})")


class _Index:
    """What every check needs, built in one pass over the history."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.txns: dict[int, Txn] = {}
        self.writers: dict[int, list[int]] = defaultdict(list)  # value -> txn op indices
        self.polls: list[tuple[int, Poll]] = []  # every poll, in history order
        self.final: FinalRead | None = None
        self.final_index = -1
        self.fc: dict[TopicPartition, dict[int, int]] = defaultdict(dict)
        self.fu: dict[TopicPartition, dict[int, int]] = defaultdict(dict)
        # position -> value -> ops that read it there; value -> positions, per isolation
        self.seen: dict[Position, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
        self.rc_at: dict[int, set[Position]] = defaultdict(set)
        self.any_at: dict[int, set[Position]] = defaultdict(set)
        for i, op in enumerate(history.ops):
            if isinstance(op, Txn):
                self.txns[i] = op
                for w in op.writes:
                    self.writers[w.value].append(i)
            elif isinstance(op, Poll):
                self.polls.append((i, op))
                for r in op.records:
                    self._saw((r.topic, r.partition, r.offset), r.value, i, op.isolation)
            else:
                self.final, self.final_index = op, i
                for p in op.partitions:
                    tp = (p.topic, p.partition)
                    for o, v in p.committed:
                        self.fc[tp][o] = v
                        self._saw((*tp, o), v, i, READ_COMMITTED)
                    for o, v in p.uncommitted:
                        self.fu[tp][o] = v
                        self._saw((*tp, o), v, i, "read_uncommitted")
        self.fc_values = {tp: set(m.values()) for tp, m in self.fc.items()}
        self.fu_values = {tp: set(m.values()) for tp, m in self.fu.items()}
        self.fc_at: dict[int, list[Position]] = defaultdict(list)  # value -> positions in FC
        for tp, m in sorted(self.fc.items()):
            for o, v in sorted(m.items()):
                self.fc_at[v].append((*tp, o))

    def _saw(self, pos: Position, value: int, op: int, isolation: str) -> None:
        self.seen[pos][value].add(op)
        self.any_at[value].add(pos)
        if isolation == READ_COMMITTED:
            self.rc_at[value].add(pos)

    def ops_reading(self, value: int, positions: Iterable[Position]) -> tuple[int, ...]:
        return tuple(sorted({op for pos in positions for op in self.seen[pos].get(value, ())}))


def _duplicates(ix: _Index, report: Report) -> None:
    for v, positions in sorted(ix.any_at.items()):
        rc = ix.rc_at.get(v, set())
        allowed = max(1, len(ix.writers.get(v, ())))
        if len(rc) > 1:
            why = "read_committed"
        elif len(positions) > allowed:
            why = f"all reads ({allowed} write{'s' if allowed > 1 else ''})"
        else:
            continue
        shown = sorted(rc if len(rc) > 1 else positions)
        report.anomalies.append(
            Anomaly(
                DUPLICATE,
                f"value {v} at {_positions(shown)} ({why})",
                values=(v,),
                positions=tuple(shown),
                ops=ix.ops_reading(v, shown),
            )
        )


def _inconsistent_offsets(ix: _Index, report: Report) -> None:
    for pos, by_value in sorted(ix.seen.items()):
        if len(by_value) > 1:
            ops = sorted({op for ops in by_value.values() for op in ops})
            report.anomalies.append(
                Anomaly(
                    INCONSISTENT_OFFSETS,
                    f"{_position(pos)} read as {sorted(by_value)}",
                    values=tuple(sorted(by_value)),
                    positions=(pos,),
                    ops=tuple(ops),
                )
            )


def _aborted_and_precommitted_reads(ix: _Index, report: Report) -> None:
    """G1a and precommitted-read, one anomaly per value, naming every poll that shows it."""
    g1a: dict[int, tuple[str, set[int], set[Position]]] = {}
    early: dict[int, tuple[str, set[int], set[Position]]] = {}
    for i, poll in ix.polls:
        if poll.isolation != READ_COMMITTED:
            continue
        for r in poll.records:
            pos = (r.topic, r.partition, r.offset)
            writers = [ix.txns[w] for w in ix.writers.get(r.value, ())]
            why = _aborted_read(ix, r.value, (r.topic, r.partition), writers)
            if why:
                entry = g1a.setdefault(r.value, (why, set(), set()))
                entry[1].update((i, *ix.writers.get(r.value, ())))
                entry[2].add(pos)
            commits = [
                (t.end.invoke_ns, w)
                for t, w in zip(writers, ix.writers.get(r.value, ()), strict=True)
                if t.outcome != "fail" and t.end is not None
            ]
            if commits and poll.complete_ns < min(commits)[0]:
                first, w = min(commits)
                lead_ns = first - poll.complete_ns
                entry = early.setdefault(
                    r.value, (f"commit invoked by op {w} {lead_ns} ns after the poll", set(), set())
                )
                entry[1].update((i, w))
                entry[2].add(pos)
    for v, at in sorted(ix.fc_at.items()):  # the final read is read_committed too
        wrote = ix.writers.get(v, [])
        if wrote and all(ix.txns[w].outcome == "fail" for w in wrote) and v not in g1a:
            g1a[v] = (
                "its transaction" + ("s" if len(wrote) > 1 else "") + " did not commit",
                {ix.final_index, *wrote},
                set(at),
            )
    for name, found in ((G1A, g1a), (PRECOMMITTED_READ, early)):
        for v, (why, ops, positions) in sorted(found.items()):
            report.anomalies.append(
                Anomaly(
                    name,
                    f"value {v} read_committed at {_positions(positions)}: {why}",
                    values=(v,),
                    positions=tuple(sorted(positions)),
                    ops=tuple(sorted(ops)),
                )
            )


def _aborted_read(ix: _Index, value: int, tp: TopicPartition, writers: Sequence[Txn]) -> str:
    """Why a read_committed read of ``value`` is an aborted read, or "" if it is not."""
    if writers and all(t.outcome == "fail" for t in writers):
        return "its transaction" + ("s" if len(writers) > 1 else "") + " did not commit"
    if ix.final is None or any(t.outcome == "ok" for t in writers):
        return ""  # a committed value missing from the final read is a lost write instead
    if value in ix.fc_values.get(tp, ()):
        return ""
    if value in ix.fu_values.get(tp, ()):
        return "the final read shows it aborted"
    return "the final read does not hold it"


def _sessions(ix: _Index, report: Report) -> None:
    """nonmonotonic-poll and poll-skip, walking each consumer session's polls in order."""
    last: dict[tuple[str, str, TopicPartition], tuple[int, int]] = {}  # -> (offset, op)
    chain: dict[tuple[str, str], dict[TopicPartition, int]] = {}  # last offsets for skips
    reference = {
        READ_COMMITTED: {tp: sorted(m) for tp, m in ix.fc.items()},
        "read_uncommitted": {tp: sorted(m) for tp, m in ix.fu.items()},
    }
    for i, poll in ix.polls:
        session = (poll.consumer, poll.session)
        if poll.outcome == "info":
            chain.pop(session, None)
        since = chain.setdefault(session, {})
        for r in poll.records:
            tp = (r.topic, r.partition)
            key = (*session, tp)
            prev = last.get(key)
            if prev is not None and r.offset <= prev[0]:
                report.anomalies.append(
                    Anomaly(
                        NONMONOTONIC_POLL,
                        f"{poll.consumer}/{poll.session} on {tp[0]}/{tp[1]}:"
                        f" offset {r.offset} after {prev[0]}",
                        values=(r.value,),
                        positions=((*tp, prev[0]), (*tp, r.offset)),
                        ops=tuple(sorted({prev[1], i})),
                    )
                )
            a = since.get(tp)
            if a is not None and ix.final is not None and r.offset > a:
                _skips(ix, report, reference[poll.isolation], poll, key, a, r.offset, i)
            last[key] = (r.offset, i)
            since[tp] = r.offset
    if ix.final is not None:
        for p in ix.final.partitions:
            for view, slots in (("committed", p.committed), ("uncommitted", p.uncommitted)):
                for (a, _), (b, v) in itertools.pairwise(slots):
                    if b <= a:
                        report.anomalies.append(
                            Anomaly(
                                NONMONOTONIC_POLL,
                                f"final {view} read of {p.topic}/{p.partition}:"
                                f" offset {b} after {a}",
                                values=(v,),
                                positions=((p.topic, p.partition, a), (p.topic, p.partition, b)),
                                ops=(ix.final_index,),
                            )
                        )


def _skips(
    ix: _Index,
    report: Report,
    reference: dict[TopicPartition, list[int]],
    poll: Poll,
    key: tuple[str, str, TopicPartition],
    a: int,
    b: int,
    op: int,
) -> None:
    tp = key[2]
    offsets = reference.get(tp, [])
    skipped = offsets[bisect.bisect_right(offsets, a) : bisect.bisect_left(offsets, b)]
    if not skipped:
        return
    view = ix.fc if poll.isolation == READ_COMMITTED else ix.fu
    report.anomalies.append(
        Anomaly(
            POLL_SKIP,
            f"{key[0]}/{key[1]} on {tp[0]}/{tp[1]} went from {a} to {b},"
            f" skipping {poll.isolation} offsets {skipped[:5]}",
            values=tuple(view[tp][o] for o in skipped),
            positions=tuple((*tp, o) for o in skipped),
            ops=(op, ix.final_index),
        )
    )


def _lost_writes(ix: _Index, report: Report) -> None:
    for i, txn in sorted(ix.txns.items()):
        if txn.outcome != "ok":
            continue
        for w in txn.writes:
            tp = (w.topic, w.partition)
            held = ix.fc.get(tp, {})
            if w.offset is not None and held.get(w.offset) == w.value:
                continue
            if w.offset is None and w.value in ix.fc_values.get(tp, ()):
                continue
            elsewhere = [pos for pos in ix.fc_at.get(w.value, ()) if pos[:2] == tp]
            acked = "" if w.offset is None else f" acknowledged at offset {w.offset}"
            found = f"at {_positions(elsewhere)}" if elsewhere else "absent"
            report.anomalies.append(
                Anomaly(
                    LOST_WRITE,
                    f"value {w.value} committed to {tp[0]}/{tp[1]}{acked}: {found} in the final"
                    " read_committed read",
                    values=(w.value,),
                    positions=() if w.offset is None else ((*tp, w.offset),),
                    ops=(i, ix.final_index),
                )
            )


def _unseen(ix: _Index, report: Report) -> None:
    polled = {r.value for _, p in ix.polls for r in p.records}
    furthest: dict[TopicPartition, tuple[int, int]] = {}  # highest offset polled, by which op
    for i, poll in ix.polls:
        for r in poll.records:
            tp = (r.topic, r.partition)
            if r.offset > furthest.get(tp, (-1, -1))[0]:
                furthest[tp] = (r.offset, i)
    for i, txn in sorted(ix.txns.items()):
        if txn.outcome != "ok":
            continue
        for w in txn.writes:
            if w.value in polled:
                continue
            report.never_polled += 1
            tp = (w.topic, w.partition)
            offset = w.offset
            if offset is None:
                at = [pos[2] for pos in ix.fc_at.get(w.value, ()) if pos[:2] == tp]
                if len(at) != 1:
                    continue  # lost (a lost-write) or duplicated (a duplicate)
                offset = at[0]
            beyond, by = furthest.get(tp, (-1, -1))
            if beyond > offset:
                report.anomalies.append(
                    Anomaly(
                        UNSEEN,
                        f"value {w.value} at {tp[0]}/{tp[1]}/{offset} never polled, though op {by}"
                        f" polled offset {beyond}",
                        values=(w.value,),
                        positions=((*tp, offset),),
                        ops=(i, by),
                    )
                )


def _output_mismatch(ix: _Index, t: Transform, report: Report) -> None:
    assert ix.final is not None
    committed = {
        (g.topic, g.partition): g.offset
        for g in ix.final.group_offsets
        if g.group == t.group and g.topic == t.input_topic
    }
    outputs: dict[int, list[Position]] = defaultdict(list)
    for (topic, partition), slots in sorted(ix.fc.items()):
        if topic == t.output_topic:
            for o, v in sorted(slots.items()):
                outputs[v].append((topic, partition, o))
    images: set[int] = set()
    for (topic, partition), slots in sorted(ix.fc.items()):
        if topic != t.input_topic:
            continue
        upto = committed.get((topic, partition), 0)
        for o, v in sorted(slots.items()):
            out = t.fn(v)
            images.add(out)
            n = len(outputs.get(out, ()))
            consumed = o < upto
            if n == (1 if consumed else 0):
                continue
            if consumed:
                why = "no output" if n == 0 else f"{n} outputs"
            else:
                why = f"{n} output{'s' if n > 1 else ''} beyond the group's offset {upto}"
            report.anomalies.append(
                Anomaly(
                    OUTPUT_MISMATCH,
                    f"input {v} at {topic}/{partition}/{o} ({t.group}): {why}",
                    values=(v, out),
                    positions=((topic, partition, o), *outputs.get(out, ())),
                    ops=(ix.final_index,),
                )
            )
    for out, positions in sorted(outputs.items()):
        if out not in images:
            report.anomalies.append(
                Anomaly(
                    OUTPUT_MISMATCH,
                    f"output {out} at {_positions(positions)} is no input's image",
                    values=(out,),
                    positions=tuple(positions),
                    ops=(ix.final_index,),
                )
            )


def _position(pos: Position) -> str:
    return f"{pos[0]}/{pos[1]}/{pos[2]}"


def _positions(positions: Iterable[Position]) -> str:
    return ", ".join(_position(p) for p in sorted(positions))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.jepsen.checker", description="Check a saved transactions history."
    )
    parser.add_argument("history", type=Path, help="a JSON-lines file written by History.save")
    parser.add_argument("--examples", type=int, default=EXAMPLES_MAX, help="per anomaly")
    args = parser.parse_args(argv)
    try:
        report = check(load(args.history))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.render(args.examples))
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
