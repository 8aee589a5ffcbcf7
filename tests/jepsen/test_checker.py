"""The transactions checker (tests/jepsen/checker.py): a minimal history per anomaly is flagged
with exactly that anomaly, a clean one with none; random valid histories from an in-memory model
of Kafka's transactional log check clean, and each injected mutation is reported by name."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.jepsen.checker import (
    ANOMALIES,
    DUPLICATE,
    G1A,
    INCONSISTENT_OFFSETS,
    LOST_WRITE,
    NONMONOTONIC_POLL,
    OUTPUT_MISMATCH,
    POLL_SKIP,
    PRECOMMITTED_READ,
    UNSEEN,
    Report,
    Transform,
    check,
)
from tests.jepsen.history import (
    EndKind,
    FinalRead,
    GroupOffset,
    History,
    Isolation,
    Op,
    Outcome,
    PartitionRead,
    Poll,
    Record,
    Txn,
    TxnEnd,
    Write,
    load,
)

T = "t"
RC: Isolation = "read_committed"
RU: Isolation = "read_uncommitted"


class Builder:
    """Hand-written histories: each call is one operation, on a clock that ticks by 10 ns."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.now = 0

    def tick(self) -> int:
        self.now += 10
        return self.now

    def txn(
        self,
        writes: list[tuple[int, int, int | None]],  # (partition, value, acknowledged offset)
        end: EndKind | None = "commit",
        outcome: Outcome = "ok",
        offsets: tuple[GroupOffset, ...] = (),
        topic: str = T,
    ) -> int:
        invoke = self.tick()
        end_invoke = self.tick()
        complete = self.tick()
        self.ops.append(
            Txn(
                process=1,
                invoke_ns=invoke,
                complete_ns=complete,
                transactional_id="tx-1",
                writes=tuple(Write(topic, p, v, o) for p, v, o in writes),
                end=None if end is None else TxnEnd(end, end_invoke, complete, outcome),
                group_offsets=offsets,
                producer_id=7,
                producer_epoch=len(self.ops),
            )
        )
        return len(self.ops) - 1

    def poll(
        self,
        consumer: str,
        session: str,
        records: list[tuple[int, int, int]],  # (partition, offset, value)
        isolation: Isolation = RC,
        outcome: Outcome = "ok",
        topic: str = T,
    ) -> int:
        invoke = self.tick()
        self.ops.append(
            Poll(
                process=2,
                invoke_ns=invoke,
                complete_ns=self.tick(),
                outcome=outcome,
                consumer=consumer,
                session=session,
                isolation=isolation,
                records=tuple(Record(topic, p, o, v) for p, o, v in records),
            )
        )
        return len(self.ops) - 1

    def final(
        self,
        logs: dict[tuple[str, int], list[tuple[int, int, bool]]],  # (offset, value, committed)
        group_offsets: tuple[GroupOffset, ...] = (),
    ) -> History:
        parts = tuple(
            PartitionRead(
                t,
                p,
                tuple((o, v) for o, v, c in slots if c),
                tuple((o, v) for o, v, _ in slots),
            )
            for (t, p), slots in logs.items()
        )
        invoke = self.tick()
        self.ops.append(FinalRead(3, invoke, self.tick(), parts, group_offsets))
        return History(tuple(self.ops))


def base(b: Builder) -> dict[tuple[str, int], list[tuple[int, int, bool]]]:
    """A clean history up to its final read, which is returned (markers take offsets 1, 3, 5):
    txn 1 commits 1 -> t/0/0 and 2 -> t/1/0; txn 2 aborts 3 -> t/0/2; txn 3 commits 4 -> t/0/4.
    Consumer c1 reads read_committed, c2 read_uncommitted, both the whole log."""
    b.txn([(0, 1, 0), (1, 2, 0)])
    b.txn([(0, 3, 2)], end="abort")
    b.poll("c1", "s1", [(0, 0, 1), (1, 0, 2)])
    b.poll("c2", "s1", [(0, 0, 1), (0, 2, 3)], isolation=RU)
    b.txn([(0, 4, None)])
    b.poll("c1", "s1", [(0, 4, 4)])
    b.poll("c2", "s1", [(0, 4, 4)], isolation=RU)
    return {(T, 0): [(0, 1, True), (2, 3, False), (4, 4, True)], (T, 1): [(0, 2, True)]}


def flagged(report: Report) -> set[str]:
    return {name for name, n in report.counts.items() if n}


def test_a_clean_history_flags_nothing() -> None:
    b = Builder()
    report = check(b.final(base(b)))
    assert report.valid, report.render()
    assert report.counts == dict.fromkeys(ANOMALIES, 0)
    assert report.never_polled == 0
    assert report.unchecked == []
    assert json.loads(json.dumps(report.to_json()))["valid"] is True


