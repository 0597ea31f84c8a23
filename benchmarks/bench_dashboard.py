"""The dashboard at 1,000 agents: its update rate, the client CPU it adds, and the browser tab's frame time.

The same fleet (``--agents`` one-task agents, ``--rounds`` tool-calling turns, ``--think`` s between turns,
``--width`` of them at once, all by default: ``--mode parallel --width N``) runs against the simulator in a
separate process (``simproc``: only the client is in this process), three times:

1. without ``--dashboard`` — the baseline client CPU (user + system seconds of this process);
2. with ``--dashboard`` and one event-stream reader — the page's stand-in, in a process of its own as a browser is,
   on the machine's other core (``--reader-on-client-core``: on the client's, where its wake-ups cost the client
   CPU; ``--reader-in-process``: in this process, so its socket and parsing count against the dashboard too) — the
   client CPU again, the share it adds, and what the stream carried. 1 and 2 run in blocks of
   four, in the order 1 2 2 1, so a shared machine's drift falls on both sides; each block gives one paired
   figure, (2 − 1) ÷ 1. Two identical runs differ by up to 14 % in client CPU on a 2-core machine, more than
   the effect sought, so ``--blocks K`` repeats the block and the share is given as the mean of the K figures
   with a 95 % interval (bootstrap over the blocks, seeded): "≤ 5 %" is shown when the interval's top is ≤ 5 %.
   ``--null`` runs the same blocks with no dashboard in any run (runs 2 and 3 stand for it): the A/A check of
   the design, which should read 0 (5 December 2026, 8 blocks: −0.6 %, 95 % interval −5.7 to +4.6 %).
   The dashboard's own CPU is timed in place in one more run with it after the blocks (``OwnTime``: its hooks,
   flushes and encoding, and the reader's parsing) as a share of that same run's client CPU, which the machine's
   drift moves far less; never in the blocks' runs, where its timers (0.5 µs on each of ~20,000 hook calls a run)
   would weigh on the arm with the dashboard alone. ``--loop-profile`` prints each run's CPU by what the event loop
   ran (the agents' work, the dashboard's stream and flusher, the socket reads). The cyclic garbage collector's
   passes and CPU are counted per arm (``gc.callbacks``): a load
   runs with ``load.collector``'s settings, and ``--default-gc`` runs both arms with Python's own, for the before;
   ``--side-by-side`` runs each block's two arms at the same time instead, in two client processes on the client's
   core against the one simulator, so the machine's drift falls on both alike (a block's noise about ±3 %, checked
   with ``--null``, where neither process has the dashboard and the figure should read 0). It reads lower than the
   arms in turn (4 December 2026: +3.0 and +3.8 % against +8.4 %, each with a narrow interval; 6 December, without
   the in-place timers: +0.8 % against +11.0 %): two processes taking turns on a core may hide the cost a lone
   client pays in its caches, so it does not replace the arms in turn. Nor can the arms in turn resolve 5 % on a
   machine whose runs drift as this VM's: ``bench_stream_cost.py`` put an aiohttp event stream with no agentload code
   in the client and read +9.3 % (95 % interval +4.6 to +14.7 %) in one run and −2.7 % (−7.7 to +2.1 %) in the next.
   ``--callgrind`` counts instead of timing: each arm's client runs alone in a process of its own under valgrind's
   callgrind, which counts the run's instructions and simulates its L1 and last-level caches (what a hardware
   counter would give; this machine's VM has none). The counts do not move with the machine's drift; the run is
   ~50-100× slower, so the dashboard's flush schedule is stretched by the slowdown measured on the same fleet (its
   flush count is printed beside a plain run's). ``--last-level BYTES`` sizes the simulated last-level cache
   (valgrind's default is the machine's L3): one core's L2 (1 MiB here) counts the misses that leave the core;
   ``--branch-sim`` simulates the branch predictor too (5 December 2026: the dashboard adds +2.7 % mispredicted
   branches for +2.9 % instructions — not where the timed figure's excess is); ``--keep-counts DIR`` keeps each
   counted run's file for ``callgrind_annotate``;
3. with ``--dashboard`` and the page open in headless Chromium (Debian's, via Playwright; skipped when absent) —
   the deltas a second the page received and its frame times (``requestAnimationFrame`` intervals: p50, p95, max).

The update rate is **deltas that carried agents' changes, per second** of the stream (first to last flush): a
delta that carries only the once-a-second server sample, and the keep-alive comment a flush sends when nothing
changed, are counted apart, never in it. Every flush sends one of the three, so together they show whether the
server kept its schedule — 4 flushes a second while anything can change (a request in flight, a page behind), none
while the dashboard is idle (the agents all thinking: the next event flushes, at once after a quiet period, else
at the rate) — and, if the rate is lower,
why: flushes with nothing to send (keep-alives), idle spells and flushes that came late (the gaps between flushes,
and the lateness of a 50 ms sleep in the same event loop: a loop starved by the run itself shows there). That rate
counts what the fleet changed, so it falls when the agents move in lockstep (all thinking at once: nothing to send
for two seconds). What the page is promised is the other side: ``--change-ages`` measures, for every delta, how long
its oldest change waited to be sent (from the first change after the previous delta) — within 1.3 periods (325 ms)
when the schedule holds (a flush rides on the run's first event from 30 % of a period before it is due, so the
next may come up to 1.3 periods later).

    .venv/bin/python benchmarks/bench_dashboard.py                   # 1,000 agents × 4 rounds, 2 s think
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300   # a 2-core machine's simulator
    .venv/bin/python benchmarks/bench_dashboard.py --agents 200 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser  # in turn
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser --null  # A/A
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser --decoy
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --blocks 4 --no-browser --loop-profile  # by task
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --blocks 4 --no-browser --loop-profile --no-page
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser --default-gc
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --blocks 12 --side-by-side --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --side-by-side --null --blocks 12 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --callgrind --blocks 2 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --callgrind --last-level 1048576 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --width 200 --callgrind --branch-sim --keep-counts cg --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --change-ages   # ages, the browser
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web

from agentload.dashboard import open_board
from agentload.dashboard.server import INTERVAL_S, MAX_DASHBOARD_RATE, MIN_DASHBOARD_RATE, Flusher, dashboard_interval
from agentload.dashboard.state import LiveState
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult
from agentload.load import runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simproc import fast_profile, sim_process

FLEET = """
name = "dash-bench"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = {rounds}
max_tokens = 32
think_time_s = {think}
context_tokens = 500
tool_result_tokens = 60

