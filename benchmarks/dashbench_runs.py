"""One run of ``bench_dashboard.py``'s fleet against the simulator, timed: the fleet file, its options, the event
loop's lateness probe, the page's stand-in beside it; and an arm's run in a child process of its own
(``--child``, for ``--side-by-side`` and ``--callgrind``)."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from agentload.dashboard import open_board
from agentload.dashboard.server import dashboard_interval
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult
from dashbench_probes import OwnTime, process_cpu, scale_flushes, switches
from dashbench_reader import ENTRY, Stream, read_stream, reader_result, start_reader


@dataclass(frozen=True)
class Target:
    """Where each run goes: the fleet file, the temporary folder the run stores go in, the simulator's URL, the agents
    at once."""

    fleet: Path
    folder: Path
    url: str
    width: int

    @property
    def runs(self) -> Path:
        """The run store of the runs in this process (each child of ``--side-by-side`` and ``--callgrind`` has its own
        in ``folder``)."""
        return self.folder / "runs"

    def app(self, *, dashboard: bool, rate: float | None) -> FleetApp:
        """A run in this process, with the dashboard or without, into ``runs``."""
        return fleet_app(self.fleet, self.runs, self.url, self.width, dashboard=dashboard, rate=rate)


# The fleet every run drives: ``--agents`` one-task agents, ``--rounds`` tool-calling turns, ``--think`` s between.
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


def fleet_app(fleet: Path, out: Path, url: str, width: int, dashboard: bool, rate: float | None = None) -> FleetApp:
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


async def lag_probe(lags: list[float], period: float = 0.05) -> None:
    """How late the event loop wakes a sleep: the run itself (1,000 agents' streams) can starve it."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period)
        lags.append(loop.time() - t - period)


async def _run(
    opts: FleetApp, stream: Stream | None, lags: list[float], own: OwnTime, reader: subprocess.Popen[bytes] | None
) -> FleetResult:
    tasks = [asyncio.ensure_future(lag_probe(lags))]
    if stream is not None:
        tasks.append(asyncio.ensure_future(read_stream(opts, stream, own, reader)))
    try:
        return await opts.run()
    finally:
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)
        if stream is not None:
            await asyncio.wait_for(tasks[1], 10)


def timed_run(
    opts: FleetApp,
    stream: Stream | None,
    lags: list[float],
    own: OwnTime,
    reader: subprocess.Popen[bytes] | None,
    counts: list[tuple[int, int, int]] | None = None,
) -> tuple[FleetResult, float, float]:
    """One run of the fleet: its result, this process's CPU and the wall seconds it took; ``reader`` stopped after.
    ``counts`` gets the run's context switches (voluntary, involuntary) and minor page faults."""
    c0, w0, s0 = process_cpu(), time.monotonic(), switches()
    try:
        r = asyncio.run(_run(opts, stream, lags, own, reader))
        used, took, s1 = process_cpu() - c0, time.monotonic() - w0, switches()
        if reader is not None and stream is not None:
            reader_result(reader, stream, own)  # after the run's figures: waiting for the reader is not the run's
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
    if counts is not None:
        counts.append((s1[0] - s0[0], s1[1] - s0[1], s1[2] - s0[2]))
    return r, used, took


def child_main(args: argparse.Namespace) -> None:
    """``--child with|without`` (``--side-by-side``): one run of the fleet, started when the parent writes ``go``;
    prints this process's client CPU for the run and what the stream carried."""
    dashboard = args.child == "with"
    own = OwnTime()  # not installed: its timers would weigh on the arm with the dashboard alone
    if args.flush_scale != 1.0:
        scale_flushes(args.flush_scale)
    opts = fleet_app(args.fleet, args.out, args.url, args.width, dashboard=dashboard, rate=args.rate)
    reader = start_reader(off_core=not args.reader_on_client_core) if dashboard else None
    stream = Stream() if dashboard else None
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the parent did not say go")
    r, used, took = timed_run(opts, stream, [], own, reader)
    result = {"cpu": used, "wall": took, "turns": r.totals.turns, "done": r.totals.done,
              "failure": None if r.server_failure is None else str(r.server_failure),
              "changed": stream.changed if stream is not None else 0,
              "sent": stream.changed + stream.other + stream.empty if stream is not None else 0,
              "kib": stream.bytes / 1024 if stream is not None else 0.0}  # fmt: skip
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    sys.stdout.buffer.flush()
    if args.counted:
        sys.stdin.readline()  # the parent stops counting first: the interpreter's exit is not the run's


def child_command(arm: str, url: str, fleet: Path, out: Path, width: int, rate: float | None, *extra: str) -> list[str]:
    """The command line of an arm's run in a child process (``child_main``): ``arm`` is ``with`` or ``without`` the
    dashboard; ``extra``, more of the entry's hidden options."""
    return [sys.executable, str(ENTRY), "--child", arm, "--url", url, "--fleet", str(fleet), "--out", str(out),
            "--width", str(width), *(["--rate", repr(rate)] if rate is not None else []), *extra]  # fmt: skip


def wait_ready(proc: subprocess.Popen[bytes], arm: str) -> None:
    """Wait until the child ``proc`` running the arm ``arm`` has imported and set up its run (it says ``ready``)."""
    assert proc.stdout is not None
    if proc.stdout.readline() != b"ready\n":
        raise SystemExit(f"the run {arm} the dashboard did not start")