def test_a_report_names_each_anomaly_with_its_operations() -> None:
    b = Builder()
    logs = base(b)
    logs[(T, 1)] = []
    report = check(b.final(logs))
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["valid"] is False
    assert doc["counts"][LOST_WRITE] == 1
    assert doc["anomalies"][0]["values"] == [2]
    assert "lost-write: 1" in report.render()


def test_duplicate_in_the_final_read() -> None:
    b = Builder()
    logs = base(b)
    logs[(T, 0)].append((6, 4, True))  # value 4 again, at offset 6
    report = check(b.final(logs))
    assert flagged(report) == {DUPLICATE}, report.render()
    (a,) = report.of(DUPLICATE)
    assert a.values == (4,)
    assert a.positions == ((T, 0, 4), (T, 0, 6))
    assert len(b.ops) - 1 in a.ops


def test_duplicate_in_polls_of_read_uncommitted_data() -> None:
    """Idempotence: a value written once appears at two offsets (the second poll's session is
    new, so going back is no nonmonotonic-poll)."""
    b = Builder()
    logs = base(b)
    p = b.poll("c3", "s1", [(0, 6, 3)], isolation=RU)
    report = check(b.final(logs))
    assert flagged(report) == {DUPLICATE}, report.render()
    assert p in report.of(DUPLICATE)[0].ops


def test_inconsistent_offsets() -> None:
    b = Builder()
    logs = base(b)
    p = b.poll("c3", "s1", [(0, 4, 99)], isolation=RU)
    report = check(b.final(logs))
    assert flagged(report) == {INCONSISTENT_OFFSETS}, report.render()
    (a,) = report.of(INCONSISTENT_OFFSETS)
    assert a.positions == ((T, 0, 4),)
    assert a.values == (4, 99)
    assert p in a.ops


def test_lost_write_absent_from_the_final_read() -> None:
    b = Builder()
    logs = base(b)
    logs[(T, 1)] = []
    report = check(b.final(logs))
    assert flagged(report) == {LOST_WRITE}, report.render()
    (a,) = report.of(LOST_WRITE)
    assert a.values == (2,)
    assert a.ops == (0, len(b.ops) - 1)


def test_lost_write_at_another_offset_than_acknowledged() -> None:
    b = Builder()
    logs = base(b)
    b.txn([(1, 5, 2)])  # acknowledged at t/1/2 ...
    b.poll("c1", "s1", [(1, 6, 5)])
    b.poll("c2", "s1", [(1, 6, 5)], isolation=RU)
    logs[(T, 1)].append((6, 5, True))  # ... but found at 6
    report = check(b.final(logs))
    assert flagged(report) == {LOST_WRITE}, report.render()
    assert "at t/1/6" in report.of(LOST_WRITE)[0].detail


@pytest.mark.parametrize(
    ("end", "outcome", "in_final"),
    [
        ("abort", "ok", True),  # an aborted transaction's value
        ("commit", "fail", True),  # a commit refused: definitely not committed
        (None, "ok", True),  # never committed (the client died before its end)
        ("commit", "info", True),  # unknown commit, but the final read shows it aborted
        ("commit", "info", False),  # unknown commit, value nowhere in the final read
    ],
)
def test_g1a_aborted_read(end: EndKind | None, outcome: Outcome, in_final: bool) -> None:
    b = Builder()
    logs = base(b)
    w = b.txn([(1, 5, 2)], end=end, outcome=outcome)
    p = b.poll("c3", "s1", [(1, 2, 5)])
    if in_final:
        logs[(T, 1)].append((2, 5, False))
    report = check(b.final(logs))
    assert flagged(report) == {G1A}, report.render()
    (a,) = report.of(G1A)
    assert a.values == (5,)
    assert {w, p} <= set(a.ops)


def test_g1a_an_aborted_transaction_committed_in_the_final_read() -> None:
    b = Builder()
    logs = base(b)
    w = b.txn([(1, 5, 2)], end="abort")
    logs[(T, 1)].append((2, 5, True))  # no read_committed session passed t/1/2
    report = check(b.final(logs))
    assert flagged(report) == {G1A}, report.render()
    (a,) = report.of(G1A)
    assert a.values == (5,)
    assert a.ops == (w, len(b.ops) - 1)


def test_an_unknown_commit_that_committed_reads_fine() -> None:
    b = Builder()
    logs = base(b)
    b.txn([(1, 5, None)], outcome="info")
    b.poll("c1", "s1", [(1, 2, 5)])
    logs[(T, 1)].append((2, 5, True))
    report = check(b.final(logs))
    assert report.valid, report.render()


