"""How much of the machine other processes took while a tier step ran (Linux /proc; None elsewhere).

A calibrated simulator is fitted to step times measured at one moment and compared with a knee search run at
another. When a process outside the test (another job on a shared CI machine, a spinning loop) takes a core
during either, the real server runs slower than the fit by as much as that process took, so the comparison then
measures the machine's neighbours rather than the simulator. The tier gates the ±15 % goal only where the steps
ran with the machine to themselves, and says how busy it was otherwise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
# Other processes' mean use, in cores, above which a step did not have the machine to itself. A quiet machine's
# background (the shell, the agent running the tests, kernel threads) measures ~0.02-0.1 core here.
BUSY_CORES = 0.3
# Process groups of the servers the tier started (``process.Server`` adds each): they run in their own session
# (setsid, their launching shell gone), so they are the tier's without being this process's descendants.
SERVER_GROUPS: set[int] = set()


def machine_busy_s() -> float | None:
    """CPU seconds every process has used since boot (every state of /proc/stat's first line but idle and iowait)."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields]
    # user nice system idle iowait irq softirq steal (guest time is already counted in user)
    busy = sum(ticks[:3]) + sum(ticks[5:8])
    return busy * TICK_S


def tree_cpu_s(root: int) -> float:
    """CPU seconds used by ``root``, every live descendant and every process of a tier server's group (utime +
    stime of each, from /proc/PID/stat)."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    total = 0.0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # The command name is in parentheses and may hold spaces: the fields start after the last ')'.
        rest = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        cpu = (int(rest[11]) + int(rest[12])) * TICK_S
        if int(rest[2]) in SERVER_GROUPS:
            total += cpu
            continue
        parents[pid] = int(rest[1])
        used[pid] = cpu
    for pid, cpu in used.items():
        p = pid
        while p > 1:
            if p == root:
                total += cpu
                break
            p = parents.get(p, 1)
    return total


@dataclass
class Neighbours:
    """Other processes' CPU over a step: ``cores`` is their mean use (None where /proc cannot tell)."""

    cores: float | None = None

    @property
    def busy(self) -> bool:
        return self.cores is not None and self.cores > BUSY_CORES

    def text(self) -> str:
        if self.cores is None:
            return "unknown (no /proc)"
        return f"{self.cores:.2f} core" + (" (busy: not the machine's alone)" if self.busy else "")


@contextmanager
def neighbours() -> Iterator[Neighbours]:
    """Measure what processes outside this test's own (pytest, its children and the servers it started) used
    meanwhile."""
    found = Neighbours()
    me = os.getpid()
    t0, all0, mine0 = time.monotonic(), machine_busy_s(), tree_cpu_s(me)
    try:
        yield found
    finally:
        all1, mine1 = machine_busy_s(), tree_cpu_s(me)
        wall = time.monotonic() - t0
        if all0 is not None and all1 is not None and wall > 0:
            # A process of the tree that ended meanwhile took its CPU with it and counts as a neighbour: the tier's
            # servers live for the whole session, so that is only a short-lived helper's few seconds.
            found.cores = max(0.0, ((all1 - all0) - (mine1 - mine0)) / wall)
