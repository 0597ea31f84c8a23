"""The one runner's own cost as a load grows: CPU seconds to run N drivers that each end at a moment of their own.

Each driver only sleeps (``--spread`` s spread evenly over the N drivers), so what is measured is the runner: its
tasks, its strategy and its wait for the next driver to end, which wakes once per driver here (the worst case: a
real load's drivers often end together, one wake for several). Before 4 December 2026 that wait was
``asyncio.wait`` over every driver still running, a callback put on each and taken off again at every wake, so a
load cost O(N²): the figures below are CPU seconds a run, best of ``--repeat``.

    .venv/bin/python benchmarks/bench_runner.py [--agents 1000,4000,16000] [--spread 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from agentload.load.runner import run_load


@dataclass
class _Sleeper:
    agent_id: str
    delay: float

    async def run(self, ctx: None) -> None:
        await asyncio.sleep(self.delay)


async def _one(n: int, spread: float) -> float:
    drivers = [_Sleeper(f"agent-{i}", spread * (i + 1) / n) for i in range(n)]
    t0 = time.process_time()
    outcome = await run_load(drivers, None)
    used = time.process_time() - t0
    assert outcome.ended == "done", outcome
    return used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="1000,4000,16000", help="comma-separated driver counts")
    ap.add_argument("--spread", type=float, default=1.0, help="the drivers end evenly over this many seconds")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.agents.split(",")]
    except ValueError:
        ap.error(f"--agents takes comma-separated integers, got {args.agents!r}")
    if any(n < 1 for n in counts) or args.repeat < 1 or args.spread <= 0:
        ap.error("--agents, --repeat and --spread must be positive")
    print(f"{'agents':>8} {'CPU s a run':>12} {'µs a driver':>12}")
    for n in counts:
        best = min(asyncio.run(_one(n, args.spread)) for _ in range(args.repeat))
        print(f"{n:>8,} {best:>12.3f} {1e6 * best / n:>12.1f}")


if __name__ == "__main__":
    main()