def test_precommitted_read() -> None:
    b = Builder()
    logs = base(b)
    poll_at = b.now + 15  # the poll completes between the txn's invoke and its commit's invoke
    w = b.txn([(1, 5, 2)])
    b.ops.append(
        Poll(2, poll_at - 1, poll_at, "ok", "c1", "s1", RC, (Record(T, 1, 2, 5),)),
    )
    logs[(T, 1)].append((2, 5, True))
    txn = b.ops[w]
    assert isinstance(txn, Txn) and txn.end is not None and txn.end.invoke_ns > poll_at
    report = check(b.final(logs))
    assert flagged(report) == {PRECOMMITTED_READ}, report.render()
    (a,) = report.of(PRECOMMITTED_READ)
    assert a.ops == (w, len(b.ops) - 2)


def test_nonmonotonic_poll() -> None:
    b = Builder()
    logs = base(b)
    p = b.poll("c1", "s1", [(0, 0, 1)])  # the same session reads offset 0 again
    report = check(b.final(logs))
    assert flagged(report) == {NONMONOTONIC_POLL}, report.render()
    (a,) = report.of(NONMONOTONIC_POLL)
    assert a.positions == ((T, 0, 4), (T, 0, 0))
    assert p in a.ops


def test_a_new_session_may_go_back() -> None:
    b = Builder()
    logs = base(b)
    b.poll("c1", "s2", [(0, 0, 1), (0, 4, 4)])
    assert check(b.final(logs)).valid


def test_nonmonotonic_final_read() -> None:
    b = Builder()
    logs = base(b)
    logs[(T, 0)] = [logs[(T, 0)][0], logs[(T, 0)][2], logs[(T, 0)][1]]
    report = check(b.final(logs))
    assert flagged(report) == {NONMONOTONIC_POLL}, report.render()


def _with_two_more_commits(b: Builder) -> dict[tuple[str, int], list[tuple[int, int, bool]]]:
    """base + txns committing 5 -> t/0/6 and 6 -> t/0/8, read by c2 (read_uncommitted)."""
    logs = base(b)
    b.txn([(0, 5, 6)])
    b.txn([(0, 6, 8)])
    b.poll("c2", "s1", [(0, 6, 5), (0, 8, 6)], isolation=RU)
    logs[(T, 0)] += [(6, 5, True), (8, 6, True)]
    return logs


def test_poll_skip() -> None:
    b = Builder()
    logs = _with_two_more_commits(b)
    p = b.poll("c1", "s1", [(0, 8, 6)])  # c1 went from 4 to 8 over committed 6
    report = check(b.final(logs))
    assert flagged(report) == {POLL_SKIP}, report.render()
    (a,) = report.of(POLL_SKIP)
    assert a.values == (5,)
    assert a.positions == ((T, 0, 6),)
    assert p in a.ops


def test_a_poll_with_unknown_outcome_excuses_a_skip() -> None:
    b = Builder()
    logs = _with_two_more_commits(b)
    b.poll("c1", "s1", [], outcome="info")  # its lost answer may have held offset 6
    b.poll("c1", "s1", [(0, 8, 6)])
    assert check(b.final(logs)).valid


def test_read_committed_may_skip_aborted_records() -> None:
    """Offsets 1-3 (a marker, aborted 3, a marker) between 0 and 4 are no skip: base is valid."""
    b = Builder()
    logs = base(b)
    b.poll("c3", "s1", [(0, 0, 1), (0, 4, 4)])
    assert check(b.final(logs)).valid


def test_unseen() -> None:
    b = Builder()
    logs = base(b)
    w = b.txn([(0, 5, 6)])
    b.txn([(0, 6, 8)])
    p = b.poll("c3", "s1", [(0, 8, 6)])  # a new session starts past 6: no skip, but 5 unseen
    logs[(T, 0)] += [(6, 5, True), (8, 6, True)]
    report = check(b.final(logs))
    assert flagged(report) == {UNSEEN}, report.render()
    (a,) = report.of(UNSEEN)
    assert a.values == (5,)
    assert a.ops == (w, p)
    assert report.never_polled == 1


def test_never_polled_is_counted_but_no_anomaly() -> None:
    b = Builder()
    logs = base(b)
    b.txn([(0, 5, 6)])
    logs[(T, 0)].append((6, 5, True))
    report = check(b.final(logs))
    assert report.valid, report.render()
    assert report.never_polled == 1


def test_without_a_final_read_what_needs_it_is_unchecked() -> None:
    b = Builder()
    base(b)
    report = check(History(tuple(b.ops)))
    assert report.valid
    assert len(report.unchecked) == 1 and "lost-write" in report.unchecked[0]


# -- consume-transform-produce --------------------------------------------------------------------


LOOP = Transform("in", "out", "g", lambda v: v + 1000)


def ctp(
    outputs: list[tuple[int, int]], consumed: int
) -> History:  # outputs: (offset, value) in out/0
    """Inputs 1, 2, 3 at in/0/0-2 (non-transactional); the group committed ``consumed``."""
    b = Builder()
    logs = {
        ("in", 0): [(0, 1, True), (1, 2, True), (2, 3, True)],
        ("out", 0): [(o, v, True) for o, v in outputs],
    }
    return b.final(logs, group_offsets=(GroupOffset("g", "in", 0, consumed),))