[[tasks]]
id = "a"
prompt = "Work item {{replica}}."
count = {agents}
"""

# Counts the page's delta events and its frame intervals, injected before the page's own script runs.
PROBE = """
window.__deltas = 0; window.__changed = 0; window.__frames = [];
const Native = window.EventSource;
window.EventSource = class extends Native {
  constructor(url) {
    super(url);
    // A delta without agents' changes has '"agents":[]' (orjson writes no spaces; a string's quotes are escaped).
    this.addEventListener("delta", (e) => {
      window.__deltas++;
      if (!e.data.includes('"agents":[]')) window.__changed++;
    });
  }
};
let last = 0;
function tick(t) { if (last) window.__frames.push(t - last); last = t; requestAnimationFrame(tick); }
requestAnimationFrame(tick);
// The page's own script (and its layout) holding the main thread over 50 ms; a long frame without one was the
// browser waiting for a core, not the page's work.
window.__longtasks = [];
new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__longtasks.push(e.duration); })
  .observe({ entryTypes: ["longtask"] });
"""


@dataclass
class OwnTime:
    """The dashboard's own CPU in a run, timed in place around its code: steadier than the difference of two whole
    runs, whose client CPU moves by up to 14 % between identical runs on a shared machine.

    Timed with ``time.perf_counter`` (a vDSO read, ~50 ns), not ``time.process_time`` (a system call, ~600 ns here):
    the hooks were called ~20,000 times a run, and the CPU clock's own cost, twice a call, was itself a measurable
    part of the "with" arm. The timed code never blocks or awaits, so its wall time is its CPU time but for the
    moments the OS gives its core to another process (which only overstates the share).

    ``state``: the live state's hooks the run calls (turns, requests, agent states, scrapes) and the flusher's
    refresh, delta and encoding, outermost call only. ``reader``: the event-stream reader's parsing when it runs in
    this process (``--reader-in-process``); ``reader_process``: the CPU of the reader's own process otherwise (a
    browser's, not the client's). ``writes``: aiohttp writing the stream's events to the socket. Not in any: the event
    loop running the flusher's and the stream's tasks at each flush, and the pause check each turn makes.
    """

    state: float = 0.0
    flushes: float = 0.0  # the part of ``state`` in the flusher's refresh, snapshot, delta and encoding
    reader: float = 0.0
    reader_process: float = 0.0
    writes: float = 0.0  # the event stream's writes (aiohttp's web server, to the socket)
    # How long each change waited to be sent: from the first change after a delta to the next delta that carried it.
    ages: list[float] = field(default_factory=list)
    _pending: float | None = None
    _depth: int = 0

    def install(self, ages: bool = False) -> None:
        """Time every hook of the live state and the flusher's encoding (class-wide, once per process); with
        ``ages``, also how long each change waits to be sent (a wrapper on every change: off for the CPU figures)."""
        hooks = ("agent", "turn", "limiter_changed", "stream_started", "agent_control", "touch", "record",
                 "control_changed", "on_scrape", "refresh", "snapshot", "delta")  # fmt: skip
        flushing = {"refresh", "snapshot", "delta", "encoded_delta"}
        for owner, names in ((LiveState, hooks), (Flusher, ("encoded_delta",))):
            for name in names:
                setattr(owner, name, self._timed(getattr(owner, name), flush=name in flushing))
        # The event stream's writes (the client's own requests use aiohttp's client, never a StreamResponse, and the
        # simulator is another process: every StreamResponse write here is the dashboard's). Timed to the end of the
        # await: a write that waited for the socket to drain would count other tasks' work too, which can only
        # overstate the share.
        write = web.StreamResponse.write

        async def timed_write(response: web.StreamResponse, data: Any) -> None:
            t0 = time.perf_counter()
            try:
                await write(response, data)
            finally:
                self.writes += time.perf_counter() - t0

        setattr(web.StreamResponse, "write", timed_write)  # noqa: B010  (patched for the benchmark's process)
        if ages:
            self._install_ages()

    def _install_ages(self) -> None:
        # The age of what a delta sends: a change marks the time if none is waiting; a delta sent clears it.
        bump, encoded, snapshot = LiveState._bump, Flusher.encoded_delta, LiveState.snapshot

        def marked_bump(state: LiveState, *args: Any, **kwargs: Any) -> None:
            if self._pending is None:
                self._pending = time.perf_counter()
            bump(state, *args, **kwargs)

        def aged_delta(flusher: Flusher, cursor: Any) -> bytes | None:
            event = encoded(flusher, cursor)
            if event is not None and self._pending is not None:
                self.ages.append(time.perf_counter() - self._pending)
                self._pending = None
            return event

        def fresh_snapshot(state: LiveState) -> Any:
            self._pending = None  # a page's first view holds everything so far: no change waits once it is taken
            return snapshot(state)

        setattr(LiveState, "_bump", marked_bump)  # noqa: B010  (patched for the benchmark's process)
        setattr(LiveState, "snapshot", fresh_snapshot)  # noqa: B010
        setattr(Flusher, "encoded_delta", aged_delta)  # noqa: B010

    def _timed(self, fn: Any, *, flush: bool) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # called from another timed method: already counted
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                self.state += took
                if flush:
                    self.flushes += took
                self._depth -= 1

        return timed


@dataclass
class GcTime:
    """The cyclic collector's passes and their CPU (``gc.callbacks``), summed over the runs of one arm."""

    passes: int = 0
    full: int = 0  # passes over the oldest generation
    cpu: float = 0.0
    _t0: float = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
            return
        self.passes += 1
        self.full += info["generation"] == 2
        self.cpu += time.process_time() - self._t0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _opts(fleet: Path, out: Path, url: str, width: int, dashboard: bool, rate: float | None = None) -> FleetApp:
    """The fleet's run options; ``rate``: the page's updates a second (``agentload run --dashboard-rate``)."""
    interval_s = dashboard_interval(dashboard, rate if dashboard else None)
    return FleetApp(
        FleetSettings(
            fleet=fleet,
            out=out,
            url=url,
            mode=Mode.PARALLEL,
            width=width,
            progress="none",
            dashboard=dashboard,
            fsync=False,
            dashboard_interval_s=interval_s,
        ),
        open_board=open_board,
    )


