"""The history checker (tests/chaos/checker.py): a correct history checks clean, and each kind
of anomaly injected into one is reported under exactly its own name."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.chaos.checker import (
    DUPLICATE,
    INCONSISTENT_OFFSETS,
    LOST_WRITE,
    NONMONOTONIC_POLL,
    PHANTOM_WRITE,
    UNSEEN,
    History,
    HistoryLog,
    Op,
    Outcome,
    Poll,
    Record,
    Seek,
    Send,
    check,
    load,
)

# Generating a history takes 10-100 ms of CPU; at load 30 on 2 cores Hypothesis' too_slow health
# check and its 200 ms deadline failed five of these tests: neither says anything about the
# checker, so both are off (as in tests/core_log).
UNHURRIED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
INJECTIONS = settings(UNHURRIED, max_examples=50)  # x9 tests; the clean-history test keeps 100
FULL = "full-reader"  # reads every partition to the end (maybe twice, after a seek back)
PARTIAL = "partial-reader"  # reads a prefix of every partition


def _chunks(draw: st.DrawFn, records: list[Record]) -> list[tuple[Record, ...]]:
    """``records`` split into consecutive polls, some empty."""
    out: list[tuple[Record, ...]] = []
    i = 0
    while i < len(records):
        if draw(st.integers(0, 9)) == 9:
            out.append(())  # a poll that timed out with nothing
        n = draw(st.integers(1, 4))
        out.append(tuple(records[i : i + n]))
        i += n
    return out


def _interleave(draw: st.DrawFn, streams: list[list[Op]]) -> list[Op]:
    """Merge ``streams`` in an arbitrary order that keeps each stream's own order."""
    rng = draw(st.randoms(use_true_random=False))
    pending = [list(reversed(s)) for s in streams if s]
    out: list[Op] = []
    while pending:
        stream = rng.choice(pending)
        out.append(stream.pop())
        if not stream:
            pending.remove(stream)
    return out


@st.composite
def correct_histories(draw: st.DrawFn) -> History:
    partitions = draw(st.integers(1, 3))
    logs: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    next_offset = dict.fromkeys(range(partitions), 0)
    sends: list[Op] = []
    for i in range(draw(st.integers(1, 25))):
        p = draw(st.integers(0, partitions - 1))
        value = f"v{i}"
        outcomes: list[Outcome] = ["ok", "ok", "info", "fail"]
        outcome = "ok" if i == 0 else draw(st.sampled_from(outcomes))
        written = outcome == "ok" or (outcome == "info" and draw(st.booleans()))
        offset = None
        if written:
            next_offset[p] += draw(st.sampled_from([0, 0, 0, 1]))  # a marker took an offset
            offset = next_offset[p]
            next_offset[p] += 1
            logs[p].append((offset, value))
        if outcome == "ok":
            sends.append(Send(f"k{i % 3}", value, p, "ok", offset))
        else:
            sends.append(Send(f"k{i % 3}", value, draw(st.none() | st.just(p)), outcome))

    full: list[Op] = []
    partial: list[Op] = []
    for p, log in logs.items():
        full += [Poll(FULL, p, chunk) for chunk in _chunks(draw, log)]
        seek_back: bool = draw(st.booleans())
        if log and seek_back:  # seek back and read the rest again
            at = draw(st.integers(0, len(log) - 1))
            full.append(Seek(FULL, p, log[at][0]))
            full += [Poll(FULL, p, chunk) for chunk in _chunks(draw, log[at:])]
        start = draw(st.integers(0, len(log)))
        end = draw(st.integers(start, len(log)))
        # Assigned at a committed offset (known to the test or not), then reads a while.
        seek_to: list[int | None] = [None, log[start][0] if start < len(log) else None]
        partial.append(Seek(PARTIAL, p, draw(st.sampled_from(seek_to))))
        partial += [Poll(PARTIAL, p, chunk) for chunk in _chunks(draw, log[start:end])]
    ops = [*sends, *_interleave(draw, [full, partial])]
    return History(tuple(ops), {p: list(log) for p, log in logs.items()}, polls_complete=True)


def _only(anomaly: str, history: History, *also: str) -> None:
    """``history`` shows ``anomaly`` (and the ``also`` ones) and no other."""
    result = check(history)
    for name in (anomaly, *also):
        assert result.counts[name] >= 1, result.render()
    others = {a: n for a, n in result.counts.items() if a not in (anomaly, *also) and n}
    assert not others, result.render()


def _ok_sends(h: History) -> list[Send]:
    return [op for op in h.ops if isinstance(op, Send) and op.outcome == "ok"]


