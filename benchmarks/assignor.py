"""The group assignor at growing sizes, up to the documented limits.

    python -m benchmarks.assignor [--sizes 100x1000,200x2000,1000x10000]

Each size is members x partitions (identical subscriptions to two topics sharing the
partitions, plus a mixed group where half the members subscribe to one topic only). For each,
the wall time of one :func:`cluster.assignor.assign` call, best of 3, for: a fresh group (no
current assignment), one member leaving, one member joining, the mixed group, and the worst
sticky case: every partition held by one member when all others join at once. The limits are
1,000 members a group (:data:`cluster.group.MAX_MEMBERS`) and 10,000 partitions a topic; the
assignor runs on the broker's event loop, so its time at the limits is a stall of every client.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from cluster.assignor import Assignment, assign

REPEATS = 3


def best_of(run: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def scenarios(members: int, partitions: int) -> dict[str, Callable[[], Assignment]]:
    ids = [f"member-{i:04}" for i in range(members)]
    counts = {"a": partitions // 2, "b": partitions - partitions // 2}
    subs = dict.fromkeys(ids, frozenset(counts))
    fresh = assign(subs, counts, {})
    rest = {m: t for m, t in subs.items() if m != ids[members // 2]}
    joined = {**subs, "member-new": frozenset(counts)}
    mixed = {m: frozenset({"a"}) if i % 2 else frozenset(counts) for i, m in enumerate(ids)}
    one_holds_all = {ids[0]: {(t, p) for t, n in counts.items() for p in range(n)}}
    return {
        "fresh": lambda: assign(subs, counts, {}),
        "leave": lambda: assign(rest, counts, fresh),
        "join": lambda: assign(joined, counts, fresh),
        "mixed": lambda: assign(mixed, counts, {}),
        "all join": lambda: assign(subs, counts, one_holds_all),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100x1000,200x2000,1000x10000")
    args = parser.parse_args()
    print(f"{'members x partitions':>22}  " + "  ".join(f"{n:>9}" for n in scenarios(1, 1)))
    for size in args.sizes.split(","):
        members, partitions = (int(x) for x in size.split("x"))
        row = [best_of(run) for run in scenarios(members, partitions).values()]
        label = f"{members:,} x {partitions:,}"
        print(f"{label:>22}  " + "  ".join(f"{t * 1000:7.1f}ms" for t in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
