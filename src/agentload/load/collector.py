"""Python's cyclic garbage collector during a load: what was alive before it is set aside, and passes are rarer.

A client streaming for hundreds of agents allocates containers for every chunk, request and record. Each time the
young generation fills (700 containers by default) the collector runs; every tenth of those passes walks the middle
generation too, and every so often the oldest, which holds everything the process imported and built before the
load — tens of thousands of modules', classes' and functions' objects that no load will ever free. Timed on a
1,000-agent fleet run with the dashboard (``benchmarks/bench_dashboard.py``, which prints the collector's time per
arm): 15 % of the client's CPU went to the collector.

So for the length of a load:

* ``gc.freeze()`` moves what is alive at its start into the permanent generation, which no pass walks;
* the young generation's threshold is raised (to ``YOUNG_THRESHOLD``), so passes come far less often, each over
  more young objects (which a pass has to visit anyway, however often it runs).

The collector stays on: aiohttp and asyncio make reference cycles (an exception, its traceback and their frames)
that only it frees, and a long fleet must not grow without bound. Both settings are put back when the last load
ends: loads nest (a bench level inside a knee search) and overlap (two sessions of a suite), so the first to start
sets them and the last to end restores them. Nothing a load measures depends on this: it changes when memory is
reclaimed, not what is computed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 50_000

_live = 0  # loads running now, in this process
_saved: tuple[int, int, int] | None = None  # the thresholds before the first of them


@contextmanager
def collector_for_load(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Freeze what is alive and raise the young generation's threshold while any load runs."""
    global _live, _saved
    if _live == 0:
        _saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(_saved[0], young), _saved[1], _saved[2])
    _live += 1
    try:
        yield
    finally:
        _live -= 1
        if _live == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            gc.unfreeze()
            _saved = None