@UNHURRIED
@given(correct_histories())
def test_a_correct_history_checks_clean(history: History) -> None:
    result = check(history)
    assert result.ok, result.render()


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_dropped_acknowledged_record_is_a_lost_write(h: History, data: st.DataObject) -> None:
    victim = data.draw(st.sampled_from(_ok_sends(h)))
    assert victim.partition is not None
    final = dict(h.final)
    final[victim.partition] = [r for r in final[victim.partition] if r[1] != victim.value]
    _only(LOST_WRITE, replace(h, final=final))


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_record_stored_twice_is_a_duplicate(h: History, data: st.DataObject) -> None:
    p = data.draw(st.sampled_from([p for p, log in h.final.items() if log]))
    log = list(h.final[p])
    _, value = data.draw(st.sampled_from(log))
    log.append((log[-1][0] + 1, value))
    _only(DUPLICATE, replace(h, final={**h.final, p: log}))


@INJECTIONS
@given(correct_histories(), st.data())
def test_an_acknowledged_offset_holding_another_value_is_inconsistent(
    h: History, data: st.DataObject
) -> None:
    victim = data.draw(st.sampled_from(_ok_sends(h)))
    assert victim.partition is not None
    others = [o for o, v in h.final[victim.partition] if v != victim.value]
    assume(others)
    lie = replace(victim, offset=data.draw(st.sampled_from(others)))
    ops = tuple(lie if op == victim else op for op in h.ops)
    _only(INCONSISTENT_OFFSETS, replace(h, ops=ops))


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_poll_seeing_another_value_at_an_offset_is_inconsistent(
    h: History, data: st.DataObject
) -> None:
    """A consumer saw a value the final read does not hold there: two values at one offset,
    and what the consumer saw (so it was committed) is gone."""
    p = data.draw(st.sampled_from([p for p, log in h.final.items() if log]))
    offset, _ = data.draw(st.sampled_from(list(h.final[p])))
    intruder = Poll("intruder", p, ((offset, "never-sent"),))
    _only(INCONSISTENT_OFFSETS, replace(h, ops=(*h.ops, intruder)), LOST_WRITE)


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_reordered_poll_is_nonmonotonic(h: History, data: st.DataObject) -> None:
    polls = [op for op in h.ops if isinstance(op, Poll) and len(op.records) >= 2]
    assume(polls)
    victim = data.draw(st.sampled_from(polls))
    i = data.draw(st.integers(0, len(victim.records) - 2))
    recs = list(victim.records)
    recs[i], recs[i + 1] = recs[i + 1], recs[i]
    swapped = replace(victim, records=tuple(recs))
    ops = tuple(swapped if op is victim else op for op in h.ops)
    _only(NONMONOTONIC_POLL, replace(h, ops=ops))


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_poll_repeated_without_a_seek_is_nonmonotonic(h: History, data: st.DataObject) -> None:
    polls = [i for i, op in enumerate(h.ops) if isinstance(op, Poll) and op.records]
    at = data.draw(st.sampled_from(polls))
    ops = list(h.ops)
    ops.insert(at + 1, ops[at])  # the same records again: backwards
    _only(NONMONOTONIC_POLL, replace(h, ops=tuple(ops)))


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_skipped_offset_is_nonmonotonic(h: History, data: st.DataObject) -> None:
    """The full reader misses one record that it reads past; someone else saw it (so it is not
    unseen)."""
    # Records of the full reader with a known position before them (a record read before or
    # a seek to an offset: the first read of a consumer may start anywhere) and a record read
    # after them before any seek.
    candidates: list[tuple[int, int]] = []  # (op index, record index)
    last: dict[int, tuple[int, int] | None] = {}  # the last record, if it had a known position
    anchored: dict[int, bool] = {}
    for i, op in enumerate(h.ops):
        if isinstance(op, Seek) and op.consumer == FULL:
            last[op.partition] = None
            anchored[op.partition] = op.offset is not None
        elif isinstance(op, Poll) and op.consumer == FULL:
            for j in range(len(op.records)):
                prev = last.get(op.partition)
                if prev is not None:
                    candidates.append(prev)
                known = anchored.get(op.partition, False)
                last[op.partition] = (i, j) if known else None
                anchored[op.partition] = True
    assume(candidates)
    i, j = data.draw(st.sampled_from(candidates))
    victim = h.ops[i]
    assert isinstance(victim, Poll)
    dropped = victim.records[j]
    cut = replace(victim, records=victim.records[:j] + victim.records[j + 1 :])
    witness = Poll("witness", victim.partition, (dropped,))
    ops = [cut if k == i else op for k, op in enumerate(h.ops)]
    _only(NONMONOTONIC_POLL, replace(h, ops=(*ops, witness)))


