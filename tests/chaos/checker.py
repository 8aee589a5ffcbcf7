"""A Jepsen-style checker over the history of a chaos run, reporting Jepsen's anomaly names.

A history is what the test's clients did and saw, in the order they saw it:

* :class:`Send` — one produce and its answer: ``ok`` (acknowledged, with its partition and
  offset), ``fail`` (definitely not written: a 4xx answer) or ``info`` (indeterminate: timeout,
  connection error, 5xx — it may or may not have been written). Every send carries a value no
  other send carries (the generator makes them unique), so a value names its send.
* :class:`Poll` — one read by one consumer on one partition: the (offset, value) records it
  returned, in order.
* :class:`Seek` — a consumer repositioned on a partition (a seek, a group rebalance, a restart
  from a committed offset): its next poll there may start anywhere at or after ``offset`` (or
  anywhere at all when ``offset`` is None), so going back is allowed across a seek.
* ``final`` — per partition, the whole log read at the end from offset 0 once every fault has
  healed. It is the reference for which offsets exist (offsets may have gaps: transaction
  markers take an offset and hold no record).

Anomalies (each counted once per partition-offset or per value, with examples):

``lost-write``
    A value that was acknowledged (``ok``) or seen by a poll is absent from the final read of
    its partition: committed data disappeared.
``duplicate``
    One value read (final read or any poll) at two different (partition, offset) positions.
``inconsistent-offsets``
    One (partition, offset) with two different values among the polls, the final read and the
    acknowledged offsets of ok sends; or an ok send's value read only at positions other than
    the one it was acknowledged at.
``nonmonotonic-poll``
    Within one consumer and partition: offsets inside one poll not strictly increasing; a poll
    starting before the previous poll's last offset + 1 (backwards) or after an offset that
    exists in the final read and was not returned (a skip); the same for the first poll after
    a ``Seek(offset=n)``, which must not start before n nor skip an existing offset >= n. The
    final read itself must have strictly increasing offsets.
``unseen``
    Only when ``polls_complete`` (the history says the consumers read every partition to the
    end): an ok send's value present in the final read but returned by no poll.
``phantom-write``
    A send answered ``fail`` (definitely not written) whose value was read anyway.

A run passes with zero of each. Not checked: ordering between different producers, read-your-
writes, transactions' atomicity (Jepsen's G0/G1c) — the chaos tests do not need them.

Command line: ``python -m tests.chaos.checker history.jsonl`` re-checks a recorded history
(:class:`HistoryLog`), prints the report and exits 1 on anomalies.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TextIO

Outcome = Literal["ok", "fail", "info"]
Record = tuple[int, str]  # (offset, value)
Position = tuple[int, int]  # (partition, offset)

LOST_WRITE: Final = "lost-write"
DUPLICATE: Final = "duplicate"
INCONSISTENT_OFFSETS: Final = "inconsistent-offsets"
NONMONOTONIC_POLL: Final = "nonmonotonic-poll"
UNSEEN: Final = "unseen"
PHANTOM_WRITE: Final = "phantom-write"
ANOMALIES: Final = (
    LOST_WRITE,
    DUPLICATE,
    INCONSISTENT_OFFSETS,
    NONMONOTONIC_POLL,
    UNSEEN,
    PHANTOM_WRITE,
)
EXAMPLES_MAX: Final = 10  # per anomaly in a report: enough to see a pattern, short to read
FINAL_READER: Final = "<final read>"


@dataclass(frozen=True, slots=True)
class Send:
    key: str
    value: str
    partition: int | None
    outcome: Outcome
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Poll:
    consumer: str
    partition: int
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class Seek:
    consumer: str
    partition: int
    offset: int | None


Op = Send | Poll | Seek


@dataclass(frozen=True, slots=True)
class History:
    ops: tuple[Op, ...]
    final: Mapping[int, Sequence[Record]]
    polls_complete: bool = False


@dataclass(frozen=True, slots=True)
class _Ack:
    """An ok send: its partition is known (the produce answer names it)."""

    value: str
    partition: int
    offset: int | None

    @classmethod
    def of(cls, s: Send) -> _Ack:
        if s.partition is None:
            raise ValueError(f"send {s.value!r} is ok but names no partition")
        return cls(s.value, s.partition, s.offset)


@dataclass
class CheckResult:
    """Counts per anomaly name and up to ``examples_max`` examples of each."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {a: [] for a in ANOMALIES})
    examples_max: int = EXAMPLES_MAX

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def add(self, anomaly: str, example: str) -> None:
        self.counts[anomaly] += 1
        if len(self.examples[anomaly]) < self.examples_max:
            self.examples[anomaly].append(example)

    def render(self) -> str:
        """A report for a test failure message: one line per anomaly, then its examples."""
        if self.ok:
            return "history checked: no anomalies"
        lines = ["history checked: ANOMALIES"]
        for name in ANOMALIES:
            lines.append(f"  {name}: {self.counts[name]}")
            lines.extend(f"    - {ex}" for ex in self.examples[name])
        return "\n".join(lines)


