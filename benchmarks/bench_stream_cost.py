"""What a page's event stream costs the client, by what serves it: none, a bare socket, aiohttp, the dashboard.

``bench_dashboard.py`` measures the client CPU the dashboard adds: timed one run after the other on this 2-core VM
it reads about 6 %, where counted (callgrind) it reads 2 % and side by side 1-3 %. This script asks whether that
excess is the dashboard's at all, or any event stream's: the same fleet as ``bench_dashboard.py`` (1,000 agents ×
4 rounds, 300 at once, against the simulator in a process of its own) runs in blocks, each arm twice a block in a
mirrored order (``none raw aiohttp aiohttp raw none``, the next block reversed), so a drifting machine falls on
every arm alike:

* ``none`` — no stream;
* ``raw`` — the client's process serves a bare asyncio socket (``asyncio.start_server``: no aiohttp, no agentload
  code), and writes ``--bytes`` every ``--period`` s to it;
* ``aiohttp`` — the same bytes as server-sent events from an ``aiohttp.web`` handler (a ``StreamResponse``, as the
  dashboard's event stream is), no agentload code;
* ``nagle`` — as ``aiohttp``, with the stream's socket's ``TCP_NODELAY`` off again after aiohttp turns it on;
* ``dashboard`` — ``agentload run --dashboard`` with one page's event-stream reader (``bench_dashboard.py``'s);
* ``dashboard-nagle`` — the same, with the event stream's ``TCP_NODELAY`` off after aiohttp turns it on.

The page's stand-in for ``raw``, ``aiohttp`` and ``nagle`` is a process of its own that connects before the run and
reads with blocking ``recv`` calls, on the machine's other core (as ``bench_dashboard.py`` places its reader). Each
block gives each arm's paired figure against the first arm, (arm − first) ÷ first of the client's CPU (user +
system seconds of this process over the run), and the summary their mean with a 95 % bootstrap interval.

    .venv/bin/python benchmarks/bench_stream_cost.py                          # none, raw, aiohttp; 6 blocks
    .venv/bin/python benchmarks/bench_stream_cost.py --arms none,aiohttp,nagle --blocks 6
    .venv/bin/python benchmarks/bench_stream_cost.py --arms none,dashboard-nagle,dashboard --blocks 6
    .venv/bin/python benchmarks/bench_stream_cost.py --arms none,dashboard --agents 200 --width 100 --blocks 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from agentload.fleet.app import FleetApp
from agentload.fleet.results import FleetResult
from dashbench_probes import OwnTime, process_cpu
from dashbench_reader import Stream, off_client_core, start_reader
from dashbench_runs import FLEET, fleet_app, timed_run
from dashbench_stats import bootstrap_interval
from simproc import fast_profile, sim_process

ARMS = ("none", "raw", "aiohttp", "nagle", "dashboard", "dashboard-nagle")
# The page's stand-in for the bare arms: connects to the port it is told, asks for the stream (the bare socket
# ignores the request), and reads until the server closes; prints bytes and reads. Plain sockets: no asyncio.
_READER = r"""
import socket, sys
sys.stdout.write("ready\n"); sys.stdout.flush()
port = int(sys.stdin.readline())
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
n = k = 0
while True:
    b = s.recv(65536)
    if not b:
        break
    n += len(b); k += 1
print(n, k, flush=True)
"""


def _start_bare_reader() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    off_client_core(proc.pid)
    assert proc.stdout is not None
    if proc.stdout.readline() != "ready\n":
        proc.kill()
        raise SystemExit("the stream reader did not start")
    return proc


async def _ticks(period: float, stop: asyncio.Event) -> AsyncIterator[None]:
    """Every ``period`` s on a fixed schedule (as the dashboard's flusher keeps one) until ``stop``."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    while not stop.is_set():
        due += period
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))
        if not stop.is_set():
            yield


@contextlib.asynccontextmanager
async def _raw_stream(payload: bytes, period: float) -> AsyncIterator[int]:
    """A bare asyncio socket server that writes ``payload`` every ``period`` s to whoever connects; yields its port."""
    stop = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _ in _ticks(period, stop):
            writer.write(payload)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        stop.set()
        server.close()
        await asyncio.sleep(0.01)  # the handler closes its writer


@contextlib.asynccontextmanager
async def _aiohttp_stream(payload: bytes, period: float, nagle: bool) -> AsyncIterator[int]:
    """The same bytes as server-sent events from an aiohttp handler; ``nagle``: the socket's TCP_NODELAY off."""
    stop = asyncio.Event()
    event = b"event: delta\ndata: " + payload + b"\n\n"

    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if nagle and request.transport is not None:
            _no_delay_off(request.transport.get_extra_info("socket"))
        async for _ in _ticks(period, stop):
            await resp.write(event)
        return resp

    app = web.Application()
    app.router.add_get("/events", events)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        stop.set()
        await runner.cleanup()


async def _bare_run(
    opts: FleetApp, arm: str, reader: subprocess.Popen[str], payload: bytes, period: float
) -> FleetResult:
    assert reader.stdin is not None
    serving = _raw_stream(payload, period) if arm == "raw" else _aiohttp_stream(payload, period, arm == "nagle")
    async with serving as port:
        reader.stdin.write(f"{port}\n")
        reader.stdin.flush()
        return await opts.run()


