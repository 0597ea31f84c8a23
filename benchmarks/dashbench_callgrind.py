"""``bench_dashboard.py --callgrind``: each arm's client counted under valgrind's callgrind instead of timed."""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dashbench_runs import Target, child_command, wait_ready

_CYCLES = "Ir + 10 × L1 misses + 100 × LL misses"  # KCachegrind's cycle estimate, from callgrind's counts
MISPREDICT_CYCLES = 15  # a mispredicted branch on a recent x86 core: the pipeline refilled (15-20 cycles)


@dataclass
class Counted:
    """One run's counts from callgrind (``--cache-sim=yes``), from the run's start to its result."""

    instructions: int
    l1_misses: int  # instruction and data, reads and writes
    ll_misses: int
    wall: float
    result: dict[str, Any]
    mispredicts: int | None = None  # conditional and indirect branches mispredicted (``--branch-sim``)

    @property
    def cycles(self) -> float:
        return self.instructions + 10 * self.l1_misses + 100 * self.ll_misses

    @property
    def cycles_with_branches(self) -> float:
        return self.cycles + MISPREDICT_CYCLES * (self.mispredicts or 0)

    @classmethod
    def read(cls, counts: Path, wall: float, result: dict[str, Any]) -> Counted:
        """The totals of the callgrind file ``counts``."""
        names: list[str] = []
        totals: list[int] = []
        for text in counts.read_text().splitlines():
            if text.startswith("events:"):
                names = text.split()[1:]
            elif text.startswith("totals:"):
                totals = [int(v) for v in text.split()[1:]]
        got = dict(zip(names, totals, strict=True))
        return cls(
            instructions=got["Ir"],
            l1_misses=got["I1mr"] + got["D1mr"] + got["D1mw"],
            ll_misses=got["ILmr"] + got["DLmr"] + got["DLmw"],
            wall=wall,
            result=result,
            mispredicts=got["Bcm"] + got["Bim"] if "Bcm" in got else None,
        )


def _counted_run(
    args: argparse.Namespace, arm: str, target: Target, out: Path, scale: float, valgrind: bool
) -> Counted | dict[str, Any]:
    """One arm's run in a child process: under callgrind (counts only from ``go`` to the result line), or plain
    (its result only: the wall time the flush schedule is scaled to)."""
    counts = out.with_suffix(".callgrind")
    cmd = child_command(arm, target.url, target.fleet, out, target.width, args.rate, "--flush-scale", repr(scale),
                        "--counted")  # fmt: skip
    if valgrind:
        cache = [] if args.last_level is None else [f"--LL={args.last_level},8,64"]
        if args.branch_sim:
            cache.append("--branch-sim=yes")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes", *cache,
               f"--callgrind-out-file={counts}", *cmd]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        wait_ready(proc, arm)
        if valgrind:
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        t0 = time.monotonic()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        wall = time.monotonic() - t0
        if not line:
            raise SystemExit(f"the run {arm} the dashboard ended without a result")
        if valgrind:
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write(b"exit\n")
        proc.stdin.flush()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    result: dict[str, Any] = orjson.loads(line)
    return Counted.read(counts, wall, result) if valgrind else result