def check(history: History, examples_max: int = EXAMPLES_MAX) -> CheckResult:
    """Every anomaly of the module docstring found in ``history``."""
    result = CheckResult(examples_max=examples_max)
    sends = [op for op in history.ops if isinstance(op, Send)]
    polls = [op for op in history.ops if isinstance(op, Poll)]
    final_values = {p: {v for _, v in recs} for p, recs in history.final.items()}

    # Where each value was read, and what each position was read or acknowledged to hold.
    read_at: dict[str, set[Position]] = defaultdict(set)
    held: dict[Position, set[str]] = defaultdict(set)
    for p, recs in history.final.items():
        for o, v in recs:
            read_at[v].add((p, o))
            held[(p, o)].add(v)
    for poll in polls:
        for o, v in poll.records:
            read_at[v].add((poll.partition, o))
            held[(poll.partition, o)].add(v)
    acked = [_Ack.of(s) for s in sends if s.outcome == "ok"]
    for a in acked:
        if a.offset is not None:
            held[(a.partition, a.offset)].add(a.value)

    _lost_writes(result, acked, polls, final_values)
    for v, positions in sorted(read_at.items()):
        if len(positions) > 1:
            result.add(DUPLICATE, f"{v!r} read at {_positions(positions)}")
    _inconsistent_offsets(result, held, acked, read_at)
    _nonmonotonic(result, history, polls)
    if history.polls_complete:
        polled = {v for poll in polls for _, v in poll.records}
        for a in acked:
            if a.value in final_values.get(a.partition, ()) and a.value not in polled:
                result.add(UNSEEN, f"{a.value!r} acknowledged at {a.partition}/{a.offset}")
    for s in sends:
        if s.outcome == "fail" and s.value in read_at:
            result.add(PHANTOM_WRITE, f"{s.value!r} failed but read at {_pos_of(read_at, s)}")
    return result


def _lost_writes(
    result: CheckResult,
    acked: Iterable[_Ack],
    polls: Iterable[Poll],
    final_values: Mapping[int, set[str]],
) -> None:
    lost: dict[str, str] = {}
    for a in acked:
        if a.value not in final_values.get(a.partition, set()):
            lost[a.value] = f"{a.value!r} acknowledged at {a.partition}/{a.offset}"
    for poll in polls:
        for o, v in poll.records:
            if v not in final_values.get(poll.partition, set()) and v not in lost:
                lost[v] = f"{v!r} polled by {poll.consumer} at {poll.partition}/{o}"
    for v in sorted(lost):
        result.add(LOST_WRITE, lost[v] + ", absent from the final read")


def _inconsistent_offsets(
    result: CheckResult,
    held: Mapping[Position, set[str]],
    acked: Iterable[_Ack],
    read_at: Mapping[str, set[Position]],
) -> None:
    found: dict[Position, str] = {}
    for pos, values in held.items():
        if len(values) > 1:
            found[pos] = f"{pos[0]}/{pos[1]} holds {sorted(values)}"
    for a in acked:
        if a.offset is None:
            continue
        pos = (a.partition, a.offset)
        seen = read_at.get(a.value, set())
        if seen and pos not in seen and pos not in found:
            found[pos] = (
                f"{a.value!r} acknowledged at {pos[0]}/{pos[1]}, read at {_positions(seen)}"
            )
    for pos in sorted(found):
        result.add(INCONSISTENT_OFFSETS, found[pos])