@INJECTIONS
@given(correct_histories(), st.data())
def test_an_acknowledged_record_no_poll_returned_is_unseen(h: History, data: st.DataObject) -> None:
    victim = data.draw(st.sampled_from(_ok_sends(h)))
    assert victim.partition is not None and victim.offset is not None
    p, o = victim.partition, victim.offset

    def truncate(op: Op) -> Op:  # every reader stops before the victim's offset
        if isinstance(op, Poll) and op.partition == p:
            return replace(op, records=tuple(r for r in op.records if r[0] < o))
        return op

    unseen = replace(h, ops=tuple(truncate(op) for op in h.ops))
    _only(UNSEEN, unseen)
    assert check(replace(unseen, polls_complete=False)).ok  # only when polls ran to the end


@INJECTIONS
@given(correct_histories(), st.data())
def test_a_failed_send_that_was_written_is_a_phantom_write(h: History, data: st.DataObject) -> None:
    stored = {v for log in h.final.values() for _, v in log}
    victim = data.draw(st.sampled_from([op for op in h.ops if isinstance(op, Send)]))
    assume(victim.value in stored)
    failed = replace(victim, outcome="fail", offset=None)
    ops = tuple(failed if op == victim else op for op in h.ops)
    _only(PHANTOM_WRITE, replace(h, ops=ops))


def test_a_polled_value_missing_from_the_final_read_is_a_lost_write() -> None:
    """Nobody acknowledged it (the send timed out) but a consumer saw it: it was committed."""
    h = History(
        ops=(Send("k", "a", 0, "info"), Poll("c", 0, ((0, "a"),))),
        final={0: []},
    )
    _only(LOST_WRITE, h)


def test_a_seek_allows_going_back_and_a_rebalance_to_anywhere() -> None:
    final = {0: [(0, "a"), (1, "b"), (2, "c")]}
    sends = tuple(Send("k", v, 0, "ok", o) for o, v in final[0])
    polls: tuple[Op, ...] = (
        Poll("c", 0, ((0, "a"), (1, "b"))),
        Seek("c", 0, 1),
        Poll("c", 0, ((1, "b"), (2, "c"))),
        Seek("c", 0, None),
        Poll("c", 0, ((2, "c"),)),
    )
    assert check(History((*sends, *polls), final, polls_complete=True)).ok
    skip_after_seek = (Seek("c", 0, 0), Poll("c", 0, ((1, "b"),)))
    _only(NONMONOTONIC_POLL, History((*sends, *polls, *skip_after_seek), final))


def test_examples_are_capped_and_rendered() -> None:
    sends = tuple(Send("k", f"v{i}", 0, "ok", i) for i in range(50))
    result = check(History(sends, {0: []}), examples_max=3)
    assert result.counts[LOST_WRITE] == 50
    assert len(result.examples[LOST_WRITE]) == 3
    text = result.render()
    assert "lost-write: 50" in text and "'v0' acknowledged at 0/0" in text
    assert check(History((), {})).render() == "history checked: no anomalies"


# -- recording and the command line --------------------------------------------------------------


@settings(
    UNHURRIED,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(correct_histories())
def test_a_recorded_history_loads_back_the_same(tmp_path: Path, history: History) -> None:
    path = tmp_path / "history.jsonl"
    path.unlink(missing_ok=True)
    with HistoryLog(path) as log:
        for op in history.ops:
            log.record(op)
        for p, recs in history.final.items():
            log.final(p, recs)
        log.polls_complete()
    loaded = load(path)
    assert loaded.ops == history.ops
    assert {p: list(r) for p, r in loaded.final.items()} == history.final
    assert loaded.polls_complete


def _run_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.chaos.checker", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )


@pytest.mark.parametrize(
    ("final", "code", "says"),
    [
        ([(0, "a")], 0, "no anomalies"),
        ([], 1, "lost-write: 1"),
    ],
)
def test_the_command_line_rechecks_a_file(
    tmp_path: Path, final: list[Record], code: int, says: str
) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryLog(path) as log:
        log.record(Send("k", "a", 0, "ok", 0))
        log.final(0, final)
    result = _run_cli(path)
    assert result.returncode == code, result.stderr
    assert says in result.stdout


def test_a_malformed_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type": "send", "key": "k"}\n')
    result = _run_cli(path)
    assert result.returncode == 2
    assert "bad.jsonl:1: malformed history line" in result.stderr
