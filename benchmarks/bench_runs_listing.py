"""How long ``agentload runs`` takes to list a root of many runs of every kind (the listing scans the directories
the history does not index, so its cost grows with the unfinished runs).

Builds N run directories under a temporary root through the store — a third finished fleet runs, a third
interrupted fleet runs, a third suite runs with a manifest still ``running`` (incomplete) — and times
``RunStore.listing`` (best of 5; the first call also warms the page cache). Prints one line per N.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from agentload.store import RunInfo, RunStore


def build(root: Path, n: int) -> RunStore:
    store = RunStore(root)
    for i in range(n):
        kind = "suite" if i % 3 == 2 else "fleet"
        info = RunInfo(kind=kind, run_id="", created=f"2026-12-01T12:{i // 60 % 60:02d}:{i % 60:02d}+00:00")
        path, info = store.new_dir(info, prefix=f"{kind}{i}-")
        if i % 3 == 0:
            store.finish(path, info.model_copy(update={"status": "finished", "outcome": "10/10 done"}))
        elif i % 3 == 1:
            store.finish(path, info.model_copy(update={"status": "interrupted", "detail": "stopped early"}))
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="30,300,3000", help="comma-separated run counts")
    args = parser.parse_args()
    for n in (int(x) for x in args.runs.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            store = build(Path(tmp), n)
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                entries, damaged = store.listing()
                best = min(best, time.perf_counter() - started)
            assert len(entries) == n
            assert not damaged
            scanned = sum(e.status != "finished" for e in entries)
            print(f"{n:>5} runs ({scanned} scanned outside the history): listing {best * 1e3:8.1f} ms, "
                  f"{best / n * 1e6:6.0f} µs per run")  # fmt: skip


if __name__ == "__main__":
    main()
