"""The cyclic collector during a load (``load.collector``): frozen and rarer while any load runs, put back after.

Loads nest and overlap (a suite runs its sessions side by side, a bench level sits inside a knee search): the first
to start sets the collector, the last to end restores it, whatever order they end in. Cycles made during a load are
still freed by it: the collector is made rarer, not turned off.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass, field

from agentload.clock import run_virtual
from agentload.load.collector import YOUNG_THRESHOLD, collector_for_load
from agentload.load.runner import run_load
from tests.test_load_runner import CLOCK, Ctx


@dataclass
class Sees:
    """Sleeps ``for_s`` and notes the collector's settings at its start and its end."""

    agent_id: str
    for_s: float
    seen: list[tuple[int, int]] = field(default_factory=list)  # (young threshold, frozen objects)

    async def run(self, ctx: Ctx) -> None:
        self.seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        await CLOCK.sleep(self.for_s)
        self.seen.append((gc.get_threshold()[0], gc.get_freeze_count()))


def test_overlapping_loads_keep_the_collector_set_until_the_last_one_ends() -> None:
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    short, long = Sees("short", 1.0), Sees("long", 5.0)

    async def main() -> None:
        # The short load starts first and ends first: the long one must still run with the load's settings.
        await asyncio.gather(run_load([short], Ctx()), run_load([long], Ctx()))

    run_virtual(main())
    for young, frozen in (*short.seen, *long.seen):
        assert young == max(before[0], YOUNG_THRESHOLD)
        assert frozen > frozen_before  # what was alive at the start is out of the collector's walks
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen_before


def test_a_load_that_raises_still_puts_the_collector_back() -> None:
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()

    class Boom:
        agent_id = "boom"

        async def run(self, ctx: Ctx) -> None:
            raise RuntimeError("a driver bug")

    async def main() -> None:
        await run_load([Boom()], Ctx())

    try:
        run_virtual(main())
    except RuntimeError:
        pass
    else:  # pragma: no cover - the runner raises a driver's bug
        raise AssertionError("the driver's bug was not raised")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen_before


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_cycles_made_during_a_load_are_still_collected() -> None:
    with collector_for_load():
        gc.collect()  # start from an empty young generation
        cycle = Node()
        dead = weakref.ref(cycle)
        del cycle
        assert dead() is not None  # reference counting alone cannot free it
        # More new containers than the raised threshold: a young pass must come, and free the cycle.
        keep: list[list[int]] = [[] for _ in range(YOUNG_THRESHOLD + 1_000)]
        assert dead() is None
        del keep
