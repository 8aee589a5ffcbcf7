"""Consumer-group offsets inside transactions, the group coordinator's side: a transactional
producer's offsets are written as a transactional batch on the group's ``__consumer_offsets``
partition, stay pending until that producer's COMMIT (applied) or ABORT (dropped) marker there,
and a load (a restart on the same data directory) rebuilds exactly the same state from the log,
also after compaction. Markers are written as the transaction coordinator writes them: with the
producer's epoch + 1 (KIP-890), then reported through ``Coordinator.on_marker``."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.broker import OFFSETS_TOPIC, Broker, BrokerConfig, offsets_partition
from cluster.coordinator import OFFSETS_TOPIC_CONFIGS, CommittedOffset, Coordinator
from core_log.errors import ErrorCode, LogbusError

PARTITIONS = 4
TOPIC = "in"
# "a" and "c" share an offsets partition; "b" has another one.
SAME = ("a", "c")
OTHER = "b"
PID, PID2, PID3 = 1_000, 1_001, 1_002

TP = tuple[str, int]


async def started(data_dir: Path, *, configs: dict[str, Any] | None = None) -> Coordinator:
    broker = Broker(BrokerConfig(data_dir=data_dir))
    await broker.start()
    if configs is not None:
        try:
            broker.topic(OFFSETS_TOPIC)
        except LogbusError:
            await broker.create_topic(OFFSETS_TOPIC, PARTITIONS, 1, configs=configs)
    try:
        broker.topic(TOPIC)
    except LogbusError:
        await broker.create_topic(TOPIC, 3)
    coordinator = Coordinator(broker, offsets_partitions=PARTITIONS)
    await coordinator.start()
    return coordinator


async def stopped(c: Coordinator) -> None:
    await c.close()
    await c.broker.close()


async def restarted(c: Coordinator, data_dir: Path) -> Coordinator:
    await stopped(c)
    return await started(data_dir)


def run(tmp_path: Path, body: Callable[[Path], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body(tmp_path))


def part(group: str) -> int:
    return offsets_partition(group, PARTITIONS)


async def marker(c: Coordinator, group: str, pid: int, epoch: int, commit: bool) -> int:
    """End the producer's transaction on the group's offsets partition as the transaction
    coordinator does (marker epoch = epoch + 1) and report it; returns the new epoch."""
    p = part(group)
    await c.broker.partition(OFFSETS_TOPIC, p).append_marker(
        pid, epoch + 1, commit, 0, durable=True
    )
    c.on_marker(p, pid, commit)
    return epoch + 1


def offsets_of(c: Coordinator, group: str) -> dict[TP, int]:
    return {tp: o.offset for tp, o in c.committed(group).items()}


def pending_of(c: Coordinator, group: str) -> dict[int, dict[TP, int]]:
    return {
        pid: {tp: o.offset for tp, o in offsets.items()}
        for pid, offsets in c.pending_txn_offsets(group).items()
    }


def state(c: Coordinator, groups: tuple[str, ...]) -> dict[str, Any]:
    """Everything a load must rebuild, with commit times and metadata."""
    return {g: (c.committed(g), c.pending_txn_offsets(g)) for g in groups}


def test_commit_marker_makes_pending_offsets_committed(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.commit("a", None, None, {(TOPIC, 0): (3, "plain")})
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, "m"), (TOPIC, 1): (2, "")})
            assert offsets_of(c, "a") == {(TOPIC, 0): 3}  # pending: not visible
            assert pending_of(c, "a") == {PID: {(TOPIC, 0): 7, (TOPIC, 1): 2}}
            # A later write of the same transaction overwrites per partition.
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 1): (4, "")})
            assert pending_of(c, "a") == {PID: {(TOPIC, 0): 7, (TOPIC, 1): 4}}
            event = c.event("a")
            await marker(c, "a", PID, 0, commit=True)
            assert event.is_set()  # waiters of the group woke up
            assert offsets_of(c, "a") == {(TOPIC, 0): 7, (TOPIC, 1): 4}
            assert c.committed("a")[(TOPIC, 0)].metadata == "m"
            assert pending_of(c, "a") == {}
            # The next transaction (at the bumped epoch) works the same way.
            await c.txn_commit_offsets("a", PID, 1, {(TOPIC, 0): (9, "")})
            assert offsets_of(c, "a")[(TOPIC, 0)] == 7
            await marker(c, "a", PID, 1, commit=True)
            assert offsets_of(c, "a")[(TOPIC, 0)] == 9
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_abort_marker_drops_pending_offsets(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.commit("a", None, None, {(TOPIC, 0): (3, "")})
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, ""), (TOPIC, 2): (1, "")})
            await marker(c, "a", PID, 0, commit=False)
            assert offsets_of(c, "a") == {(TOPIC, 0): 3}
            assert pending_of(c, "a") == {}
            # A marker for a producer with nothing pending, or an unloaded partition: nothing.
            c.on_marker(part("a"), 424242, True)
            c.on_marker(part(OTHER), PID, True)
            assert offsets_of(c, "a") == {(TOPIC, 0): 3}
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_a_group_known_only_by_pending_offsets_has_no_committed_offsets(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, "")})
            assert c.committed("a") == {}
            assert "a" not in c.group_ids()
            with pytest.raises(LogbusError) as e:
                c.require_known("a")
            assert e.value.code is ErrorCode.GROUP_ID_NOT_FOUND
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_two_producers_interleaved_on_one_partition(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            g1, g2 = SAME
            assert part(g1) == part(g2)
            await c.txn_commit_offsets(g1, PID, 0, {(TOPIC, 0): (1, "")})
            await c.txn_commit_offsets(g1, PID2, 5, {(TOPIC, 0): (2, "")})
            await c.txn_commit_offsets(g2, PID, 0, {(TOPIC, 1): (3, "")})
            await c.txn_commit_offsets(g2, PID2, 5, {(TOPIC, 1): (4, "")})
            assert pending_of(c, g1) == {PID: {(TOPIC, 0): 1}, PID2: {(TOPIC, 0): 2}}
            await marker(c, g1, PID2, 5, commit=True)  # one marker ends both groups' offsets
            assert offsets_of(c, g1) == {(TOPIC, 0): 2} and offsets_of(c, g2) == {(TOPIC, 1): 4}
            assert pending_of(c, g1) == {PID: {(TOPIC, 0): 1}}
            assert pending_of(c, g2) == {PID: {(TOPIC, 1): 3}}
            await marker(c, g1, PID, 0, commit=False)
            assert offsets_of(c, g1) == {(TOPIC, 0): 2} and offsets_of(c, g2) == {(TOPIC, 1): 4}
            assert pending_of(c, g1) == pending_of(c, g2) == {}
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_a_load_replays_committed_aborted_and_open_transactions(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        g1, g2 = SAME
        try:
            await c.commit(g1, None, None, {(TOPIC, 0): (1, "")})
            await c.txn_commit_offsets(g1, PID, 0, {(TOPIC, 0): (10, "c"), (TOPIC, 1): (11, "")})
            await c.txn_commit_offsets(g2, PID2, 0, {(TOPIC, 0): (20, "a")})
            await c.txn_commit_offsets(g1, PID3, 3, {(TOPIC, 2): (30, "o")})  # stays open
            await marker(c, g1, PID, 0, commit=True)
            await marker(c, g2, PID2, 0, commit=False)
            await c.commit(g2, None, None, {(TOPIC, 2): (5, "")})
            await c.txn_commit_offsets(OTHER, PID, 1, {(TOPIC, 0): (40, "")})  # open elsewhere
            before = state(c, (g1, g2, OTHER))
            assert pending_of(c, g1) == {PID3: {(TOPIC, 2): 30}}
            c = await restarted(c, data)
            assert state(c, (g1, g2, OTHER)) == before
            assert offsets_of(c, g1) == {(TOPIC, 0): 10, (TOPIC, 1): 11}
            assert offsets_of(c, g2) == {(TOPIC, 2): 5}
            # The open transactions end after the load: their markers apply as before.
            await marker(c, g1, PID3, 3, commit=True)
            assert offsets_of(c, g1) == {(TOPIC, 0): 10, (TOPIC, 1): 11, (TOPIC, 2): 30}
            await marker(c, OTHER, PID, 1, commit=False)
            assert c.committed(OTHER) == {} and pending_of(c, OTHER) == {}
            # The sequence of a producer known from the log continues after the restart.
            await c.txn_commit_offsets(g1, PID, 1, {(TOPIC, 0): (12, "")})
            await c.txn_commit_offsets(g1, PID, 1, {(TOPIC, 1): (13, "")})
            await marker(c, g1, PID, 1, commit=True)
            assert offsets_of(c, g1) == {(TOPIC, 0): 12, (TOPIC, 1): 13, (TOPIC, 2): 30}
            after = state(c, (g1, g2, OTHER))
            c = await restarted(c, data)
            assert state(c, (g1, g2, OTHER)) == after
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_unloading_drops_pending_offsets_and_a_reload_restores_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, "")})
            p = part("a")
            epochs: dict[int, int | None] = {}
            monkeypatch.setattr(c.broker, "leader_epoch", lambda t, q: epochs.get(q, 0))
            epochs[p] = None
            c.broker._roles_changed()
            assert p not in c._pending_txn
            with pytest.raises(LogbusError) as e:
                c.pending_txn_offsets("a")
            assert e.value.code is ErrorCode.NOT_COORDINATOR
            epochs[p] = 1
            c.broker._roles_changed()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not c.coordinates("a"):
                assert loop.time() < deadline, "the partition was not loaded again"
                await asyncio.sleep(0.01)
            assert pending_of(c, "a") == {PID: {(TOPIC, 0): 7}}
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_a_fenced_epoch_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.txn_commit_offsets("a", PID, 4, {(TOPIC, 0): (7, "")})
            epoch = await marker(c, "a", PID, 4, commit=True)
            end = c.broker.partition(OFFSETS_TOPIC, part("a")).log_end_offset
            # A zombie of the ended transaction (its old epoch) writes again.
            with pytest.raises(LogbusError) as e:
                await c.txn_commit_offsets("a", PID, epoch - 1, {(TOPIC, 0): (99, "")})
            assert e.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
            assert 400 <= e.value.http_status < 500
            assert offsets_of(c, "a") == {(TOPIC, 0): 7} and pending_of(c, "a") == {}
            assert c.broker.partition(OFFSETS_TOPIC, part("a")).log_end_offset == end
            # A write of a newer epoch while a transaction is open does not slip into it.
            await c.txn_commit_offsets("a", PID, epoch, {(TOPIC, 0): (8, "")})
            with pytest.raises(LogbusError) as e:
                await c.txn_commit_offsets("a", PID, epoch + 1, {(TOPIC, 0): (99, "")})
            assert e.value.code is ErrorCode.INVALID_TXN_STATE
            assert 400 <= e.value.http_status < 500
            assert pending_of(c, "a") == {PID: {(TOPIC, 0): 8}}
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_invalid_calls_change_nothing(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, "")})
            p = c.broker.partition(OFFSETS_TOPIC, part("a"))
            end = p.log_end_offset
            before = state(c, ("a",))
            bad: list[tuple[str, int, int, dict[TP, tuple[int, str]], ErrorCode]] = [
                ("no such group!", PID, 0, {(TOPIC, 0): (1, "")}, ErrorCode.INVALID_GROUP_ID),
                ("a", PID, 0, {(TOPIC, 0): (-1, "")}, ErrorCode.INVALID_REQUEST),
                ("a", PID, 0, {(TOPIC, 9): (1, "")}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                ("a", PID, 0, {("nope", 0): (1, "")}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                ("a", PID, 0, {}, ErrorCode.INVALID_REQUEST),
                ("a", PID, 0, {(TOPIC, 0): (1, "x" * 5000)}, ErrorCode.OFFSET_METADATA_TOO_LARGE),
                ("a", -1, 0, {(TOPIC, 0): (1, "")}, ErrorCode.INVALID_REQUEST),
                ("a", PID, -1, {(TOPIC, 0): (1, "")}, ErrorCode.INVALID_REQUEST),
                ("a", PID, 2**15, {(TOPIC, 0): (1, "")}, ErrorCode.INVALID_REQUEST),
            ]
            for group, pid, epoch, offsets, code in bad:
                with pytest.raises(LogbusError) as e:
                    await c.txn_commit_offsets(group, pid, epoch, offsets)
                assert e.value.code is code, (group, pid, epoch, offsets)
                assert 400 <= e.value.http_status < 500
            assert state(c, ("a",)) == before and p.log_end_offset == end
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_members_of_an_active_group_commit_with_their_generation(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            r = c.join("a", [TOPIC], session_timeout_ms=30_000, rebalance_timeout_ms=30_000)
            member = c.member("a", r.member_id)
            owned = sorted(member.owned)
            assert owned
            with pytest.raises(LogbusError) as e:  # no member id: refused as commit() does
                await c.txn_commit_offsets("a", PID, 0, {owned[0]: (1, "")})
            assert e.value.code is ErrorCode.UNKNOWN_MEMBER_ID
            with pytest.raises(LogbusError) as e:
                await c.txn_commit_offsets(
                    "a", PID, 0, {owned[0]: (1, "")}, member_id=r.member_id, generation=99
                )
            assert e.value.code is ErrorCode.ILLEGAL_GENERATION
            assert pending_of(c, "a") == {}
            await c.txn_commit_offsets(
                "a", PID, 0, {owned[0]: (1, "")}, member_id=r.member_id, generation=member.epoch
            )
            await marker(c, "a", PID, 0, commit=True)
            assert offsets_of(c, "a") == {owned[0]: 1}
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_a_marker_reported_while_the_write_is_in_flight_ends_it(tmp_path: Path) -> None:
    """The transaction ends (a timeout abort, say) while a write of it is being acknowledged:
    the marker after the write decides it, the write does not stay pending."""

    async def body(data: Path) -> None:
        c = await started(data)
        try:
            p = part("a")
            real = c._append

            async def append_then_abort(*args: Any, **kwargs: Any) -> Any:
                result = await real(*args, **kwargs)
                await marker(c, "a", PID, 0, commit=False)
                return result

            c._append = append_then_abort  # type: ignore[method-assign]
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, "")})
            c._append = real  # type: ignore[method-assign]
            assert pending_of(c, "a") == {} and c.committed("a") == {}
            assert p not in c._txn_in_flight
            c = await restarted(c, data)
            assert pending_of(c, "a") == {} and c.committed("a") == {}
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_compaction_keeps_what_transactions_committed(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        configs = {**OFFSETS_TOPIC_CONFIGS, "segment.bytes": 400}  # ~2 batches a segment
        c = await started(data, configs=configs)
        g1, g2 = SAME
        try:
            for i in range(6):  # superseded plain commits: what compaction removes
                await c.commit(g1, None, None, {(TOPIC, 0): (i, ""), (TOPIC, 1): (i, "")})
            await c.txn_commit_offsets(g1, PID, 0, {(TOPIC, 0): (100, "")})
            await c.txn_commit_offsets(g2, PID2, 0, {(TOPIC, 0): (200, "")})
            await marker(c, g1, PID, 0, commit=True)
            await marker(c, g2, PID2, 0, commit=False)
            await c.txn_commit_offsets(g2, PID2, 1, {(TOPIC, 1): (300, "")})  # open
            for i in range(6):  # more plain commits, so the transactions' segments are cleanable
                await c.commit(g2, None, None, {(TOPIC, 2): (i, "")})
            before = state(c, (g1, g2))
            assert offsets_of(c, g1) == {(TOPIC, 0): 100, (TOPIC, 1): 5}
            assert offsets_of(c, g2) == {(TOPIC, 2): 5}
            log_ = c.broker.partition(OFFSETS_TOPIC, part(g1)).log
            result = log_.clean()
            assert result is not None and result.records_removed > 0
            c = await restarted(c, data)
            assert state(c, (g1, g2)) == before
            await marker(c, g2, PID2, 1, commit=True)
            assert offsets_of(c, g2) == {(TOPIC, 1): 300, (TOPIC, 2): 5}
        finally:
            await stopped(c)

    run(tmp_path, body)


# -- random interleavings -------------------------------------------------------------------------

GROUPS = SAME  # both on one offsets partition: their transactions interleave in one log
PRODUCERS = (PID, PID2, PID3)
TPS = [(TOPIC, 0), (TOPIC, 1)]

step = st.one_of(
    st.tuples(
        st.just("txn"),
        st.sampled_from(PRODUCERS),
        st.sampled_from(GROUPS),
        st.sampled_from(TPS),
        st.integers(0, 50),
    ),
    st.tuples(st.just("end"), st.sampled_from(PRODUCERS), st.booleans()),
    st.tuples(st.just("plain"), st.sampled_from(GROUPS), st.sampled_from(TPS), st.integers(0, 50)),
    st.tuples(st.just("zombie"), st.sampled_from(PRODUCERS)),
    st.tuples(st.just("restart")),
)


class Model:
    """What the coordinator must show: committed and pending offsets, by the spec."""

    def __init__(self) -> None:
        self.committed: dict[str, dict[TP, int]] = {g: {} for g in GROUPS}
        self.pending: dict[int, dict[str, dict[TP, int]]] = {}
        self.epochs = dict.fromkeys(PRODUCERS, 0)

    def view(self, group: str) -> tuple[dict[TP, int], dict[int, dict[TP, int]]]:
        pending = {pid: gs[group] for pid, gs in self.pending.items() if gs.get(group)}
        return self.committed[group], pending


def live_view(c: Coordinator, group: str) -> tuple[dict[TP, int], dict[int, dict[TP, int]]]:
    return offsets_of(c, group), pending_of(c, group)


async def play(data: Path, steps: list[tuple[Any, ...]]) -> None:
    c = await started(data)
    model = Model()
    restarts = 0
    try:
        for s in steps:
            kind = s[0]
            if kind == "txn":
                _, pid, group, tp, offset = s
                await c.txn_commit_offsets(group, pid, model.epochs[pid], {tp: (offset, "")})
                model.pending.setdefault(pid, {}).setdefault(group, {})[tp] = offset
            elif kind == "end":
                _, pid, commit = s
                model.epochs[pid] = await marker(c, GROUPS[0], pid, model.epochs[pid], commit)
                for group, offsets in model.pending.pop(pid, {}).items():
                    if commit:
                        model.committed[group].update(offsets)
            elif kind == "plain":
                _, group, tp, offset = s
                await c.commit(group, None, None, {tp: (offset, "")})
                model.committed[group][tp] = offset
            elif kind == "zombie":
                _, pid = s
                if model.epochs[pid] == 0:
                    continue
                with pytest.raises(LogbusError) as e:
                    await c.txn_commit_offsets(
                        GROUPS[0], pid, model.epochs[pid] - 1, {TPS[0]: (1, "")}
                    )
                assert e.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
            elif restarts < 2:
                restarts += 1
                before = state(c, GROUPS)
                c = await restarted(c, data)
                assert state(c, GROUPS) == before
            for group in GROUPS:
                assert live_view(c, group) == model.view(group), s
        before = state(c, GROUPS)
        c = await restarted(c, data)
        assert state(c, GROUPS) == before
        for group in GROUPS:
            assert live_view(c, group) == model.view(group)
    finally:
        await stopped(c)


def interleavings(max_examples: int) -> Callable[[], None]:
    @settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(steps=st.lists(step, min_size=1, max_size=25))
    def check(steps: list[tuple[Any, ...]]) -> None:
        with tempfile.TemporaryDirectory() as data:
            asyncio.run(play(Path(data), steps))

    return check


def test_random_interleavings_load_to_the_live_state() -> None:
    interleavings(40)()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_random_interleavings_load_to_the_live_state_long() -> None:
    interleavings(300)()


def test_committed_offset_type_is_the_one_committed_returns(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        c = await started(data)
        try:
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (7, "meta")})
            (offset,) = c.pending_txn_offsets("a")[PID].values()
            assert isinstance(offset, CommittedOffset) and offset.metadata == "meta"
        finally:
            await stopped(c)

    run(tmp_path, body)


def test_a_deleted_transactional_offset_stays_deleted_after_compaction(tmp_path: Path) -> None:
    async def body(data: Path) -> None:
        configs = {**OFFSETS_TOPIC_CONFIGS, "segment.bytes": 400, "delete.retention.ms": 0}
        c = await started(data, configs=configs)
        try:
            await c.txn_commit_offsets("a", PID, 0, {(TOPIC, 0): (100, "")})
            await marker(c, "a", PID, 0, commit=True)
            await c.delete("a")  # tombstones for its offsets
            for i in range(6):  # the tombstones' segment becomes cleanable
                await c.commit("c", None, None, {(TOPIC, 2): (i, "")})
            assert c.committed("a") == {}
            log_ = c.broker.partition(OFFSETS_TOPIC, part("a")).log
            log_.clean()  # stamps the delete horizon
            log_.clean(c.clock.now_ms() + 1)  # past it: the tombstones go
            c = await restarted(c, data)
            assert c.committed("a") == {}
        finally:
            await stopped(c)

    run(tmp_path, body)
