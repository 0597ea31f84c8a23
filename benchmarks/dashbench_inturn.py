"""``bench_dashboard.py``'s arms in turn: blocks of four runs in this process (without, with, with, without the
dashboard), then the client CPU it adds, the dashboard's own CPU timed in place in one more run, the collector, what
the stream carried and how the event loop fared."""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
from dataclasses import dataclass, field

from agentload.dashboard.server import INTERVAL_S
from agentload.fleet.app import FleetApp
from agentload.fleet.results import FleetResult
from dashbench_probes import GcTime, LoopProfile, OwnTime
from dashbench_reader import Stream, start_reader
from dashbench_runs import Target, timed_run
from dashbench_stats import pct, share_line


@dataclass
class Arms:
    """What the runs of each arm (``False``: without the dashboard, ``True``: with it) gave, summed over the blocks."""

    profile: LoopProfile | None
    cpu: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})
    wall: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})
    results: dict[bool, FleetResult] = field(default_factory=dict)  # each arm's last run
    stream: Stream = field(default_factory=Stream)
    lags: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    # per run: context switches (voluntary, involuntary), minor page faults
    switches: dict[bool, list[tuple[int, int, int]]] = field(default_factory=lambda: {False: [], True: []})
    shares: list[float] = field(default_factory=list)  # one paired figure per block: (with − without) ÷ without
    # The blocks run without the in-place timers: a timer wraps each of ~20,000 hook calls a run (0.5 µs each
    # here, ~0.4 % of the client's CPU) and would weigh on the "with" arm alone. One more run after the blocks
    # times the dashboard's own code in place.
    own: OwnTime = field(default_factory=OwnTime)
    collector: dict[bool, GcTime] = field(default_factory=lambda: {False: GcTime(), True: GcTime()})


def in_turn(args: argparse.Namespace, target: Target) -> None:
    """The blocks, in the order A B B A: drift of a shared machine (or of the server's warm cache) falls on both
    sides; then every figure of the runs."""
    profile = LoopProfile() if args.loop_profile else None
    if profile is not None:
        profile.install()
    arms = Arms(profile)
    print(f"{args.agents} agents × {args.rounds} rounds ({target.width} at once), think {args.think:g} s, "
          f"simulator step {args.step:g} s, {args.blocks} block(s) of four runs"
          + (" — the A/A check: no run has the dashboard (runs 2 and 3 of each block stand for it)" if args.null
             else ""))  # fmt: skip
    for block in range(args.blocks):
        used_in = {False: 0.0, True: 0.0}
        for dashboard in (False, True, True, False):
            used_in[dashboard] += _one_run(args, target, arms, block, dashboard)
        arms.shares.append((used_in[True] - used_in[False]) / used_in[False])
    runs = 2 * args.blocks
    _report_cpu(args, arms, runs)
    if not args.null and not args.no_page:
        _own_time_run(args, target.app(dashboard=True, rate=args.rate), arms.stream, arms.own)
    _report_collector(args, arms, runs)
    _report_stream(args, arms.stream, arms.own)
    _report_loop(arms)


def _reader_for(args: argparse.Namespace, dashboard: bool) -> subprocess.Popen[bytes] | None:
    """The page's stand-in for a run with the dashboard (none when it reads in this process, or no page is open);
    with ``--decoy``, the decoy in its place for a run without."""
    if dashboard and not args.reader_in_process and not args.null and not args.no_page:
        return start_reader(off_core=not args.reader_on_client_core)
    if args.decoy:
        reader = start_reader(off_core=not args.reader_on_client_core)
        assert reader.stdin is not None
        reader.stdin.write(b"decoy\n")
        reader.stdin.flush()
        return reader
    return None