def _nonmonotonic(result: CheckResult, history: History, polls: Sequence[Poll]) -> None:
    existing = {p: sorted(o for o, _ in recs) for p, recs in history.final.items()}
    for p, recs in history.final.items():
        offsets = [o for o, _ in recs]
        for a, b in itertools.pairwise(offsets):
            if b <= a:
                result.add(NONMONOTONIC_POLL, f"{FINAL_READER} on {p}: offset {b} after {a}")
    expected: dict[tuple[str, int], int | None] = {}  # next offset; None: anywhere
    for op in history.ops:
        if isinstance(op, Seek):
            expected[(op.consumer, op.partition)] = op.offset
        elif isinstance(op, Poll) and op.records:
            where = f"{op.consumer} on {op.partition}"
            start = expected.get((op.consumer, op.partition))
            first = op.records[0][0]
            if start is not None:
                if first < start:
                    result.add(
                        NONMONOTONIC_POLL, f"{where}: went back to {first}, expected {start}"
                    )
                else:
                    _skips(result, where, existing.get(op.partition, []), start, first)
            for (a, _), (b, _) in itertools.pairwise(op.records):
                if b <= a:
                    result.add(NONMONOTONIC_POLL, f"{where}: offset {b} after {a} in one poll")
                else:
                    _skips(result, where, existing.get(op.partition, []), a + 1, b)
            expected[(op.consumer, op.partition)] = op.records[-1][0] + 1


def _skips(result: CheckResult, where: str, existing: Sequence[int], lo: int, hi: int) -> None:
    """Report existing offsets in [lo, hi) that a reader jumped over."""
    skipped = [o for o in existing if lo <= o < hi]
    if skipped:
        result.add(NONMONOTONIC_POLL, f"{where}: skipped {skipped[:5]} going to {hi}")


def _positions(positions: Iterable[Position]) -> str:
    return ", ".join(f"{p}/{o}" for p, o in sorted(positions))


def _pos_of(read_at: Mapping[str, set[Position]], s: Send) -> str:
    return _positions(read_at[s.value])


# -- recording and re-checking histories ---------------------------------------------------------


class HistoryLog:
    """Append a run's history to a JSON-lines file as it happens (one flushed line per op, so
    a crashed run keeps what it did) and read it back with :func:`load`. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: TextIO = path.open("a", encoding="utf-8")

    def __enter__(self) -> HistoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, op: Op) -> None:
        if isinstance(op, Send):
            line: dict[str, Any] = {
                "type": "send",
                "key": op.key,
                "value": op.value,
                "partition": op.partition,
                "outcome": op.outcome,
                "offset": op.offset,
            }
        elif isinstance(op, Poll):
            line = {
                "type": "poll",
                "consumer": op.consumer,
                "partition": op.partition,
                "records": [list(r) for r in op.records],
            }
        else:
            line = {
                "type": "seek",
                "consumer": op.consumer,
                "partition": op.partition,
                "offset": op.offset,
            }
        self._write(line)

    def final(self, partition: int, records: Sequence[Record]) -> None:
        """The final read of one partition."""
        self._write(
            {"type": "final", "partition": partition, "records": [list(r) for r in records]}
        )

    def polls_complete(self) -> None:
        """Say that the consumers read every partition to the end (enables ``unseen``)."""
        self._write({"type": "polls-complete"})

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()


def load(path: Path) -> History:
    """The history a :class:`HistoryLog` wrote. Raises ValueError naming a malformed line."""
    ops: list[Op] = []
    final: dict[int, list[Record]] = {}
    complete = False
    with path.open(encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                kind = line["type"]
                if kind == "send":
                    if line["outcome"] not in ("ok", "fail", "info"):
                        raise ValueError(f"outcome {line['outcome']!r}")
                    ops.append(
                        Send(
                            line["key"],
                            line["value"],
                            line["partition"],
                            line["outcome"],
                            line["offset"],
                        )
                    )
                elif kind == "poll":
                    recs = tuple((int(o), str(v)) for o, v in line["records"])
                    ops.append(Poll(line["consumer"], int(line["partition"]), recs))
                elif kind == "seek":
                    ops.append(Seek(line["consumer"], int(line["partition"]), line["offset"]))
                elif kind == "final":
                    final[int(line["partition"])] = [(int(o), str(v)) for o, v in line["records"]]
                elif kind == "polls-complete":
                    complete = True
                else:
                    raise ValueError(f"unknown type {kind!r}")
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{n}: malformed history line: {e}") from e
    return History(tuple(ops), final, complete)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.checker", description="Check a recorded chaos history."
    )
    parser.add_argument("history", type=Path, help="a JSON-lines file written by HistoryLog")
    parser.add_argument("--examples", type=int, default=EXAMPLES_MAX, help="per anomaly")
    args = parser.parse_args(argv)
    try:
        history = load(args.history)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = check(history, examples_max=args.examples)
    print(result.render())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