class LoopProfile:
    """``--loop-profile``: this process's CPU in each run by what its event loop ran — each callback's time
    (``time.perf_counter`` around ``asyncio.Handle._run``: a callback never blocks, so its wall time is its CPU time
    but for preemptions), summed by the coroutine a task step resumed (the agents' ``drive``, the dashboard's stream
    and flusher, the server monitor) or the callback's name (a socket's reads). It shows which work differs between
    the arms: the dashboard's own tasks, and the agents' work, which is the same in both arms (the same steps, the same
    requests) and whose time moves with the machine. Installed for the whole process: both arms pay its timer."""

    def __init__(self) -> None:
        self.runs: list[tuple[bool, dict[str, list[float]]]] = []  # (with the dashboard, name → [steps, seconds])
        self._current: dict[str, list[float]] | None = None

    def install(self) -> None:
        run = asyncio.Handle._run
        clock = time.perf_counter

        def timed(handle: asyncio.Handle) -> None:
            t0 = clock()
            run(handle)
            took = clock() - t0
            if (current := self._current) is not None:
                name = _handle_name(handle)
                entry = current.get(name)
                if entry is None:
                    entry = current[name] = [0.0, 0.0]
                entry[0] += 1
                entry[1] += took

        setattr(asyncio.Handle, "_run", timed)  # noqa: B010  (patched for the benchmark's process)

    def start(self, dashboard: bool) -> None:
        self._current = {}
        self.runs.append((dashboard, self._current))

    def stop(self) -> None:
        self._current = None

    def report(self, top: int = 8) -> None:
        names: dict[str, float] = {}
        for _, run in self.runs:
            for name, (_, took) in run.items():
                names[name] = names.get(name, 0.0) + took
        print("  the loop's CPU by what it ran, s a run (each run in order; * with the dashboard):")
        for name in sorted(names, key=lambda n: -names[n])[:top]:
            per_run = " ".join(f"{r.get(name, [0, 0.0])[1]:.3f}{'*' if d else ' '}" for d, r in self.runs)
            print(f"    {name[:60]:60s} {per_run}")


def _handle_name(handle: asyncio.Handle) -> str:
    """What a callback runs: the coroutine a task's step resumes, else the callback's own name."""
    callback = handle._callback  # type: ignore[attr-defined]  # asyncio's, read only here
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return str(getattr(owner.get_coro(), "__qualname__", "task"))
    return str(getattr(callback, "__qualname__", None) or type(callback).__name__)


@dataclass
class Stream:
    """What one page's event stream carried, summed over the runs read."""

    changed: int = 0  # deltas that carried agents' changes (the update rate counts these)
    other: int = 0  # deltas with the server's sample or the summary only
    empty: int = 0  # flushes with nothing to send (a keep-alive comment)
    bytes: int = 0  # of the deltas' data
    span: float = 0.0  # first to last flush, s
    flush_gaps: list[float] = field(default_factory=list)  # between consecutive flushes of any kind, s
    changed_gaps: list[float] = field(default_factory=list)  # between consecutive deltas that carried changes, s
    loop_lag: list[float] = field(default_factory=list)  # how late a 50 ms sleep in the run's loop woke, s


async def _read_events(url: str, stream: Stream, own: OwnTime) -> None:
    """Read one page's event stream at ``url`` (the dashboard's URL, token in it) until ``end``, into ``stream``."""
    base, token = url.split("/?token=")
    async with aiohttp.ClientSession() as session, session.get(f"{base}/events", params={"token": token}) as resp:
        first = flushed = changed_at = None  # the first flush, the last one, the last that carried changes
        in_delta = False
        try:
            async for line in resp.content:
                t0 = time.perf_counter()  # the reader's own work on this line (the await above is not in it)
                try:
                    now = time.monotonic()
                    flush = line.startswith(b"event: delta") or line.startswith(b": keep-alive")
                    if flush:
                        if flushed is not None:
                            stream.flush_gaps.append(now - flushed)
                        flushed = now
                        first = first or now
                        in_delta = line.startswith(b"event: delta")
                        stream.empty += not in_delta
                    elif in_delta and line.startswith(b"data: "):
                        in_delta = False
                        stream.bytes += len(line)
                        if orjson.loads(line[6:]).get("agents"):
                            stream.changed += 1
                            if changed_at is not None:
                                stream.changed_gaps.append(now - changed_at)
                            changed_at = now
                        else:
                            stream.other += 1
                    elif line.startswith(b"event: end"):
                        return
                finally:
                    own.reader += time.perf_counter() - t0
        finally:
            if first is not None and flushed is not None:
                stream.span += flushed - first


def _off_client_core(pid: int) -> None:
    """Move process ``pid`` off this process's cores, onto the machine's others (the simulator's, on two cores).

    A child inherits the client's affinity: the page's stand-in would share the client's one core, where a browser
    on the user's machine would not. Sharing it cost the client +21 % CPU in paired runs (3 blocks, 400 agents × 3
    rounds), though the reader's own process used 0.07 s a run: its wake-ups' cache refills fall on the client. On
    the other core: +7 % (4 blocks). ``--reader-on-client-core`` keeps the shared placement to show it.
    """
    mine = os.sched_getaffinity(0)
    others = set(range(os.cpu_count() or 1)) - mine
    if others:
        with contextlib.suppress(OSError):  # gone already, or not allowed: it reads where it was put
            os.sched_setaffinity(pid, others)