def _no_delay_off(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)


@contextlib.contextmanager
def _nagle_on_event_streams() -> Iterator[None]:
    """For ``dashboard-nagle``: every ``StreamResponse`` prepared meanwhile (the dashboard's event stream is the only
    one in the client's process) gets its socket's ``TCP_NODELAY`` off."""
    prepare = web.StreamResponse.prepare

    async def nagle_prepare(self: web.StreamResponse, request: web.BaseRequest) -> Any:
        writer = await prepare(self, request)
        if request.transport is not None:
            _no_delay_off(request.transport.get_extra_info("socket"))
        return writer

    setattr(web.StreamResponse, "prepare", nagle_prepare)  # noqa: B010  (patched for the one run)
    try:
        yield
    finally:
        setattr(web.StreamResponse, "prepare", prepare)  # noqa: B010


def _one_run(arm: str, opts: FleetApp, payload: bytes, period: float) -> tuple[FleetResult, float, str]:
    """One run of the fleet with ``arm``'s stream: its result, this process's CPU over it, what the reader got."""
    if arm in ("none", "dashboard", "dashboard-nagle"):
        dashboard = arm != "none"
        reader = start_reader(off_core=True) if dashboard else None
        stream = Stream() if dashboard else None
        with _nagle_on_event_streams() if arm == "dashboard-nagle" else contextlib.nullcontext():
            result, used, _ = timed_run(opts, stream, [], OwnTime(), reader)
        got = f"{stream.changed} deltas with changes, {stream.bytes / 1024:.0f} KiB" if stream is not None else ""
        return result, used, got
    bare = _start_bare_reader()
    try:
        c0 = process_cpu()
        result = asyncio.run(_bare_run(opts, arm, bare, payload, period))
        used = process_cpu() - c0
        assert bare.stdout is not None
        nbytes, reads = bare.stdout.read().split()
        bare.wait(timeout=10)
    finally:
        if bare.poll() is None:
            bare.kill()
    return result, used, f"{int(nbytes) / 1024:.0f} KiB in {reads} reads"


def _interval(xs: list[float]) -> str:
    if len(xs) < 3:
        return "too few blocks for an interval"
    low, high = bootstrap_interval(xs)
    return f"95 % interval {low:+.1%} to {high:+.1%}, median {statistics.median(xs):+.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="none,raw,aiohttp", help=f"comma-separated, the first the baseline: {ARMS}")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--width", type=int, default=300)
    ap.add_argument("--bytes", type=int, default=14_000, help="a write's size (the dashboard's deltas: ~14 KiB)")
    ap.add_argument("--period", type=float, default=0.25, help="s between writes (the dashboard's 4 Hz)")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if len(arms) < 2 or len(set(arms)) != len(arms) or not set(arms) <= set(ARMS):
        ap.error(f"--arms: two or more of {', '.join(ARMS)}, each once")
    if args.blocks < 1 or args.agents < 1 or args.width < 1 or args.bytes < 1 or not args.period > 0:
        ap.error("--blocks, --agents, --width and --bytes must be at least 1, --period above 0")
    payload = b"x" * args.bytes
    with tempfile.TemporaryDirectory() as tmp, sim_process(fast_profile(0.02)) as (_, host, port):
        fleet = Path(tmp) / "fleet.toml"
        fleet.write_text(FLEET.format(agents=args.agents, rounds=4, think=2.0))
        url, out = f"http://{host}:{port}", Path(tmp) / "runs"
        print(
            f"{args.agents} agents × 4 rounds ({args.width} at once), think 2 s; streams of {args.bytes:,} bytes "
            f"every {args.period:g} s; {args.blocks} block(s), each arm twice a block in a mirrored order"
        )
        shares: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
        cpu: dict[str, list[float]] = {arm: [] for arm in arms}
        for block in range(args.blocks):
            half = arms if block % 2 == 0 else arms[::-1]
            used = dict.fromkeys(arms, 0.0)
            for arm in [*half, *half[::-1]]:
                opts = fleet_app(fleet, out, url, args.width, dashboard=arm.startswith("dashboard"))
                result, spent, got = _one_run(arm, opts, payload, args.period)
                used[arm] += spent
                cpu[arm].append(spent)
                print(f"  block {block + 1}, {arm}: {result.totals.turns} turns, {spent:.2f} s client CPU"
                      + (f"; the reader got {got}" if got else ""), flush=True)  # fmt: skip
                if result.totals.done != args.agents or result.server_failure is not None:
                    print(f"  warning: {result.totals.done} agents done; server failure: {result.server_failure}")
            line = ", ".join(f"{arm} {used[arm] / used[arms[0]] - 1:+.1%}" for arm in arms[1:])
            print(f"block {block + 1} against {arms[0]}: {line}", flush=True)
            for arm in arms[1:]:
                shares[arm].append(used[arm] / used[arms[0]] - 1)
        print("client CPU a run (mean): " + ", ".join(f"{a} {statistics.fmean(cpu[a]):.2f} s" for a in arms))
        for arm in arms[1:]:
            print(f"  {arm} against {arms[0]}: mean {statistics.fmean(shares[arm]):+.1%}, {_interval(shares[arm])} "
                  f"(blocks: {', '.join(f'{x:+.1%}' for x in shares[arm])})")  # fmt: skip


if __name__ == "__main__":
    main()
