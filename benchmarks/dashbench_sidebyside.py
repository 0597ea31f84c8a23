"""``bench_dashboard.py --side-by-side``: each block's two arms at the same time, in two client processes."""

from __future__ import annotations

import argparse
import subprocess
from typing import Any

import orjson

from dashbench_runs import Target, child_command, wait_ready
from dashbench_stats import share_line


def side_by_side(args: argparse.Namespace, target: Target) -> None:
    """Per block, the run without the dashboard and the run with it at the same time, each in a process of its own
    on the client's core (both inherit this process's affinity), against the one simulator. Run one after the
    other, two identical runs differ by up to 15 % in client CPU as the shared machine drifts; side by side, both
    runs meet the same drift, the same simulator pace and each other. Which is started first alternates by block.
    Each block gives one paired figure, (with − without) ÷ without. With ``--null`` neither run has the dashboard:
    the figure is then what the design alone reads, which should be near 0."""
    shares: list[float] = []
    base: list[float] = []
    print(f"{args.agents} agents × {args.rounds} rounds ({target.width} at once) in each of two client processes "
          f"side by side, think {args.think:g} s, simulator step {args.step:g} s, {args.blocks} block(s)"
          + (" — the A/A check: neither run has the dashboard" if args.null else ""))  # fmt: skip
    for block in range(args.blocks):
        arms = ("without", "with") if block % 2 == 0 else ("with", "without")
        got = _pair(args, target, block, arms)
        w, wo = got["with"], got["without"]
        for arm, r in got.items():
            if r["failure"] is not None or r["done"] != args.agents:
                print(f"  warning: the run {arm} the dashboard did not finish cleanly: {r['done']} agents done; "
                      f"server failure: {r['failure']}")  # fmt: skip
        shares.append((w["cpu"] - wo["cpu"]) / wo["cpu"])
        base.append(wo["cpu"])
        print(f"  block {block + 1} ({arms[0]} started first): without {wo['cpu']:.2f} s client CPU "
              f"({wo['wall']:.1f} s wall), with {w['cpu']:.2f} s ({w['wall']:.1f} s wall; {w['changed']} deltas "
              f"with changes): {shares[-1]:+.1%}")  # fmt: skip
    print("  " + share_line(shares))
    print(f"  without the dashboard, client CPU {min(base):.2f} to {max(base):.2f} s a run")


def _pair(args: argparse.Namespace, target: Target, block: int, arms: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """One block's two runs, started in the order ``arms``, both set up before either starts: each arm's result."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for arm in arms:
            child = "without" if args.null else arm
            extra = ["--reader-on-client-core"] if args.reader_on_client_core else []
            cmd = child_command(child, target.url, target.fleet, target.folder / f"runs-{block}-{arm}", target.width,
                                args.rate, *extra)  # fmt: skip
            procs[arm] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for arm, proc in procs.items():  # both imported and set up before either run starts
            wait_ready(proc, arm)
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        got = {}
        for arm, proc in procs.items():
            out, _ = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"the run {arm} the dashboard failed (exit {proc.returncode})")
            got[arm] = orjson.loads(out.splitlines()[-1])
        return got
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
