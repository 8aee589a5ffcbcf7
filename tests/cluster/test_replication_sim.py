"""The replication state machine under a seeded, deterministic multi-broker simulation.

Every seed builds a cluster (3 or 5 brokers, min ISR, unclean election, ``durability=fsync``,
retention, rebalance and message loss drawn from the seed) and runs it through crashes, power
loss, pauses and cut links, checking the invariants of :mod:`tests.cluster.sim` after every
step; a failure names its seed and the last events. Replay one seed with
``LOGBUS_SIM_SEED=1234 pytest tests/cluster/test_replication_sim.py``.

The negative controls break one rule at a time (HW = the leader's log end, the pre-KIP-101
truncation to the HW, an election outside the ISR, a leader change without a new epoch, the HW
ignoring an ISR expansion in flight) and require the simulation to report a violation within a
few hundred seeds: the checks can fail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from cluster.controller import decide
from cluster.metadata import PartitionMeta
from cluster.replication import LeaderReplica
from tests.cluster.sim import SimConfig, Simulation, SimulationViolation, seeds

DEFAULT_SEEDS = range(200)  # ~300 fault steps each: ~8 s on the reference machine
SLOW_SEEDS = range(200, 2200)  # 1,000 fault steps each: ~5 min
REPLAYING = len(seeds(DEFAULT_SEEDS)) == 1  # LOGBUS_SIM_SEED names one seed


def _run_all(sim_class: type[Simulation], default: range, **overrides: Any) -> Counter[str]:
    """Run every seed (or only LOGBUS_SIM_SEED's, with the same overrides); sum the stats."""
    totals: Counter[str] = Counter()
    for seed in seeds(default):
        sim = sim_class(SimConfig.from_seed(seed, **overrides)).run()  # raises with its seed
        totals.update(sim.stats)
        totals["unclean_runs"] += bool(sim.store.row.unclean_elections)
        totals["reported_losses"] += len(sim.acked_lost)
    return totals


def _first_violation(sim_class: type[Simulation], budget: int, **overrides: Any) -> str:
    for seed in range(budget):
        try:
            sim_class(SimConfig.from_seed(seed, **overrides)).run()
        except SimulationViolation as e:
            return str(e)
    raise AssertionError(f"no violation in {budget} seeds: the invariant checks are blind")


def test_invariants_hold_over_seeds() -> None:
    totals = _run_all(Simulation, DEFAULT_SEEDS)
    if not REPLAYING:
        # The runs did what they are for: writes acknowledged, leaders killed and elected, the
        # ISR moving, followers truncating and restarting their logs.
        for what in ("acked", "crashes", "elections", "isr_changes", "truncations"):
            assert totals[what] > 10, (what, totals)
        assert totals["restarts_at"] > 0, totals
        assert totals["unclean_runs"] > 0, totals


def test_unclean_elections_are_counted_and_logs_still_converge() -> None:
    totals = _run_all(Simulation, range(60), unclean=True, min_insync_replicas=1)
    if not REPLAYING:
        assert totals["unclean_runs"] > 0
        assert totals["reported_losses"] > 0  # the loss happens, and only with the count set


def test_fsync_durability_survives_power_loss_of_every_broker() -> None:
    totals = _run_all(Simulation, range(60), fsync=True, power_loss=True, unclean=False)
    assert totals["acked"] > 0 or REPLAYING


def test_a_seed_replays_exactly() -> None:
    a = Simulation(SimConfig.from_seed(7)).run()
    b = Simulation(SimConfig.from_seed(7)).run()
    assert (a.step_no, a.stats, a.acked, list(a.trace)) == (
        b.step_no,
        b.stats,
        b.acked,
        list(b.trace),
    )


def test_a_violation_names_its_seed_and_the_last_events() -> None:
    class LeoIsHw(Simulation):
        pass

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LeaderReplica, "high_watermark_target", lambda self, end, _d: end)
        message = _first_violation(LeoIsHw, 50)
    assert "seed=" in message and "LOGBUS_SIM_SEED=" in message and "last events:" in message


@pytest.mark.slow
def test_invariants_hold_over_many_seeds() -> None:
    _run_all(Simulation, SLOW_SEEDS, steps=1000)


# -- negative controls ----------------------------------------------------------------------------


def test_control_high_watermark_at_the_leader_log_end_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        LeaderReplica, "high_watermark_target", lambda self, end, _d: max(self.high_watermark, end)
    )
    assert "lost acknowledged" in _first_violation(Simulation, 50)


def test_control_truncating_to_the_high_watermark_is_caught() -> None:
    class TruncateToHw(Simulation):
        truncate_to_hw_on_follow = True  # what followers did before KIP-101

    assert "lost acknowledged" in _first_violation(TruncateToHw, 50)


def test_control_election_outside_the_isr_is_caught() -> None:
    def outside(
        row: PartitionMeta, live: set[int], unclean: bool, rb: bool
    ) -> PartitionMeta | None:
        new = decide(row, live, unclean, rb)
        if new is None or new.leader_epoch == row.leader_epoch or new.leader == -1:
            return new
        last_live = [b for b in row.replicas if b in live][-1]
        return replace(new, leader=last_live, isr=sorted({*new.isr, last_live}))

    class ElectOutside(Simulation):
        elect = staticmethod(outside)

    assert "lost acknowledged" in _first_violation(ElectOutside, 100)


def test_control_leader_change_without_a_new_epoch_is_caught() -> None:
    def same_epoch(
        row: PartitionMeta, live: set[int], unclean: bool, rb: bool
    ) -> PartitionMeta | None:
        new = decide(row, live, unclean, rb)
        return None if new is None else replace(new, leader_epoch=row.leader_epoch)

    class NoEpochBump(Simulation):
        elect = staticmethod(same_epoch)

    assert "epoch" in _first_violation(NoEpochBump, 50)


def test_control_high_watermark_ignoring_a_pending_isr_expansion_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bug the simulation found first (seed 43): the store accepted an ISR expansion, the
    # leader had not heard back and moved the HW past the new member's log end.
    monkeypatch.setattr(LeaderReplica, "maximal_isr", property(lambda self: self.state.isr))
    assert "lost acknowledged" in _first_violation(Simulation, 200)


@pytest.mark.xfail(
    strict=True,
    reason="known gap (20 of seeds 0-199 fail): a broker that loses its page cache (power loss "
    "without durability=fsync) and registers again before the controller saw its lease expire "
    "stays in the ISR with a shorter log, and may lead. Fencing a new incarnation out of the "
    "ISR at registration, as KRaft does, leaves 5 of 200: the last ISR member losing its cache "
    "(Kafka's KIP-966 case); durability=fsync closes both.",
)
def test_power_loss_of_one_broker_without_fsync_keeps_acknowledged_records() -> None:
    for seed in range(60):  # not LOGBUS_SIM_SEED: this one is expected to fail
        config = SimConfig.from_seed(
            seed, fsync=False, power_loss=True, unclean=False, min_insync_replicas=2
        )
        Simulation(config).run()