def _start_reader(off_core: bool) -> subprocess.Popen[bytes]:
    """The page's stand-in in a process of its own, started before the run and waiting for the dashboard's URL: a
    browser's page is open before the run it shows, so its start-up (the reader imports this script, hence all of
    agentload: a second or more of CPU) must not fall inside the run, where it would compete for the other core
    with the simulator."""
    proc = subprocess.Popen([sys.executable, __file__, "--read-events"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if off_core:
        _off_client_core(proc.pid)
    assert proc.stdout is not None
    if proc.stdout.readline() != b"ready\n":  # its imports are done: it waits for the URL
        proc.kill()
        raise SystemExit("the event-stream reader did not start")
    return proc


async def _read_stream(opts: FleetApp, stream: Stream, own: OwnTime, reader: subprocess.Popen[bytes] | None) -> None:
    """The page's stand-in: reads the run's event stream in this process (no ``reader``: its parsing counts as the
    client's CPU) or, as a browser would, in the process ``reader`` (``_start_reader``), told the URL here and read
    after the run (``_reader_result``)."""
    while opts.dashboard_url is None:  # noqa: ASYNC110  (run_fleet sets it; there is no event to wait on)
        await asyncio.sleep(0.01)
    if reader is None:
        await _read_events(opts.dashboard_url, stream, own)
        return
    # The URL (its token) goes on the reader's stdin, not its command line, which any local user can list: one line
    # to a pipe, which does not block. Its answer is read once the run is over, in this thread: a thread waiting for
    # it through the run (``asyncio.to_thread``, until 6 December 2026) was in the client's process in the arm with
    # the dashboard only.
    assert reader.stdin is not None
    reader.stdin.write(opts.dashboard_url.encode() + b"\n")
    reader.stdin.close()


def _reader_result(reader: subprocess.Popen[bytes], stream: Stream, own: OwnTime) -> None:
    """The reader's figures, once it has read the stream's ``end``: added to ``stream``; its CPU to
    ``own.reader_process``."""
    assert reader.stdin is not None
    assert reader.stdout is not None
    if not reader.stdin.closed:  # never told a URL (the run ended before it served): it exits on the empty line
        reader.stdin.close()
    out = reader.stdout.read()  # to its end: the reader prints its figures once it has read ``end``, and exits
    reader.wait(timeout=30)
    got = orjson.loads(out)
    own.reader_process += got.pop("cpu")
    for name, value in got.items():
        setattr(stream, name, getattr(stream, name) + value)


def _reader_main() -> None:
    """``--read-events``: say ``ready`` once imported, read the stream at the URL then given on stdin in this
    process, and print what it carried (and this process's CPU)."""
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    url = sys.stdin.readline().strip()
    if url == "decoy":
        _decoy()
        return
    stream = Stream()
    cpu0 = _cpu()  # after the imports: their start-up is not the reading's
    asyncio.run(_read_events(url, stream, OwnTime()))
    sys.stdout.buffer.write(orjson.dumps({**stream.__dict__, "cpu": _cpu() - cpu0}))


def _decoy(per_wake_s: float = 0.0004, period_s: float = 0.25) -> None:
    """``--decoy``: the reader's footprint without a stream — wakes at the flush rate and spends about what the
    reader spends on a delta (0.06-0.07 s of CPU a run of ~150 flushes), on the core the reader would use, until it
    is killed. For the runs without the dashboard: the reader's process then weighs on the simulator's core in both
    arms, and what is left of the difference is the client's own."""
    while True:
        time.sleep(period_s)
        until = time.process_time() + per_wake_s
        while time.process_time() < until:
            pass


async def _lag_probe(lags: list[float], period: float = 0.05) -> None:
    """How late the event loop wakes a sleep: the run itself (1,000 agents' streams) can starve it."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period)
        lags.append(loop.time() - t - period)


async def _run(
    opts: FleetApp, stream: Stream | None, lags: list[float], own: OwnTime, reader: subprocess.Popen[bytes] | None
) -> FleetResult:
    tasks = [asyncio.ensure_future(_lag_probe(lags))]
    if stream is not None:
        tasks.append(asyncio.ensure_future(_read_stream(opts, stream, own, reader)))
    try:
        return await opts.run()
    finally:
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)
        if stream is not None:
            await asyncio.wait_for(tasks[1], 10)


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (sorted here), 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def bootstrap_interval(values: list[float]) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of ``values`` (seeded, so a rerun on the same figures prints the
    same)."""
    draws = np.random.default_rng(0).choice(np.asarray(values), size=(10_000, len(values)), replace=True)
    low, high = np.percentile(draws.mean(axis=1), [2.5, 97.5])
    return float(low), float(high)


def _share_line(shares: list[float], limit: float = 0.05) -> str:
    """The client CPU the dashboard adds, over the blocks' paired figures: mean, 95 % interval, against ``limit``."""
    per_block = ", ".join(f"{x:+.1%}" for x in shares)
    mean = statistics.fmean(shares)
    if len(shares) < 3:
        return f"client CPU added by the dashboard: {mean:+.1%} (blocks: {per_block}); too few blocks for an interval"
    low, high = bootstrap_interval(shares)
    verdict = "shown" if high <= limit else "not shown"
    # The median beside the mean: one block whose run the machine slowed (a run at +35 % of its neighbours, its
    # dashboard's own share unchanged) moves the mean by several points and the median by little.
    return (f"client CPU added by the dashboard: mean {mean:+.1%}, 95 % interval {low:+.1%} to {high:+.1%} over "
            f"{len(shares)} blocks ({per_block}; median {statistics.median(shares):+.1%}); ≤ {limit:.0%}: "
            f"{verdict}")  # fmt: skip


def _browser_pass(opts: FleetApp) -> dict[str, Any] | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    chromium = Path("/usr/bin/chromium")
    if not chromium.is_file():
        return None
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]  # fmt: skip
    result: dict[str, Any] = {}
    run = threading.Thread(target=lambda: result.update(run=asyncio.run(opts.run())), daemon=True)
    run.start()
    while opts.dashboard_url is None:
        time.sleep(0.01)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=args, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.add_init_script(PROBE)
        page.goto(opts.dashboard_url)
        page.wait_for_selector(".card", timeout=30_000)
        t0 = time.monotonic()
        d0, c0 = page.evaluate("[window.__deltas, window.__changed]")
        page.evaluate("window.__frames = []; window.__longtasks = []")
        run.join()
        span = time.monotonic() - t0
        deltas, changed = page.evaluate("[window.__deltas, window.__changed]")
        deltas, changed = deltas - d0, changed - c0
        frames: list[float] = page.evaluate("window.__frames")
        longtasks: list[float] = page.evaluate("window.__longtasks")
        cards = page.locator(".card").count()
        browser.close()
    frames.sort()
    result.update(
        deltas_per_s=deltas / span if span > 0 else 0.0,
        changed_per_s=changed / span if span > 0 else 0.0,
        cards=cards,
        frame_p50=statistics.median(frames) if frames else None,
        frame_p95=frames[int(0.95 * (len(frames) - 1))] if frames else None,
        frame_max=frames[-1] if frames else None,
        long_frames=sum(1 for f in frames if f > 50),
        long_tasks=len(longtasks),
        long_task_max=max(longtasks, default=0.0),
        frames=len(frames),
    )
    return result


def _switches() -> tuple[int, int, int]:
    """This process's context switches so far: voluntary (it waited: the event loop slept) and involuntary; and its
    minor page faults (memory the allocator gave back to the kernel and took again faults in page by page)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw, r.ru_nivcsw, r.ru_minflt


def _timed_run(
    opts: FleetApp,
    stream: Stream | None,
    lags: list[float],
    own: OwnTime,
    reader: subprocess.Popen[bytes] | None,
    switches: list[tuple[int, int, int]] | None = None,
) -> tuple[FleetResult, float, float]:
    """One run of the fleet: its result, this process's CPU and the wall seconds it took; ``reader`` stopped after.
    ``switches`` gets the run's context switches (voluntary, involuntary) and minor page faults."""
    c0, w0, s0 = _cpu(), time.monotonic(), _switches()
    try:
        r = asyncio.run(_run(opts, stream, lags, own, reader))
        used, took, s1 = _cpu() - c0, time.monotonic() - w0, _switches()
        if reader is not None and stream is not None:
            _reader_result(reader, stream, own)  # after the run's figures: waiting for the reader is not the run's
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
    if switches is not None:
        switches.append((s1[0] - s0[0], s1[1] - s0[1], s1[2] - s0[2]))
    return r, used, took


def _own_time_run(args: argparse.Namespace, opts: FleetApp, stream: Stream, own: OwnTime) -> None:
    """One more run with the dashboard, its own code timed in place (``OwnTime``: the timers are installed now, for
    good, so no run of the blocks before pays for them); with ``--change-ages`` also how long each change waited."""
    own.install(ages=args.change_ages)
    s0, f0, r0, x0 = own.state, own.flushes, own.reader, own.writes
    reader = None if args.reader_in_process else _start_reader(off_core=not args.reader_on_client_core)
    _, used, _ = _timed_run(opts, stream, [], own, reader)
    state, flushes, writes, parsing = own.state - s0, own.flushes - f0, own.writes - x0, own.reader - r0
    print(f"  the dashboard's own CPU, timed in place in one more run with it: {state - flushes:.3f} s its hooks, "
          f"{flushes:.3f} s its flushes, {writes:.3f} s writing the stream"
          + (f", {parsing:.3f} s the stream reader's parsing" if args.reader_in_process else "")
          + f" = {(state + writes + parsing) / used:.2%} of that run's {used:.2f} s of client CPU")  # fmt: skip


def _child_main(args: argparse.Namespace) -> None:
    """``--child with|without`` (``--side-by-side``): one run of the fleet, started when the parent writes ``go``;
    prints this process's client CPU for the run and what the stream carried."""
    dashboard = args.child == "with"
    own = OwnTime()  # not installed: its timers would weigh on the arm with the dashboard alone
    if args.flush_scale != 1.0:
        _scale_flushes(args.flush_scale)
    opts = _opts(args.fleet, args.out, args.url, args.width, dashboard=dashboard, rate=args.rate)
    reader = _start_reader(off_core=not args.reader_on_client_core) if dashboard else None
    stream = Stream() if dashboard else None
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the parent did not say go")
    r, used, took = _timed_run(opts, stream, [], own, reader)
    result = {"cpu": used, "wall": took, "turns": r.totals.turns, "done": r.totals.done,
              "failure": None if r.server_failure is None else str(r.server_failure),
              "changed": stream.changed if stream is not None else 0,
              "sent": stream.changed + stream.other + stream.empty if stream is not None else 0,
              "kib": stream.bytes / 1024 if stream is not None else 0.0}  # fmt: skip
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    sys.stdout.buffer.flush()
    if args.counted:
        sys.stdin.readline()  # the parent stops counting first: the interpreter's exit is not the run's


def _scale_flushes(scale: float) -> None:
    """Stretch the dashboard's flush schedule by ``scale`` (``--callgrind``: a run under valgrind is that much slower,
    so the same run's page gets about as many flushes as at full speed, each carrying as much)."""
    init = Flusher.__init__

    def scaled(flusher: Flusher, state: LiveState, interval_s: float, **kw: Any) -> None:
        init(flusher, state, interval_s * scale, **kw)

    setattr(Flusher, "__init__", scaled)  # noqa: B010  (patched for the benchmark's child process)


def _side_by_side(args: argparse.Namespace, fleet: Path, tmp: Path, url: str, width: int) -> None:
    """``--side-by-side``: per block, the run without the dashboard and the run with it at the same time, each in a
    process of its own on the client's core (both inherit this process's affinity), against the one simulator.
    Run one after the other, two identical runs differ by up to 15 % in client CPU as the shared machine drifts;
    side by side, both runs meet the same drift, the same simulator pace and each other. Which is started first
    alternates by block. Each block gives one paired figure, (with − without) ÷ without. With ``--null`` neither
    run has the dashboard: the figure is then what the design alone reads, which should be near 0."""
    shares: list[float] = []
    base: list[float] = []
    print(f"{args.agents} agents × {args.rounds} rounds ({width} at once) in each of two client processes side by "
          f"side, think {args.think:g} s, simulator step {args.step:g} s, {args.blocks} block(s)"
          + (" — the A/A check: neither run has the dashboard" if args.null else ""))  # fmt: skip
    for block in range(args.blocks):
        arms = ("without", "with") if block % 2 == 0 else ("with", "without")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for arm in arms:
                child = "without" if args.null else arm
                cmd = [sys.executable, __file__, "--child", child, "--url", url, "--fleet", str(fleet),
                       "--out", str(tmp / f"runs-{block}-{arm}"), "--width", str(width),
                       *(["--rate", repr(args.rate)] if args.rate is not None else [])]  # fmt: skip
                if args.reader_on_client_core:
                    cmd.append("--reader-on-client-core")
                procs[arm] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for arm, proc in procs.items():  # both imported and set up before either run starts
                assert proc.stdout is not None
                if proc.stdout.readline() != b"ready\n":
                    raise SystemExit(f"the run {arm} the dashboard did not start")
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
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
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
    print("  " + _share_line(shares))
    print(f"  without the dashboard, client CPU {min(base):.2f} to {max(base):.2f} s a run")


_CYCLES = "Ir + 10 × L1 misses + 100 × LL misses"  # KCachegrind's cycle estimate, from callgrind's counts
_MISPREDICT_CYCLES = 15  # a mispredicted branch on a recent x86 core: the pipeline refilled (15-20 cycles)


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
        return self.cycles + _MISPREDICT_CYCLES * (self.mispredicts or 0)


def _counted_run(
    args: argparse.Namespace, arm: str, fleet: Path, out: Path, url: str, width: int, scale: float, valgrind: bool
) -> Counted | dict[str, Any]:
    """One arm's run in a child process: under callgrind (counts only from ``go`` to the result line), or plain
    (its result only: the wall time the flush schedule is scaled to)."""
    counts = out.with_suffix(".callgrind")
    cmd = [sys.executable, __file__, "--child", arm, "--url", url, "--fleet", str(fleet), "--out", str(out),
           "--width", str(width), "--flush-scale", repr(scale), "--counted",
           *(["--rate", repr(args.rate)] if args.rate is not None else [])]  # fmt: skip
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
        if proc.stdout.readline() != b"ready\n":
            raise SystemExit(f"the run {arm} the dashboard did not start")
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
    if not valgrind:
        return result
    names: list[str] = []
    totals: list[int] = []
    for text in counts.read_text().splitlines():
        if text.startswith("events:"):
            names = text.split()[1:]
        elif text.startswith("totals:"):
            totals = [int(v) for v in text.split()[1:]]
    got = dict(zip(names, totals, strict=True))
    return Counted(
        instructions=got["Ir"],
        l1_misses=got["I1mr"] + got["D1mr"] + got["D1mw"],
        ll_misses=got["ILmr"] + got["DLmr"] + got["DLmw"],
        wall=wall,
        result=result,
        mispredicts=got["Bcm"] + got["Bim"] if "Bcm" in got else None,
    )


def _callgrind(args: argparse.Namespace, fleet: Path, tmp: Path, url: str, width: int) -> None:
    """``--callgrind``: each arm's client in a process of its own under valgrind's callgrind, counting the run's
    instructions and its simulated L1 / last-level cache misses (what a hardware counter would give, which this
    machine's VM does not expose): the same run gives the same counts within a fraction of a percent whatever the
    machine does meanwhile, where two timed runs differ by up to 15 %.

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
    print(f"{args.agents} agents × {args.rounds} rounds ({width} at once), think {args.think:g} s, simulator step "
          f"{args.step:g} s; each arm counted under callgrind (last-level cache: {ll}), {args.blocks} block(s) of two "
          "runs")  # fmt: skip
    plain = _counted_run(args, "with", fleet, tmp / "plain", url, width, 1.0, valgrind=False)
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
            for attempt in range(3):
                out = tmp / f"runs-{block}-{arm}-{attempt}"
                run = _counted_run(args, arm, fleet, out, url, width, scale, valgrind=True)
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
            got[arm] = run
            if args.keep_counts is not None:  # for callgrind_annotate: where, by function, the counts differ
                args.keep_counts.mkdir(parents=True, exist_ok=True)
                shutil.copy(out.with_suffix(".callgrind"), args.keep_counts / f"block{block + 1}-{arm}.callgrind")
            if arm == "without":
                walls.append(run.wall)
            extra = ""
            if arm == "with":
                extra = (f"; flushes stretched {scale:.0f}×: {r['sent']} flushes, {r['changed']} with changes "
                         f"({r['kib'] / max(1, r['changed']):.1f} KiB each)")  # fmt: skip
            branches = "" if run.mispredicts is None else f", {run.mispredicts / 1e6:.1f} M mispredicted branches"
            print(f"  block {block + 1}, {arm} the dashboard: {run.instructions / 1e9:.2f} G instructions, "
                  f"{run.l1_misses / 1e6:.1f} M L1 misses, {run.ll_misses / 1e6:.2f} M LL misses{branches}, "
                  f"{run.wall:.0f} s wall under callgrind, {r['turns']} turns{extra}")  # fmt: skip
        w, wo = got["with"], got["without"]
        for name, a, b in (("instructions", w.instructions, wo.instructions), ("L1 misses", w.l1_misses,
                           wo.l1_misses), ("LL misses", w.ll_misses, wo.ll_misses),
                           ("cycle estimate", w.cycles, wo.cycles)):  # fmt: skip
            shares[name].append((a - b) / b)
        if w.mispredicts is not None and wo.mispredicts is not None:
            shares["mispredicted branches"].append((w.mispredicts - wo.mispredicts) / wo.mispredicts)
            shares["cycle estimate with branches"].append((w.cycles_with_branches - wo.cycles_with_branches)
                                                          / wo.cycles_with_branches)  # fmt: skip
    for name, values in shares.items():
        labels = {"cycle estimate": f"{name} ({_CYCLES})",
                  "cycle estimate with branches": f"{name} (+ {_MISPREDICT_CYCLES} × mispredicts)"}  # fmt: skip
        label = labels.get(name, name)
        print(f"  added by the dashboard, {label}: " + ", ".join(f"{v:+.2%}" for v in values)
              + f" (mean {statistics.fmean(values):+.2%})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--think", type=float, default=2.0)
    ap.add_argument("--width", type=int, default=None, help="agents live at once (default: all)")
    ap.add_argument("--step", type=float, default=0.02, help="the simulator's step time, s")
    ap.add_argument("--blocks", type=int, default=1, help="blocks of four runs (without, with, with, without)")
    ap.add_argument(
        "--rate", type=float, default=None, metavar="HZ",
        help="the page's updates a second (agentload run --dashboard-rate; default: the dashboard's, 4)",
    )  # fmt: skip
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument(
        "--reader-in-process",
        action="store_true",
        help="read the event stream in the client's process (its parsing and socket count as the client's CPU), "
        "not in a process of its own as a browser would",
    )
    ap.add_argument(
        "--reader-on-client-core",
        action="store_true",
        help="leave the reader's process on the client's core (by default it runs on the machine's other cores, "
        "where a browser would: sharing the client's core costs the client CPU the dashboard does not spend)",
    )
    ap.add_argument(
        "--change-ages",
        action="store_true",
        help="also measure how long each change waits to reach the stream (a wrapper on every change: in the extra "
        "run that times the dashboard's code in place, never in the blocks' runs)",
    )
    ap.add_argument(
        "--loop-profile",
        action="store_true",
        help="in turn: also time each callback the event loop runs, and print each run's CPU by what it ran (the "
        "agents' work, the dashboard's tasks, the socket reads): which work differs between the arms",
    )
    ap.add_argument(
        "--no-page",
        action="store_true",
        help="in turn: the runs with the dashboard serve it with no page open (no stream, so no flushes): what its "
        "hooks and its presence cost the client without the page's updates",
    )
    ap.add_argument("--read-events", action="store_true", help=argparse.SUPPRESS)  # the reader's own process
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="each block runs the two arms at the same time, in two processes on the client's core against the same "
        "simulator (the machine's drift falls on both alike), instead of one after the other in this process",
    )
    ap.add_argument(
        "--null",
        action="store_true",
        help="with --side-by-side: the run 'with' has no dashboard either, so the figure shows what the design alone "
        "reads (an A/A check: it should be near 0)",
    )
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="count each arm's instructions and simulated cache misses under valgrind's callgrind, in a process of "
        "its own, instead of timing CPU: counts do not drift with the machine (each run takes minutes)",
    )
    ap.add_argument(
        "--decoy",
        action="store_true",
        help="in turn: each run without the dashboard gets a process where the page's reader would be (the other "
        "core), waking at the flush rate and spending the reader's CPU, so that only the client's own cost differs",
    )
    ap.add_argument(
        "--last-level",
        metavar="BYTES",
        type=int,
        default=None,
        help="with --callgrind: the simulated last-level cache's size (8-way, 64-byte lines; default: valgrind's, the "
        "machine's L3): the size of one core's L2 counts the misses that leave the core, where a lone client's "
        "working set and the dashboard's compete",
    )
    ap.add_argument(
        "--branch-sim",
        action="store_true",
        help=f"with --callgrind: simulate the branch predictor too, and count mispredicted branches (at "
        f"{_MISPREDICT_CYCLES} cycles each in a second cycle estimate): whether the dashboard's code, interleaved "
        "with the client's, costs the interpreter's dispatch its predictions",
    )
    ap.add_argument(
        "--keep-counts",
        metavar="DIR",
        type=Path,
        default=None,
        help="with --callgrind: keep each counted run's callgrind file in DIR (callgrind_annotate reads them)",
    )
    ap.add_argument("--child", choices=("with", "without"), help=argparse.SUPPRESS)  # one arm of --side-by-side
    ap.add_argument("--flush-scale", type=float, default=1.0, help=argparse.SUPPRESS)  # a child's flush schedule
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # a child under callgrind
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--fleet", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument(
        "--default-gc",
        action="store_true",
        help="leave the cyclic collector as Python sets it (not load.collector's settings): the before",
    )
    args = ap.parse_args()
    if args.read_events:
        _reader_main()
        return
    if args.child:
        _child_main(args)
        return
    if args.callgrind and (args.side_by_side or args.default_gc or args.reader_in_process):
        ap.error("--callgrind runs neither --side-by-side, --default-gc nor --reader-in-process")
    if args.no_page and (args.callgrind or args.side_by_side or args.null or args.decoy or args.reader_in_process
                         or args.change_ages):  # fmt: skip
        ap.error("--no-page is for the arms in turn, with the dashboard, no reader and no --change-ages")
    if args.loop_profile and (args.callgrind or args.side_by_side):
        ap.error("--loop-profile is for the arms in turn (this process runs them)")
    if args.decoy and (args.callgrind or args.side_by_side or args.reader_in_process):
        ap.error("--decoy is for the arms in turn with the reader in a process of its own")
    if args.null and (args.callgrind or args.default_gc or args.reader_in_process):
        ap.error("--null is a check of the timed designs (in turn or --side-by-side)")
    if args.side_by_side and (args.default_gc or args.reader_in_process):
        ap.error("--side-by-side runs neither --default-gc nor --reader-in-process")
    if args.blocks < 1:
        ap.error("--blocks must be at least 1")
    if args.rate is not None and not MIN_DASHBOARD_RATE <= args.rate <= MAX_DASHBOARD_RATE:
        ap.error(f"--rate is the page's updates a second, {MIN_DASHBOARD_RATE:g} to {MAX_DASHBOARD_RATE:g}")
    if (args.branch_sim or args.keep_counts is not None) and not args.callgrind:
        ap.error("--branch-sim and --keep-counts are options of --callgrind")
    if args.last_level is not None and (not args.callgrind or args.last_level < 65536 or args.last_level & 4095):
        ap.error("--last-level is a size in bytes for --callgrind's cache (at least 64 KiB, a multiple of 4 KiB)")
    if args.default_gc:
        setattr(runner, "collector_for_load", contextlib.nullcontext)  # noqa: B010  (patched for the run: the "before")
    width = args.width or args.agents
    with tempfile.TemporaryDirectory() as tmp, sim_process(fast_profile(args.step)) as (_, host, port):
        fleet = Path(tmp) / "fleet.toml"
        fleet.write_text(FLEET.format(agents=args.agents, rounds=args.rounds, think=args.think))
        url = f"http://{host}:{port}"
        out = Path(tmp) / "runs"
        if args.side_by_side:
            _side_by_side(args, fleet, Path(tmp), url, width)
            return
        if args.callgrind:
            _callgrind(args, fleet, Path(tmp), url, width)
            return

        # In the order A B B A: drift of a shared machine (or of the server's warm cache) falls on both sides.
        cpu = {False: 0.0, True: 0.0}
        wall = {False: 0.0, True: 0.0}
        results: dict[bool, FleetResult] = {}
        stream = Stream()
        lags: dict[bool, list[float]] = {False: [], True: []}
        # per run: context switches (voluntary, involuntary), minor page faults
        switches: dict[bool, list[tuple[int, int, int]]] = {False: [], True: []}
        shares: list[float] = []  # one paired figure per block: (with − without) ÷ without, client CPU
        # The blocks run without the in-place timers: a timer wraps each of ~20,000 hook calls a run (0.5 µs each
        # here, ~0.4 % of the client's CPU) and would weigh on the "with" arm alone. One more run after the blocks
        # times the dashboard's own code in place.
        own_total = OwnTime()
        profile = LoopProfile() if args.loop_profile else None
        if profile is not None:
            profile.install()
        collector = {False: GcTime(), True: GcTime()}
        print(f"{args.agents} agents × {args.rounds} rounds ({width} at once), think {args.think:g} s, "
              f"simulator step {args.step:g} s, {args.blocks} block(s) of four runs"
              + (" — the A/A check: no run has the dashboard (runs 2 and 3 of each block stand for it)" if args.null
                 else ""))  # fmt: skip
        for block in range(args.blocks):
            used_in = {False: 0.0, True: 0.0}
            for dashboard in (False, True, True, False):
                opts = _opts(fleet, out, url, width, dashboard=dashboard and not args.null, rate=args.rate)
                reader = None
                if dashboard and not args.reader_in_process and not args.null and not args.no_page:
                    reader = _start_reader(off_core=not args.reader_on_client_core)
                elif args.decoy:
                    reader = _start_reader(off_core=not args.reader_on_client_core)
                    assert reader.stdin is not None
                    reader.stdin.write(b"decoy\n")
                    reader.stdin.flush()
                gc.callbacks.append(collector[dashboard])
                if profile is not None:
                    profile.start(dashboard and not args.null)
                try:
                    r, used, took = _timed_run(
                        opts,
                        stream if dashboard and not args.null and not args.no_page else None,
                        lags[dashboard],
                        own_total,
                        reader,
                        switches[dashboard],
                    )
                finally:
                    gc.callbacks.remove(collector[dashboard])
                    if profile is not None:
                        profile.stop()
                results[dashboard] = r
                used_in[dashboard] += used
                cpu[dashboard] += used
                wall[dashboard] += took
                arm = (
                    ("B (the A/A check: no dashboard)" if args.null else "with the dashboard")
                    if dashboard
                    else ("A (no dashboard)" if args.null else "without the dashboard")
                )
                waits, preempted, faults = switches[dashboard][-1]
                print(
                    f"  block {block + 1}, run {arm}: {r.totals.turns} turns, {took:.1f} s wall, {used:.2f} s client "
                    f"CPU; the loop slept {waits:,} times, was preempted {preempted:,}; {faults:,} page faults"
                )
            shares.append((used_in[True] - used_in[False]) / used_in[False])
        base, dash = results[False], results[True]
        runs = 2 * args.blocks
        base_cpu, dash_cpu, base_wall, dash_wall = (cpu[False] / runs, cpu[True] / runs, wall[False] / runs,
                                                    wall[True] / runs)  # fmt: skip

        for name, r in (("without", base), ("with", dash)):
            if r.server_failure is not None or r.totals.done != args.agents:
                print(f"  warning: the run {name} the dashboard did not finish cleanly: {r.totals.done} agents done; "
                      f"server failure: {r.server_failure}")  # fmt: skip
        print(f"  without dashboard (mean of {runs}): {base.totals.turns} turns, {base_wall:.1f} s wall, "
              f"{base_cpu:.2f} s client CPU")  # fmt: skip
        where = (
            "in this process"
            if args.reader_in_process
            else "in its own process"
            + (" on the client's core" if args.reader_on_client_core else ", off the client's core")
        )
        if args.null:
            where += " — in this A/A check, runs 2 and 3 of each block, with no dashboard"
        if args.no_page:
            where = "— none here (--no-page): the dashboard serving with no page open"
        print(f"  with dashboard + 1 stream reader {where} (mean of {runs}): {dash.totals.turns} turns, "
              f"{dash_wall:.1f} s wall, {dash_cpu:.2f} s client CPU "
              f"({(dash_cpu - base_cpu) / base_cpu:+.1%} vs without)")  # fmt: skip
        print("  " + _share_line(shares))
        # Said where the figure is read: the same stream with no agentload code read +9.3 % and −2.7 % in two runs of
        # this design here (docs/dashboard.md, 6 December 2026, night), so its interval does not settle 5 %.
        print("  (runs in turn on a machine whose runs drift cannot resolve 5 %: --side-by-side and --callgrind can; "
              "benchmarks/bench_stream_cost.py shows a bare stream's spread)")  # fmt: skip
        if profile is not None:
            profile.report()
        if not args.reader_in_process:
            print(f"  the stream reader's own process (a browser's share, not the client's): "
                  f"{own_total.reader_process / runs:.3f} s CPU a run")  # fmt: skip
        if not args.null and not args.no_page:
            _own_time_run(args, _opts(fleet, out, url, width, dashboard=True, rate=args.rate), stream, own_total)
        for dashboard in (False, True):
            g = collector[dashboard]
            print(f"  cyclic collector {'with' if dashboard else 'without'} the dashboard "
                  f"({'as Python sets it' if args.default_gc else 'load.collector'}): {g.cpu / runs:.3f} s a run = "
                  f"{g.cpu / cpu[dashboard]:.1%} of its client CPU, {g.passes / runs:.0f} passes a run "
                  f"({g.full / runs:.1f} over the oldest generation)")  # fmt: skip
        st = stream
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
                  f"with the server's sample only, {st.empty} with nothing to send; gap between flushes p50 "
                  f"{_pct(st.flush_gaps, 0.5) * 1000:.0f} ms, p95 {_pct(st.flush_gaps, 0.95) * 1000:.0f} ms, max "
                  f"{_pct(st.flush_gaps, 1) * 1000:.0f} ms")  # fmt: skip
        if ages := own_total.ages:
            print(f"  every change reached the stream within: p50 {_pct(ages, 0.5) * 1000:.0f} ms, p99 "
                  f"{_pct(ages, 0.99) * 1000:.0f} ms, max {_pct(ages, 1) * 1000:.0f} ms of being made "
                  f"({len(ages)} deltas; the schedule's bound: 1.3 periods, {1300 / rate:.0f} ms)")  # fmt: skip
        if gaps := st.changed_gaps:
            print(f"  between deltas that carried changes: p50 {_pct(gaps, 0.5) * 1000:.0f} ms, p95 "
                  f"{_pct(gaps, 0.95) * 1000:.0f} ms, max {_pct(gaps, 1) * 1000:.0f} ms")  # fmt: skip
        for dashboard in (False, True):
            sw = switches[dashboard]
            print(f"  context switches a run {'with' if dashboard else 'without'} the dashboard: the loop slept "
                  f"{statistics.fmean(s[0] for s in sw):,.0f} times (it waited for the network), was preempted "
                  f"{statistics.fmean(s[1] for s in sw):,.0f}, faulted {statistics.fmean(s[2] for s in sw):,.0f} pages "
                  f"in (mean of {len(sw)} runs)")  # fmt: skip
        for dashboard in (False, True):
            lag = lags[dashboard]
            print(f"  event loop lateness {'with' if dashboard else 'without'} the dashboard (a 50 ms sleep): p50 "
                  f"{_pct(lag, 0.5) * 1000:.1f} ms, p95 {_pct(lag, 0.95) * 1000:.1f} ms, "
                  f"max {_pct(lag, 1) * 1000:.0f} ms")  # fmt: skip
        if args.no_browser:
            return
        browsed = _browser_pass(_opts(fleet, out, url, width, dashboard=True, rate=args.rate))
        if browsed is None:
            print("  browser: skipped (no /usr/bin/chromium or no playwright)")
            return
        frames = (
            f"frame time p50 {browsed['frame_p50']:.1f} ms, p95 {browsed['frame_p95']:.1f} ms, max "
            f"{browsed['frame_max']:.1f} ms, {browsed['long_frames']} of {browsed['frames']} frames over 50 ms; "
            f"{browsed['long_tasks']} long tasks of the page's (over 50 ms; longest {browsed['long_task_max']:.0f} ms)"
            if browsed["frames"]
            else "no frame drawn while the run went on (a starved browser draws none)"
        )
        print(f"  browser: {browsed['cards']} cards, {browsed['changed_per_s']:.2f} deltas a second with agents' "
              f"changes received ({browsed['deltas_per_s']:.2f} with any); {frames}")  # fmt: skip


if __name__ == "__main__":
    main()