def _one_run(args: argparse.Namespace, target: Target, arms: Arms, block: int, dashboard: bool) -> float:
    """One run of a block, its figures added to ``arms`` and its line printed; returns its client CPU."""
    opts = target.app(dashboard=dashboard and not args.null, rate=args.rate)
    reader = _reader_for(args, dashboard)
    gc.callbacks.append(arms.collector[dashboard])
    if arms.profile is not None:
        arms.profile.start(dashboard and not args.null)
    try:
        r, used, took = timed_run(
            opts,
            arms.stream if dashboard and not args.null and not args.no_page else None,
            arms.lags[dashboard],
            arms.own,
            reader,
            arms.switches[dashboard],
        )
    finally:
        gc.callbacks.remove(arms.collector[dashboard])
        if arms.profile is not None:
            arms.profile.stop()
    arms.results[dashboard] = r
    arms.cpu[dashboard] += used
    arms.wall[dashboard] += took
    arm = (
        ("B (the A/A check: no dashboard)" if args.null else "with the dashboard")
        if dashboard
        else ("A (no dashboard)" if args.null else "without the dashboard")
    )
    waits, preempted, faults = arms.switches[dashboard][-1]
    print(
        f"  block {block + 1}, run {arm}: {r.totals.turns} turns, {took:.1f} s wall, {used:.2f} s client "
        f"CPU; the loop slept {waits:,} times, was preempted {preempted:,}; {faults:,} page faults"
    )
    return used


def _report_cpu(args: argparse.Namespace, arms: Arms, runs: int) -> None:
    """Each arm's mean run, the client CPU the dashboard adds over the blocks, the loop's CPU by what it ran, and the
    reader's own process."""
    base, dash = arms.results[False], arms.results[True]
    base_cpu, dash_cpu, base_wall, dash_wall = (arms.cpu[False] / runs, arms.cpu[True] / runs,
                                                arms.wall[False] / runs, arms.wall[True] / runs)  # fmt: skip
    for name, r in (("without", base), ("with", dash)):
        if r.server_failure is not None or r.totals.done != args.agents:
            print(f"  warning: the run {name} the dashboard did not finish cleanly: {r.totals.done} agents done; "
                  f"server failure: {r.server_failure}")  # fmt: skip
    print(f"  without dashboard (mean of {runs}): {base.totals.turns} turns, {base_wall:.1f} s wall, "
          f"{base_cpu:.2f} s client CPU")  # fmt: skip
    where = "in this process"
    if not args.reader_in_process:
        where = "in its own process" + (
            " on the client's core" if args.reader_on_client_core else ", off the client's core"
        )
    if args.null:
        where += " — in this A/A check, runs 2 and 3 of each block, with no dashboard"
    if args.no_page:
        where = "— none here (--no-page): the dashboard serving with no page open"
    print(f"  with dashboard + 1 stream reader {where} (mean of {runs}): {dash.totals.turns} turns, "
          f"{dash_wall:.1f} s wall, {dash_cpu:.2f} s client CPU "
          f"({(dash_cpu - base_cpu) / base_cpu:+.1%} vs without)")  # fmt: skip
    print("  " + share_line(arms.shares))
    # Said where the figure is read: the same stream with no agentload code read +9.3 % and −2.7 % in two runs of
    # this design here (docs/dashboard.md, 6 December 2026, night), so its interval does not settle 5 %.
    print("  (runs in turn on a machine whose runs drift cannot resolve 5 %: --side-by-side and --callgrind can; "
          "benchmarks/bench_stream_cost.py shows a bare stream's spread)")  # fmt: skip
    if arms.profile is not None:
        arms.profile.report()
    if not args.reader_in_process:
        print(f"  the stream reader's own process (a browser's share, not the client's): "
              f"{arms.own.reader_process / runs:.3f} s CPU a run")  # fmt: skip


def _own_time_run(args: argparse.Namespace, opts: FleetApp, stream: Stream, own: OwnTime) -> None:
    """One more run with the dashboard, its own code timed in place (``OwnTime``: the timers are installed now, for
    good, so no run of the blocks before pays for them); with ``--change-ages`` also how long each change waited."""
    own.install(ages=args.change_ages)
    s0, f0, r0, x0 = own.state, own.flushes, own.reader, own.writes
    reader = None if args.reader_in_process else start_reader(off_core=not args.reader_on_client_core)
    _, used, _ = timed_run(opts, stream, [], own, reader)
    state, flushes, writes, parsing = own.state - s0, own.flushes - f0, own.writes - x0, own.reader - r0
    print(f"  the dashboard's own CPU, timed in place in one more run with it: {state - flushes:.3f} s its hooks, "
          f"{flushes:.3f} s its flushes, {writes:.3f} s writing the stream"
          + (f", {parsing:.3f} s the stream reader's parsing" if args.reader_in_process else "")
          + f" = {(state + writes + parsing) / used:.2%} of that run's {used:.2f} s of client CPU")  # fmt: skip


