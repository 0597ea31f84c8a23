"""The page's stand-in for ``bench_dashboard.py``: a reader of the dashboard's event stream, in the client's process or,
as a browser is, in a process of its own (``bench_dashboard.py --read-events``), counting what the stream carried;
and its decoy, the reader's footprint without a stream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from agentload.fleet.app import FleetApp
from dashbench_probes import OwnTime, process_cpu

# The script every helper process runs (the reader, an arm's child): the entry, so that a child imports what a run
# in the parent imports (all of agentload), whatever module starts it.
ENTRY = Path(__file__).resolve().with_name("bench_dashboard.py")


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


async def read_events(url: str, stream: Stream, own: OwnTime) -> None:
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


def off_client_core(pid: int) -> None:
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


def start_reader(off_core: bool) -> subprocess.Popen[bytes]:
    """The page's stand-in in a process of its own, started before the run and waiting for the dashboard's URL: a
    browser's page is open before the run it shows, so its start-up (the reader runs the entry script, hence imports all
    of agentload: a second or more of CPU) must not fall inside the run, where it would compete for the other core
    with the simulator."""
    proc = subprocess.Popen(
        [sys.executable, str(ENTRY), "--read-events"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    if off_core:
        off_client_core(proc.pid)
    assert proc.stdout is not None
    if proc.stdout.readline() != b"ready\n":  # its imports are done: it waits for the URL
        proc.kill()
        raise SystemExit("the event-stream reader did not start")
    return proc


async def read_stream(opts: FleetApp, stream: Stream, own: OwnTime, reader: subprocess.Popen[bytes] | None) -> None:
    """The page's stand-in: reads the run's event stream in this process (no ``reader``: its parsing counts as the
    client's CPU) or, as a browser would, in the process ``reader`` (``start_reader``), told the URL here and read
    after the run (``reader_result``)."""
    while opts.dashboard_url is None:  # noqa: ASYNC110  (run_fleet sets it; there is no event to wait on)
        await asyncio.sleep(0.01)
    if reader is None:
        await read_events(opts.dashboard_url, stream, own)
        return
    # The URL (its token) goes on the reader's stdin, not its command line, which any local user can list: one line
    # to a pipe, which does not block. Its answer is read once the run is over, in this thread: a thread waiting for
    # it through the run (``asyncio.to_thread``, until 6 December 2026) was in the client's process in the arm with
    # the dashboard only.
    assert reader.stdin is not None
    reader.stdin.write(opts.dashboard_url.encode() + b"\n")
    reader.stdin.close()


def reader_result(reader: subprocess.Popen[bytes], stream: Stream, own: OwnTime) -> None:
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


def reader_main() -> None:
    """``--read-events``: say ``ready`` once imported, read the stream at the URL then given on stdin in this
    process, and print what it carried (and this process's CPU)."""
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    url = sys.stdin.readline().strip()
    if url == "decoy":
        decoy()
        return
    stream = Stream()
    cpu0 = process_cpu()  # after the imports: their start-up is not the reading's
    asyncio.run(read_events(url, stream, OwnTime()))
    sys.stdout.buffer.write(orjson.dumps({**stream.__dict__, "cpu": process_cpu() - cpu0}))


def decoy(per_wake_s: float = 0.0004, period_s: float = 0.25) -> None:
    """``--decoy``: the reader's footprint without a stream — wakes at the flush rate and spends about what the
    reader spends on a delta (0.06-0.07 s of CPU a run of ~150 flushes), on the core the reader would use, until it
    is killed. For the runs without the dashboard: the reader's process then weighs on the simulator's core in both
    arms, and what is left of the difference is the client's own."""
    while True:
        time.sleep(period_s)
        until = time.process_time() + per_wake_s
        while time.process_time() < until:
            pass
