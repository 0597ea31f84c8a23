"""The fault matrix of tests/test_fault_matrix.py at more agents, as a table.

Each cell runs one command (a bench level, the suite, a fleet run) through the function its CLI calls, against the
simulator in process on virtual time with one injected fault kind (or a cold start, or a restart), and counts:
requests sent, failed attempts by kind, records lost, turns repeated, requests without a fault killed by a
deadline, how far past its deadline (+ 5 s) the worst hostile stream ended, turns that never succeeded, and whether
the command stopped with the server lost. See the test module's docstring for what each column means.

    .venv/bin/python benchmarks/fault_matrix.py [--agents 1,32,256] [--kinds reset,comments,...]
        [--commands bench,suite,run]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's tests package

from tests.test_fault_matrix import COMMANDS, KIND, KINDS, run_cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="1,32,256")
    ap.add_argument("--kinds", default=",".join(k.name for k in KINDS))
    ap.add_argument("--commands", default=",".join(COMMANDS))
    args = ap.parse_args()
    counts = [int(a) for a in args.agents.split(",")]
    head = f"{'kind':<13} {'agents':>6} {'command':<7} {'requests':>8} {'lost':>5} {'repeated':>8} {'killed':>6} " \
           f"{'over_s':>7} {'unfin':>5} {'stop':>4} {'wall_s':>6}  failed by kind"  # fmt: skip
    print(head)
    print("-" * len(head))
    started = time.perf_counter()
    for name in args.kinds.split(","):
        for agents in counts:
            for command in args.commands.split(","):
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory() as tmp:
                    cell = run_cell(KIND[name], agents, command, Path(tmp))
                wall = time.perf_counter() - t0
                failed = ", ".join(f"{k} {n}" for k, n in sorted(cell.failed.items())) or "-"
                stop = "yes" if cell.stopped is not None else "-"
                print(f"{name:<13} {agents:>6} {command:<7} {len(cell.sent):>8} {cell.lost:>5} {cell.repeated:>8} "
                      f"{cell.wrongly_killed:>6} {max(0.0, cell.over_deadline()):>7.1f} {cell.unfinished:>5} "
                      f"{stop:>4} {wall:>6.1f}  {failed}", flush=True)  # fmt: skip
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
