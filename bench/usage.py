"""Usage counters: ``python -m bench.usage``, on one embedded server.

Rows: an append with usage at lineage depth 1 and at depth 1,000 (medians of 2,000 appends each,
alternating, and their ratio: an append adds to its own record and its root's, whatever the depth);
``Registry.usage`` of a root with 20,000 descendants (one read of its tree totals) against a bare
round trip (a ``ZRANGE``) in the same run; and the walk a branch's total is (a non-root with 10,000 children,
and the root of a 1,000-deep chain's first child: one round trip per level).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from redis import Redis

from sessionfork.core import forks
from sessionfork.core.packer import CommandPacker
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent, Usage
from sessionfork.embedded import EmbeddedServer

TURN = [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})]
SPENT = Usage(input_tokens=10, output_tokens=5, cost_micros=7)


def median_ms(fn: Callable[[], object], times: int) -> float:
    took = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1e3


def chain(registry: Registry, prefix: str, depth: int) -> None:
    registry.append(registry.create(f"{prefix}0"), TURN, usage=SPENT)
    for i in range(1, depth + 1):
        forks.fork(registry, f"{prefix}{i - 1}", f"{prefix}{i}")


def fan(registry: Registry, parent: str, prefix: str, count: int) -> None:
    for k in range(0, count, 500):
        forks.fork_many(registry, parent, [f"{prefix}{j}" for j in range(k, min(k + 500, count))])
    for j in range(0, count, 7):
        registry.append(f"{prefix}{j}", TURN, usage=SPENT)


def main() -> None:
    from redis import ConnectionPool

    with EmbeddedServer() as server:
        redis = Redis.from_pool(ConnectionPool(host="127.0.0.1", port=server.port, command_packer=CommandPacker()))
        registry = Registry(redis)
        chain(registry, "d", 1000)
        shallow: list[float] = []
        deep: list[float] = []
        for _ in range(20):  # alternating chunks of 100
            shallow.append(median_ms(lambda: registry.append("d1", TURN, usage=SPENT), 100))
            deep.append(median_ms(lambda: registry.append("d1000", TURN, usage=SPENT), 100))
        a1, a1000 = statistics.median(shallow), statistics.median(deep)
        registry.append(registry.create("fan"), TURN, usage=SPENT)
        fan(registry, "fan", "fan-", 10_000)
        forks.fork(registry, "fan", "mid")
        fan(registry, "mid", "mid-", 10_000)
        bare = median_ms(lambda: redis.zrange("sf:disposed", 0, 99), 500)
        root = median_ms(lambda: registry.usage("fan"), 200)
        print(f"append with usage, depth 1          {a1 * 1e3:8.1f} us")
        print(f"append with usage, depth 1000       {a1000 * 1e3:8.1f} us   ratio {a1000 / a1:.2f}")
        print(f"usage of a root, 20,001 in its tree {root:8.3f} ms   a bare round trip (ZRANGE) {bare:.3f} ms "
              f"(ratio {root / bare:.2f})")
        print(f"usage of a branch, 10,000 children  {median_ms(lambda: registry.usage('mid'), 10):8.1f} ms   (walk)")
        print(f"usage of d1, a 999-deep chain       {median_ms(lambda: registry.usage('d1'), 5):8.1f} ms   (walk)")


if __name__ == "__main__":
    main()