def _report_collector(args: argparse.Namespace, arms: Arms, runs: int) -> None:
    settings = "as Python sets it" if args.default_gc else "load.collector"
    for name, g, used in (("without", arms.collector[False], arms.cpu[False]),
                          ("with", arms.collector[True], arms.cpu[True])):  # fmt: skip
        print(f"  cyclic collector {name} the dashboard ({settings}): {g.cpu / runs:.3f} s a run = "
              f"{g.cpu / used:.1%} of its client CPU, {g.passes / runs:.0f} passes a run "
              f"({g.full / runs:.1f} over the oldest generation)")  # fmt: skip


def _report_stream(args: argparse.Namespace, st: Stream, own: OwnTime) -> None:
    """What the page's stream carried: the update rate, the flushes and their gaps, and how long changes waited."""
    rate = args.rate or 1 / INTERVAL_S  # the schedule's flushes a second
    flushes = st.changed + st.other + st.empty
    per_s = (lambda n: n / st.span) if st.span > 0 else (lambda n: 0.0)
    if not flushes:  # --null or --no-page: no page read a stream, so there is no rate to give
        print("  update rate: no page was open in these runs (no stream was read)")
    else:
        print(f"  update rate: {per_s(st.changed):.2f} deltas a second carried agents' changes ({st.changed} "
              f"of {flushes} flushes in {st.span:.1f} s of stream; "
              f"{st.bytes / max(st.changed + st.other, 1) / 1024:.1f} KiB a delta on average)")  # fmt: skip
        print(f"  flushes: {per_s(flushes):.2f} a second (the schedule: {rate:g}, none while idle); {st.other} "
              f"with the server's sample only, {st.empty} with nothing to send; gap between flushes "
              f"{_spread(st.flush_gaps)}")  # fmt: skip
    if ages := own.ages:
        print(f"  every change reached the stream within: {_spread(ages, 0.99)} of being made "
              f"({len(ages)} deltas; the schedule's bound: 1.3 periods, {1300 / rate:.0f} ms)")  # fmt: skip
    if gaps := st.changed_gaps:
        print(f"  between deltas that carried changes: {_spread(gaps)}")


def _report_loop(arms: Arms) -> None:
    """How the event loop fared in each arm: its context switches and page faults, and its lateness."""
    for dashboard in (False, True):
        sw = arms.switches[dashboard]
        print(f"  context switches a run {'with' if dashboard else 'without'} the dashboard: the loop slept "
              f"{statistics.fmean(s[0] for s in sw):,.0f} times (it waited for the network), was preempted "
              f"{statistics.fmean(s[1] for s in sw):,.0f}, faulted {statistics.fmean(s[2] for s in sw):,.0f} pages "
              f"in (mean of {len(sw)} runs)")  # fmt: skip
    for dashboard in (False, True):
        lag = arms.lags[dashboard]
        print(f"  event loop lateness {'with' if dashboard else 'without'} the dashboard (a 50 ms sleep): "
              f"{_spread(lag, digits=1)}")  # fmt: skip


def _spread(values: list[float], high: float = 0.95, digits: int = 0) -> str:
    """``values`` (seconds) as their median, their ``high`` quantile (to ``digits`` decimals) and maximum, in ms."""
    return (f"p50 {pct(values, 0.5) * 1000:.{digits}f} ms, p{round(high * 100)} {pct(values, high) * 1000:.{digits}f} "
            f"ms, max {pct(values, 1) * 1000:.0f} ms")  # fmt: skip