def test_output_matches_input() -> None:
    assert check(ctp([(0, 1001), (2, 1002)], consumed=2), [LOOP]).valid


@pytest.mark.parametrize(
    ("outputs", "consumed", "extra", "needle"),
    [
        ([(0, 1001)], 2, set(), "input 2 at in/0/1 (g): no output"),
        ([(0, 1001), (2, 1002), (4, 1002)], 2, {DUPLICATE}, "input 2 at in/0/1 (g): 2 outputs"),
        ([(0, 1001), (2, 1002), (4, 1003)], 2, set(), "1 output beyond the group's offset 2"),
        ([(0, 1001), (2, 1002), (4, 5)], 2, set(), "output 5 at out/0/4 is no input's image"),
    ],
)
def test_output_mismatch(
    outputs: list[tuple[int, int]], consumed: int, extra: set[str], needle: str
) -> None:
    report = check(ctp(outputs, consumed), [LOOP])
    assert flagged(report) == {OUTPUT_MISMATCH} | extra, report.render()
    (a,) = report.of(OUTPUT_MISMATCH)
    assert needle in a.detail


def test_a_retried_output_may_be_read_uncommitted_twice() -> None:
    """The loop aborted, then rewrote output 1001 in a new transaction that committed."""
    b = Builder()
    b.txn([(0, 1001, 0)], end="abort", topic="out", offsets=(GroupOffset("g", "in", 0, 1),))
    b.txn([(0, 1001, 2)], topic="out", offsets=(GroupOffset("g", "in", 0, 1),))
    b.poll("r", "s1", [(0, 0, 1001), (0, 2, 1001)], isolation=RU, topic="out")
    b.poll("c", "s1", [(0, 2, 1001)], topic="out")
    logs = {("in", 0): [(0, 1, True)], ("out", 0): [(0, 1001, False), (2, 1001, True)]}
    report = check(b.final(logs, group_offsets=(GroupOffset("g", "in", 0, 1),)), [LOOP])
    assert report.valid, report.render()


# -- malformed histories, save and load -----------------------------------------------------------


def test_malformed_histories_raise() -> None:
    poll = Poll(1, 10, 20, "fail", "c", "s", RC, (Record(T, 0, 0, 1),))
    with pytest.raises(ValueError, match="returned records"):
        check(History((poll,)))
    with pytest.raises(ValueError, match="completes before"):
        check(History((replace(poll, outcome="ok", complete_ns=5),)))
    with pytest.raises(ValueError, match="isolation"):
        check(History((replace(poll, outcome="ok"), replace(poll, outcome="ok", isolation=RU))))
    final = FinalRead(3, 30, 40, ())
    with pytest.raises(ValueError, match="second final read"):
        check(History((final, final)))


def test_save_load_round_trip(tmp_path: Path) -> None:
    b = Builder()
    logs = base(b)
    b.txn([(0, 9, None)], end=None, offsets=(GroupOffset("g", T, 0, 5),))
    b.poll("c1", "s1", [], outcome="info")
    history = b.final(logs, group_offsets=(GroupOffset("g", T, 0, 5),))
    path = tmp_path / "history.jsonl"
    history.save(path)
    assert load(path) == history
    assert History.load(path) == history


def test_load_names_a_malformed_line(tmp_path: Path) -> None:
    b = Builder()
    path = tmp_path / "history.jsonl"
    b.final(base(b)).save(path)
    lines = path.read_text().splitlines()
    op = json.loads(lines[3])
    assert op["type"] == "poll"
    op["isolation"] = "serializable"
    lines[3] = json.dumps(op)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"history.jsonl:4: malformed"):
        load(path)


