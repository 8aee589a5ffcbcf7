"""Ratios measured side by side: the shape every issue-14 figure takes.

A shared 2-core VM moves absolute figures by ±20 % between runs, so the per-request targets are
ratios of two things measured in the same run — Logbus against a bare ASGI app, against itself
with another setting, against Redis. Each ratio is measured in alternating rounds (A, B, B, A,
…) so drift in the machine's load hits both sides alike, and the figure is the median of the
rounds' ratios. :func:`print_table` prints every ratio with its target and met/missed;
:func:`plot` draws them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Ratio:
    """``numerator / denominator``, per round, and the median of the rounds against a target.

    ``lower_is_better`` is for latencies given as a value against a ceiling (``ratio`` is then
    the measured value itself, in ``unit``). ``target`` None: a figure shown beside the
    others for what it tells, with no target of its own (neither met nor missed)."""

    name: str
    target: float | None
    rounds: list[float] = field(default_factory=list)
    numerator: str = ""
    denominator: str = ""
    unit: str = "x"
    lower_is_better: bool = False
    note: str = ""
    # The raw measurements behind the rounds (e.g. requests/s of each side), for the JSON file.
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return statistics.median(self.rounds) if self.rounds else float("nan")

    @property
    def met(self) -> bool | None:
        if not self.rounds or self.target is None:
            return None
        return self.value <= self.target if self.lower_is_better else self.value >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "target": self.target,
            "met": self.met,
            "rounds": self.rounds,
            "numerator": self.numerator,
            "denominator": self.denominator,
            "unit": self.unit,
            "lower_is_better": self.lower_is_better,
            "note": self.note,
            "detail": self.detail,
        }


def alternate(rounds: int) -> list[tuple[int, bool]]:
    """(round, a_first) in ABBA order: round 0 runs A then B, round 1 B then A, …"""
    return [(k, k % 2 == 0) for k in range(rounds)]


def print_table(ratios: Sequence[Ratio]) -> None:
    width = max([64, *(len(r.name) for r in ratios)])
    print(f"\n{'ratio':<{width}} {'median':>8} {'target':>8} {'met':>6}  rounds / note")
    for r in ratios:
        met = {True: "met", False: "MISSED", None: "-"}[r.met]
        sign = "≤" if r.lower_is_better else "≥"
        unit = "" if r.unit == "x" else f" {r.unit}"
        target = f"{'none':>7}" if r.target is None else f"{sign}{r.target:>6g}"
        rounds = ", ".join(f"{x:.3g}" for x in r.rounds)
        print(
            f"{r.name:<{width}} {r.value:>8.3f} {target}{unit} {met:>6}  [{rounds}] {r.note}",
            flush=True,
        )


def plotted(ratios: Sequence[Ratio]) -> list[Ratio]:
    """What :func:`plot` draws: measured figures with a target (one without has no achieved ÷
    target to draw)."""
    return [r for r in ratios if r.rounds and r.target is not None]


def plot(ratios: Sequence[Ratio], path: Path, title: str) -> None:
    """Each ratio as achieved / target (target / achieved where lower is better); green
    meets the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = plotted(ratios)
    scores = [r.target / r.value if r.lower_is_better else r.value / r.target for r in shown]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(shown) + 1.5))
    ax.barh(
        [r.name for r in shown],
        scores,
        color=["tab:green" if s >= 1 else "tab:red" for s in scores],
    )
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("achieved / target (≥ 1 meets it; for latencies: target / achieved)")
    for i, r in enumerate(shown):
        sign = "≤" if r.lower_is_better else "≥"
        unit = "" if r.unit == "x" else f" {r.unit}"
        ax.text(
            scores[i],
            i,
            f"  {r.value:.3g}{unit} (target {sign} {r.target:g})",
            va="center",
            fontsize=8,
        )
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
