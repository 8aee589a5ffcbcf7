"""``ReplicaManager._wait_all_committed`` (a forwarded group's appends waiting for the ISR
together) answers each append as its own ``_wait_committed`` would under the same changes:
committed when the high watermark passes it, else the error that ended the wait.

Deterministic: the leader's state is a plain object the test changes between turns of the
loop; no clock moves, so no wait times out. Hypothesis draws the appends' offsets and the
changes (high watermark raised, ISR shrunk below min.insync.replicas, leadership lost)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.metadata import MetadataStore
from cluster.replica_manager import Leading, ReplicaManager, ReplicationConfig
from core_log.clock import ManualClock
from core_log.config import LogConfig
from core_log.log import AppendResult
from core_log.manager import LogManager

# A change to the leader's state: ("hw", new high watermark), ("isr", 0) or ("lost", 0).
changes = st.lists(
    st.one_of(
        st.tuples(st.just("hw"), st.integers(min_value=0, max_value=40)),
        st.tuples(st.sampled_from(["isr", "lost"]), st.just(0)),
    ),
    max_size=6,
)
ends_st = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8)


def _leading() -> Any:
    state = SimpleNamespace(
        partition=SimpleNamespace(high_watermark=0),
        replica=SimpleNamespace(enough_replicas=True, isr=[1, 2]),
        changed=asyncio.Event(),
        active=True,
    )
    state.notify = lambda: (state.changed.set(), setattr(state, "changed", asyncio.Event()))
    return state


def _apply(leading: Any, change: tuple[str, int]) -> None:
    kind, value = change
    if kind == "hw":
        leading.partition.high_watermark = max(leading.partition.high_watermark, value)
    elif kind == "isr":
        leading.replica.enough_replicas = False
    else:
        leading.active = False
    leading.notify()


async def _turns(n: int = 10) -> None:
    for _ in range(n):  # each waiter wakes, checks and settles within a few turns
        await asyncio.sleep(0)


def _outcome(task: asyncio.Task[Any]) -> str:
    if not task.done():
        return "waiting"
    error = task.exception()
    return "ok" if error is None else cast(Any, error).code.name


@settings(max_examples=60, deadline=None)
@given(ends=ends_st, steps=changes)
def test_waiting_together_answers_each_as_waiting_alone(
    tmp_path_factory: Any, ends: list[int], steps: list[tuple[str, int]]
) -> None:
    tmp_path: Path = tmp_path_factory.mktemp("wait")

    async def main() -> None:
        logs = LogManager(tmp_path / "data", clock=ManualClock(0), auto_high_watermark=False)
        await logs.start(background=False)
        store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
        rm = ReplicaManager(
            ReplicationConfig(broker_id=1), logs, store, ManualClock(0), lambda _t: LogConfig()
        )
        rm._lease_lapsed = lambda: False  # type: ignore[method-assign]
        try:
            alone, together = _leading(), _leading()
            waits = [
                asyncio.ensure_future(rm._wait_committed(cast(Leading, alone), end)) for end in ends
            ]
            outcomes: list[AppendResult | BaseException] = [
                AppendResult(0, end - 1, 1, 1, 1, -1) for end in ends
            ]
            joint = asyncio.ensure_future(
                rm._wait_all_committed(cast(Leading, together), dict(enumerate(ends)), outcomes)
            )
            await _turns()
            for step in steps:
                _apply(alone, step)
                _apply(together, step)
                await _turns()
            expected = [_outcome(w) for w in waits]
            if joint.done():
                got = [
                    o.code.name if isinstance(o, BaseException) else "ok"  # type: ignore[attr-defined]
                    for o in outcomes
                ]
            else:  # still waiting: those committed are kept, the rest wait
                hw = together.partition.high_watermark
                got = ["ok" if end <= hw else "waiting" for end in ends]
            assert got == expected
            assert joint.done() == all(e != "waiting" for e in expected)
            for w in (*waits, joint):
                w.cancel()
            await asyncio.gather(*waits, joint, return_exceptions=True)
        finally:
            await rm.close()
            await logs.close()
            store.close()

    asyncio.run(main())
