"""The oracle of tests/tests/it/oracle.rs: Python's `limits` (the PyPI package) deciding the
same calls as the Rust test's memory store.

Reads one trace per line on stdin, as JSON:

    {"algo": "fixed" | "sliding", "num": N, "period_s": P, "calls": [[at_ms, cost], ...]}

and writes, per trace, one line: a JSON list of 0/1, whether `limits` admitted each call
(`FixedWindowRateLimiter` or `MovingWindowRateLimiter` on a fresh `MemoryStorage`). The
storage's clock is the trace's: `time.time()` of `limits.storage.memory` reads `at_ms / 1000`,
and its background expiry timer is stopped (it only deletes what has expired, which the calls
themselves check).
"""

import json
import sys
import types

import limits
from limits.storage import memory as memory_module
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter


class Clock:
    now = 0.0


memory_module.time = types.SimpleNamespace(time=lambda: Clock.now)

STRATEGIES = {"fixed": FixedWindowRateLimiter, "sliding": MovingWindowRateLimiter}


def storage() -> memory_module.MemoryStorage:
    s = memory_module.MemoryStorage()
    s.timer.cancel()
    s._MemoryStorage__schedule_expiry = lambda: None
    return s


def main() -> None:
    for line in sys.stdin:
        trace = json.loads(line)
        strategy = STRATEGIES[trace["algo"]](storage())
        item = limits.RateLimitItemPerSecond(trace["num"], trace["period_s"])
        admitted = []
        for at_ms, cost in trace["calls"]:
            Clock.now = at_ms / 1000.0
            admitted.append(1 if strategy.hit(item, "caller", cost=cost) else 0)
        print(json.dumps(admitted), flush=True)


if __name__ == "__main__":
    main()