def test_command_line_rechecks_a_saved_history(tmp_path: Path) -> None:
    b = Builder()
    logs = base(b)
    logs[(T, 1)] = []
    path = tmp_path / "history.jsonl"
    b.final(logs).save(path)
    run = subprocess.run(
        [sys.executable, "-m", "tests.jepsen.checker", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    assert "lost-write: 1" in run.stdout


# -- random valid histories from a model of the log -----------------------------------------------

PARTITIONS = 3
CONSUMERS = 3
OPEN_MAX = 3  # concurrent transactions
POLL_RECORDS_MAX = 4


@dataclass
class _Entry:
    value: int | None  # None: a control marker
    txn: int


@dataclass
class _Open:
    process: int
    invoke_ns: int
    writes: list[Write] = field(default_factory=list)
    first: dict[int, int] = field(default_factory=dict)  # partition -> first offset


@dataclass
class _Session:
    name: str
    isolation: Isolation
    position: list[int]


class Model:
    """Kafka's transactional log in memory: one list per partition of data records and markers,
    each transaction open, committed or aborted; the last stable offset is the first offset of
    the earliest open transaction. Consumers read in sessions, ``read_committed`` only committed
    records below the LSO, ``read_uncommitted`` every record; a new session starts at or before
    its consumer's position, so everything a consumer passed was returned to it."""

    def __init__(self) -> None:
        self.now = 0
        self.logs: list[list[_Entry]] = [[] for _ in range(PARTITIONS)]
        self.status: dict[int, str] = {}
        self.open: dict[int, _Open] = {}
        self.ops: list[Op] = []
        self.values = iter(range(1, 1 << 30))
        self.txn_ids = iter(range(1 << 30))
        self.sessions = [
            _Session(f"s{c}-0", RC if c != 1 else RU, [0] * PARTITIONS) for c in range(CONSUMERS)
        ]

    def tick(self) -> int:
        self.now += 1 + self.now % 7  # uneven steps, still one monotonic clock
        return self.now

    def step(self, action: int, arg: int) -> None:
        if action <= 1:
            self.begin(arg)
        elif action <= 4:
            self.write(arg)
        elif action <= 6:
            self.end(arg)
        elif action <= 8:
            self.poll(arg)
        else:
            self.new_session(arg)

    def begin(self, arg: int) -> None:
        if len(self.open) < OPEN_MAX:
            t = next(self.txn_ids)
            self.open[t] = _Open(process=arg % 4, invoke_ns=self.tick())
            self.status[t] = "open"

    def write(self, arg: int) -> None:
        if not self.open:
            return
        t = sorted(self.open)[arg % len(self.open)]
        p = (arg >> 2) % PARTITIONS
        log = self.logs[p]
        self.open[t].first.setdefault(p, len(log))
        v = next(self.values)
        acked = (arg >> 4) % 4 != 0
        self.open[t].writes.append(Write(T, p, v, len(log) if acked else None))
        log.append(_Entry(v, t))

    def end(self, arg: int, fate: int | None = None) -> None:
        if not self.open:
            return
        t = sorted(self.open)[arg % len(self.open)]
        fate = (arg >> 2) % 9 if fate is None else fate
        end: TxnEnd | None
        invoke = self.tick()
        kind: EndKind = "commit" if fate <= 5 else "abort"
        commits = fate <= 3
        outcome: Outcome = ("ok", "ok", "ok", "info", "info", "fail", "ok", "info", "ok")[fate]
        self.status[t] = "committed" if commits else "aborted"
        txn = self.open.pop(t)
        for p in sorted(txn.first):
            self.logs[p].append(_Entry(None, t))
        complete = self.tick()
        end = None if fate == 8 else TxnEnd(kind, invoke, complete, outcome)
        self.ops.append(
            Txn(txn.process, txn.invoke_ns, complete, f"tx-{txn.process}", tuple(txn.writes), end)
        )

    def lso(self, p: int) -> int:
        firsts = [o.first[p] for o in self.open.values() if p in o.first]
        return min(firsts, default=len(self.logs[p]))

    def poll(self, arg: int) -> None:
        c = arg % CONSUMERS
        s = self.sessions[c]
        invoke = self.tick()
        if (arg >> 2) % 10 == 0:  # an answer lost: nothing served, the position stays
            self.ops.append(Poll(c, invoke, self.tick(), "info", f"c{c}", s.name, s.isolation))
            return
        records: list[Record] = []
        for p in range(PARTITIONS):
            log = self.logs[p]
            stop = self.lso(p) if s.isolation == RC else len(log)
            o = s.position[p]
            taken = 0
            while o < stop and taken < POLL_RECORDS_MAX:
                e = log[o]
                if e.value is not None and (s.isolation == RU or self.status[e.txn] == "committed"):
                    records.append(Record(T, p, o, e.value))
                    taken += 1
                o += 1
            s.position[p] = o
        self.ops.append(
            Poll(c, invoke, self.tick(), "ok", f"c{c}", s.name, s.isolation, tuple(records))
        )

    def new_session(self, arg: int) -> None:
        c = arg % CONSUMERS
        old = self.sessions[c]
        n = int(old.name.rsplit("-", 1)[1]) + 1
        position = [min(o, (arg >> (4 + 3 * p)) % 8 * o // 7) for p, o in enumerate(old.position)]
        iso: Isolation = RC if (arg >> 2) % 3 else RU
        self.sessions[c] = _Session(f"s{c}-{n}", iso, position)

    def finish(self) -> History:
        """Every open transaction times out (aborted); then the final read."""
        while self.open:
            self.end(0, fate=8)
        parts = tuple(
            PartitionRead(
                T,
                p,
                tuple(
                    (o, e.value)
                    for o, e in enumerate(log)
                    if e.value is not None and self.status[e.txn] == "committed"
                ),
                tuple((o, e.value) for o, e in enumerate(log) if e.value is not None),
            )
            for p, log in enumerate(self.logs)
        )
        invoke = self.tick()
        self.ops.append(FinalRead(9, invoke, self.tick(), parts))
        return History(tuple(self.ops))


steps = st.lists(st.tuples(st.integers(0, 9), st.integers(0, (1 << 16) - 1)), max_size=150)


def run_model(program: list[tuple[int, int]], tail: bool = False) -> History:
    """The history of ``program``; with ``tail``, then a committed and an aborted transaction
    over every partition and three polls of each consumer, so every mutation has a target."""
    m = Model()
    for action, arg in program:
        m.step(action, arg)
    if tail:
        while m.open:
            m.end(0, fate=8)
        for fate in (0, 6):
            m.begin(0)
            for p in range(PARTITIONS):
                m.write(p << 2 | 1 << 4)
            m.end(0, fate=fate)
        for c in [c for c in range(CONSUMERS) for _ in range(3)]:
            m.poll(c | 1 << 2)
    return m.finish()


# Histories are built in well under a millisecond per step, but two shared cores can stall any
# example; the deadline says nothing about the checker.
QUICK = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(steps)
def test_model_histories_check_clean(program: list[tuple[int, int]]) -> None:
    history = run_model(program)
    report = check(history)
    assert report.valid, report.render()


def _final(history: History) -> FinalRead:
    final = history.ops[-1]
    assert isinstance(final, FinalRead)
    return final


def _replace_final(history: History, **changes: object) -> History:
    return History((*history.ops[:-1], replace(_final(history), **changes)))  # type: ignore[arg-type]


def drop_committed_record(history: History, pick: int) -> History | None:
    """The log lost an acknowledged-committed record (from both final reads)."""
    committed = [
        w for op in history.ops if isinstance(op, Txn) and op.outcome == "ok" for w in op.writes
    ]
    if not committed:
        return None
    w = committed[pick % len(committed)]
    parts = tuple(
        replace(
            p,
            committed=tuple(s for s in p.committed if s[1] != w.value),
            uncommitted=tuple(s for s in p.uncommitted if s[1] != w.value),
        )
        for p in _final(history).partitions
    )
    return _replace_final(history, partitions=parts)


def insert_aborted_read(history: History, pick: int) -> History | None:
    """A read_committed poll returns a record the final read shows aborted."""
    aborted = [
        (p.partition, o, v)
        for p in _final(history).partitions
        for o, v in sorted(set(p.uncommitted) - set(p.committed))
    ]
    if not aborted:
        return None
    p, o, v = aborted[pick % len(aborted)]
    after = _final(history).complete_ns
    poll = Poll(0, after + 1, after + 2, "ok", "intruder", "s", RC, (Record(T, p, o, v),))
    return History((*history.ops[:-1], poll, history.ops[-1]))


def reorder_poll(history: History, pick: int) -> History | None:
    """A poll's records come back in reverse order."""
    polls = [
        i
        for i, op in enumerate(history.ops)
        if isinstance(op, Poll)
        and any(
            a.partition == b.partition for a, b in zip(op.records, op.records[1:], strict=False)
        )
    ]
    if not polls:
        return None
    i = polls[pick % len(polls)]
    op = history.ops[i]
    assert isinstance(op, Poll)
    ops = list(history.ops)
    ops[i] = replace(op, records=op.records[::-1])
    return History(tuple(ops))


def duplicate_value(history: History, pick: int) -> History | None:
    """A committed value is in the final read again, past the end of another partition."""
    final = _final(history)
    slots = [(i, s) for i, p in enumerate(final.partitions) for s in p.committed]
    if not slots:
        return None
    i, (_, v) = slots[pick % len(slots)]
    j = (i + 1) % len(final.partitions)
    p = final.partitions[j]
    extra = (10**9, v)
    parts = list(final.partitions)
    parts[j] = replace(p, committed=(*p.committed, extra), uncommitted=(*p.uncommitted, extra))
    return _replace_final(history, partitions=tuple(parts))


def precommit_poll(history: History, pick: int) -> History | None:
    """A read_committed poll completes before the commit of a value it returned is invoked."""
    invoked: dict[int, int] = {}
    for op in history.ops:
        if isinstance(op, Txn) and op.outcome != "fail" and op.end is not None:
            invoked.update((w.value, op.end.invoke_ns) for w in op.writes)
    polls = [
        (i, invoked[r.value])
        for i, op in enumerate(history.ops)
        if isinstance(op, Poll) and op.isolation == RC
        for r in op.records[:1]
        if r.value in invoked
    ]
    if not polls:
        return None
    i, at = polls[pick % len(polls)]
    op = history.ops[i]
    assert isinstance(op, Poll)
    ops = list(history.ops)
    ops[i] = replace(op, invoke_ns=min(op.invoke_ns, at - 2), complete_ns=at - 1)
    return History(tuple(ops))


def change_polled_value(history: History, pick: int) -> History | None:
    """A poll sees another value at an offset than the other reads do."""
    polled = [
        (i, j)
        for i, op in enumerate(history.ops)
        if isinstance(op, Poll)
        for j in range(len(op.records))
    ]
    if not polled:
        return None
    i, j = polled[pick % len(polled)]
    op = history.ops[i]
    assert isinstance(op, Poll)
    records = list(op.records)
    records[j] = replace(records[j], value=-records[j].value)
    ops = list(history.ops)
    ops[i] = replace(op, records=tuple(records))
    return History(tuple(ops))


def commit_aborted_in_final(history: History, pick: int) -> History | None:
    """The final read_committed read holds a value of a transaction that did not commit."""
    failed = sorted(
        (w.partition, w.value)
        for op in history.ops
        if isinstance(op, Txn) and op.outcome == "fail"
        for w in op.writes
    )
    if not failed:
        return None
    partition, value = failed[pick % len(failed)]
    parts = list(_final(history).partitions)
    p = parts[partition]
    slot = next(s for s in p.uncommitted if s[1] == value)
    parts[partition] = replace(p, committed=tuple(sorted((*p.committed, slot))))
    return _replace_final(history, partitions=tuple(parts))


Mutation = Callable[[History, int], History | None]
MUTATIONS: list[tuple[Mutation, str, set[str]]] = [
    # (mutation, the anomaly it must cause, anomalies it may cause as well)
    (drop_committed_record, LOST_WRITE, set()),
    (insert_aborted_read, G1A, set()),
    (reorder_poll, NONMONOTONIC_POLL, {POLL_SKIP}),  # b, a after x < a < b skips a
    (duplicate_value, DUPLICATE, set()),
    (precommit_poll, PRECOMMITTED_READ, set()),
    # a read_committed session that passed over it now skipped a committed record
    (commit_aborted_in_final, G1A, {POLL_SKIP}),
    # a changed read_committed value is no committed value (G1a); the true one may go unseen
    (change_polled_value, INCONSISTENT_OFFSETS, {G1A, UNSEEN}),
]


@QUICK
@given(steps, st.integers(0, 1 << 16), st.sampled_from(MUTATIONS))
def test_a_mutation_is_reported(
    program: list[tuple[int, int]], pick: int, mutation: tuple[Mutation, str, set[str]]
) -> None:
    mutate, expected, also = mutation
    mutated = mutate(run_model(program, tail=True), pick)
    assume(mutated is not None)
    assert mutated is not None
    report = check(mutated)
    assert expected in flagged(report), report.render()
    assert flagged(report) <= {expected} | also, report.render()


@pytest.mark.slow
@settings(QUICK, max_examples=2000)
@given(steps, st.integers(0, 1 << 16), st.sampled_from(MUTATIONS))
def test_a_mutation_is_reported_long(
    program: list[tuple[int, int]], pick: int, mutation: tuple[Mutation, str, set[str]]
) -> None:
    test_a_mutation_is_reported.hypothesis.inner_test(program, pick, mutation)  # type: ignore[attr-defined]


@pytest.mark.slow
@settings(QUICK, max_examples=2000)
@given(steps)
def test_model_histories_check_clean_long(program: list[tuple[int, int]]) -> None:
    test_model_histories_check_clean.hypothesis.inner_test(program)  # type: ignore[attr-defined]


# -- random consume-transform-produce runs --------------------------------------------------------

IN_PARTITIONS = 2
INPUTS_PER_PARTITION = 12


class LoopModel:
    """A consume-transform-produce loop over a model log: inputs 1.. in ``in`` (written before,
    not transactionally); each step reads a batch from the group's committed offset of one
    partition (a new session: the loop seeks there) and writes its outputs to ``out/0`` with the
    group's new offset in one transaction whose fate is drawn as in :class:`Model`. A retried
    batch rewrites the same outputs in a new transaction."""

    def __init__(self) -> None:
        self.now = 0
        self.inputs = [
            [p * INPUTS_PER_PARTITION + i + 1 for i in range(INPUTS_PER_PARTITION)]
            for p in range(IN_PARTITIONS)
        ]
        self.committed = [0] * IN_PARTITIONS
        self.out: list[tuple[int | None, bool]] = []  # (value or None for a marker, committed)
        self.ops: list[Op] = []
        self.batches = 0

    def tick(self) -> int:
        self.now += 3
        return self.now

    def step(self, arg: int) -> None:
        p = arg % IN_PARTITIONS
        start = self.committed[p]
        batch = self.inputs[p][start : start + 1 + (arg >> 1) % 3]
        if not batch:
            return
        self.batches += 1
        invoke = self.tick()
        records = tuple(Record("in", p, start + i, v) for i, v in enumerate(batch))
        self.ops.append(Poll(0, invoke, self.tick(), "ok", "loop", f"b{self.batches}", RC, records))
        fate = (arg >> 3) % 9
        commits = fate <= 3
        first = len(self.out)
        writes = tuple(Write("out", 0, LOOP.fn(v), first + i) for i, v in enumerate(batch))
        self.out += [(LOOP.fn(v), commits) for v in batch] + [(None, commits)]
        offset = GroupOffset("g", "in", p, start + len(batch))
        if commits:
            self.committed[p] = offset.offset
        end_invoke = self.tick()
        kind: EndKind = "commit" if fate <= 5 else "abort"
        outcome: Outcome = ("ok", "ok", "ok", "info", "info", "fail", "ok", "info", "ok")[fate]
        end = None if fate == 8 else TxnEnd(kind, end_invoke, self.tick(), outcome)
        self.ops.append(Txn(0, invoke, self.now, "loop", writes, end, (offset,)))

    def finish(self) -> History:
        ins = tuple(
            PartitionRead("in", p, tuple(enumerate(vs)), tuple(enumerate(vs)))
            for p, vs in enumerate(self.inputs)
        )
        out = PartitionRead(
            "out",
            0,
            tuple((o, v) for o, (v, c) in enumerate(self.out) if v is not None and c),
            tuple((o, v) for o, (v, _) in enumerate(self.out) if v is not None),
        )
        offsets = tuple(GroupOffset("g", "in", p, o) for p, o in enumerate(self.committed))
        invoke = self.tick()
        self.ops.append(FinalRead(9, invoke, self.tick(), (*ins, out), offsets))
        return History(tuple(self.ops))


def run_loop(program: list[int]) -> History:
    m = LoopModel()
    for arg in program:
        m.step(arg)
    m.step(0)  # at least one batch
    return m.finish()


loop_steps = st.lists(st.integers(0, (1 << 8) - 1), max_size=40)


@QUICK
@given(loop_steps)
def test_loop_histories_check_clean(program: list[int]) -> None:
    report = check(run_loop(program), [LOOP])
    assert report.valid, report.render()


def _replace_out(history: History, change: Callable[[PartitionRead], PartitionRead]) -> History:
    final = _final(history)
    parts = tuple(change(p) if p.topic == "out" else p for p in final.partitions)
    return _replace_final(history, partitions=parts)


def drop_output(history: History, pick: int) -> History | None:
    out = next(p for p in _final(history).partitions if p.topic == "out")
    if not out.committed:
        return None
    gone = out.committed[pick % len(out.committed)]
    return _replace_out(
        history,
        lambda p: replace(
            p,
            committed=tuple(s for s in p.committed if s != gone),
            uncommitted=tuple(s for s in p.uncommitted if s != gone),
        ),
    )


def duplicate_output(history: History, pick: int) -> History | None:
    out = next(p for p in _final(history).partitions if p.topic == "out")
    if not out.committed:
        return None
    again = (10**9, out.committed[pick % len(out.committed)][1])
    return _replace_out(
        history,
        lambda p: replace(p, committed=(*p.committed, again), uncommitted=(*p.uncommitted, again)),
    )


def tear_offsets(history: History, pick: int) -> History | None:
    """The group's offset moved past an input whose output never committed."""
    final = _final(history)
    offsets = list(final.group_offsets)
    i = pick % len(offsets)
    if offsets[i].offset >= INPUTS_PER_PARTITION:
        return None
    offsets[i] = replace(offsets[i], offset=offsets[i].offset + 1)
    return _replace_final(history, group_offsets=tuple(offsets))


LOOP_MUTATIONS: list[tuple[Mutation, set[str]]] = [
    (drop_output, {LOST_WRITE}),  # lost-write too when its commit was acknowledged
    (duplicate_output, {DUPLICATE}),
    (tear_offsets, set()),
]


@QUICK
@given(loop_steps, st.integers(0, 1 << 16), st.sampled_from(LOOP_MUTATIONS))
def test_a_loop_mutation_is_reported(
    program: list[int], pick: int, mutation: tuple[Mutation, set[str]]
) -> None:
    mutate, also = mutation
    mutated = mutate(run_loop(program), pick)
    assume(mutated is not None)
    assert mutated is not None
    report = check(mutated, [LOOP])
    assert OUTPUT_MISMATCH in flagged(report), report.render()
    assert flagged(report) <= {OUTPUT_MISMATCH} | also, report.render()


@pytest.mark.slow
@settings(QUICK, max_examples=2000)
@given(loop_steps, st.integers(0, 1 << 16), st.sampled_from(LOOP_MUTATIONS))
def test_a_loop_mutation_is_reported_long(
    program: list[int], pick: int, mutation: tuple[Mutation, set[str]]
) -> None:
    test_a_loop_mutation_is_reported.hypothesis.inner_test(program, pick, mutation)  # type: ignore[attr-defined]