def callgrind(args: argparse.Namespace, target: Target) -> None:
    """Each arm's client in a process of its own under valgrind's callgrind, counting the run's instructions and its
    simulated L1 / last-level cache misses (what a hardware counter would give, which this machine's VM does not
    expose): the same run gives the same counts within a fraction of a percent whatever the machine does meanwhile,
    where two timed runs differ by up to 15 %.

    A run under callgrind is ~50-100× slower, and the dashboard flushes on a wall-clock schedule (4 a second), so
    the dashboard's child stretches that schedule by the slowdown measured on the same run without it (plain ÷
    counted wall): its page then gets about as many flushes as at full speed (printed, against the plain run's).
    The agents' think time is not stretched: under callgrind the run is busy throughout, so more of its flushes
    carry changes than at full speed — which overstates the dashboard's share, never understates it. Blocks run the
    arms as without-with, then with-without."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--callgrind needs {tool} (Debian's valgrind package)")
    ll = "the machine's" if args.last_level is None else f"{args.last_level / 2**20:g} MiB, 8-way"
    print(f"{args.agents} agents × {args.rounds} rounds ({target.width} at once), think {args.think:g} s, simulator "
          f"step {args.step:g} s; each arm counted under callgrind (last-level cache: {ll}), {args.blocks} block(s) "
          "of two runs")  # fmt: skip
    plain = _counted_run(args, "with", target, target.folder / "plain", 1.0, valgrind=False)
    assert isinstance(plain, dict)
    print(f"  plain run with the dashboard (not counted): {plain['wall']:.1f} s wall, {plain['cpu']:.2f} s client CPU, "
          f"{plain['sent']} flushes, {plain['changed']} of them with agents' changes")  # fmt: skip
    walls: list[float] = []
    shares: dict[str, list[float]] = {"instructions": [], "L1 misses": [], "LL misses": [], "cycle estimate": []}
    if args.branch_sim:
        shares |= {"mispredicted branches": [], "cycle estimate with branches": []}
    for block in range(args.blocks):
        got: dict[str, Counted] = {}
        for arm in ("without", "with") if block % 2 == 0 else ("with", "without"):
            scale = 1.0
            if arm == "with":
                scale = (statistics.fmean(walls) if walls else 60.0 * plain["wall"]) / plain["wall"]
            got[arm] = run = _count_arm(args, target, block, arm, scale)
            if arm == "without":
                walls.append(run.wall)
            _print_arm(block, arm, run, scale)
        _add_shares(shares, got["with"], got["without"])
    _print_shares(shares)


def _count_arm(args: argparse.Namespace, target: Target, block: int, arm: str, scale: float) -> Counted:
    """One arm's counted run of a block, counted again (up to three times) if it stopped early; its file kept with
    ``--keep-counts``."""
    for attempt in range(3):
        out = target.folder / f"runs-{block}-{arm}-{attempt}"
        run = _counted_run(args, arm, target, out, scale, valgrind=True)
        assert isinstance(run, Counted)
        r = run.result
        if r["failure"] is None and r["done"] == args.agents:
            break
        # A client ~50× slower can fall behind its own watchdog (a connect that its busy loop completes
        # late reads as a server that went quiet): the fleet then stops, and the run is counted again.
        print(f"  block {block + 1}, {arm} the dashboard: the run stopped early ({r['done']} agents done, "
              f"{r['turns']} turns; {r['failure']}): counted again")  # fmt: skip
    else:
        raise SystemExit("three counted runs in a row stopped early")
    if args.keep_counts is not None:  # for callgrind_annotate: where, by function, the counts differ
        args.keep_counts.mkdir(parents=True, exist_ok=True)
        shutil.copy(out.with_suffix(".callgrind"), args.keep_counts / f"block{block + 1}-{arm}.callgrind")
    return run


def _print_arm(block: int, arm: str, run: Counted, scale: float) -> None:
    r = run.result
    extra = ""
    if arm == "with":
        extra = (f"; flushes stretched {scale:.0f}×: {r['sent']} flushes, {r['changed']} with changes "
                 f"({r['kib'] / max(1, r['changed']):.1f} KiB each)")  # fmt: skip
    branches = "" if run.mispredicts is None else f", {run.mispredicts / 1e6:.1f} M mispredicted branches"
    print(f"  block {block + 1}, {arm} the dashboard: {run.instructions / 1e9:.2f} G instructions, "
          f"{run.l1_misses / 1e6:.1f} M L1 misses, {run.ll_misses / 1e6:.2f} M LL misses{branches}, "
          f"{run.wall:.0f} s wall under callgrind, {r['turns']} turns{extra}")  # fmt: skip


def _add_shares(shares: dict[str, list[float]], w: Counted, wo: Counted) -> None:
    """A block's paired figures, (with − without) ÷ without, for each count."""
    for name, a, b in (("instructions", w.instructions, wo.instructions), ("L1 misses", w.l1_misses,
                       wo.l1_misses), ("LL misses", w.ll_misses, wo.ll_misses),
                       ("cycle estimate", w.cycles, wo.cycles)):  # fmt: skip
        shares[name].append((a - b) / b)
    if w.mispredicts is not None and wo.mispredicts is not None:
        shares["mispredicted branches"].append((w.mispredicts - wo.mispredicts) / wo.mispredicts)
        shares["cycle estimate with branches"].append((w.cycles_with_branches - wo.cycles_with_branches)
                                                      / wo.cycles_with_branches)  # fmt: skip


def _print_shares(shares: dict[str, list[float]]) -> None:
    for name, values in shares.items():
        labels = {"cycle estimate": f"{name} ({_CYCLES})",
                  "cycle estimate with branches": f"{name} (+ {MISPREDICT_CYCLES} × mispredicts)"}  # fmt: skip
        label = labels.get(name, name)
        print(f"  added by the dashboard, {label}: " + ", ".join(f"{v:+.2%}" for v in values)
              + f" (mean {statistics.fmean(values):+.2%})")  # fmt: skip
