"""Client cost and timing truth: CPU µs per streamed chunk, and how late the client sees each chunk.

The simulated server runs in its own process (pinned to core 0) with ``--stamp-chunks``: every streamed token's
text is the server's CLOCK_MONOTONIC time at the moment it was written. agentload's ``ChatClient`` (this
process, core 1) records every token-bearing chunk's arrival on the same clock, so arrival − stamp is how late
the client's record of each chunk is. On Linux (x86-64, arm64) a chunk's arrival is the kernel's receive stamp
of the read that brought it (``endpoint.transport``), so the lag is the kernel's delivery alone: the event loop's
queue and the parsing ahead of a read (milliseconds in a burst over a thousand streams) are no longer in the
timings the records keep. Elsewhere it is the loop's select or the read, and the lag includes them. Whether the
client keeps up shows in chunks/s against what was asked and in its CPU per chunk (this process's CPU time over
the run divided by the chunks it parsed). Goals: p99 lag ≤ 2 ms at 256 streams, ≤ 5 ms at
1,024. Measured 3 December 2026 (this machine, two runs): p99 0.10 / 0.10 ms at 256, 0.12 / 0.08 ms at 1,024
(with the select stamp before: 4.15 / 8.30 ms and 19.6 / 20.8 ms in runs alternated with these).

    .venv/bin/python benchmarks/bench_client.py [--streams 256,1024] [--rate 12000] [--seconds 10] [--uvloop]

``--rate`` is the aggregate chunks/s the server is asked to produce (its step time is set to streams ÷ rate);
it must stay below what both processes can sustain, or the lag measures a backlog instead of the client.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestRecord
from simproc import cpu_seconds, fast_profile, sim_process


async def run_streams(url: str, streams: int, tokens: int, seconds: float) -> tuple[list[RequestRecord], float]:
    client = ChatClient(url, api_key_env=None)
    records: list[RequestRecord] = []
    stop_at = time.monotonic() + seconds
    body = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": tokens}

    async def one() -> None:
        while time.monotonic() < stop_at:
            records.append(await client.chat(body))

    cpu0 = time.process_time()
    await asyncio.gather(*(one() for _ in range(streams)))
    cpu = time.process_time() - cpu0
    await client.aclose()
    return records, cpu


def lags(records: list[RequestRecord]) -> np.ndarray:
    out: list[float] = []
    for r in records:
        stamps = r.content.split()
        # Skip each stream's first token: its arrival includes connection setup and queueing, not parsing lag.
        for sent, arrived in list(zip(stamps, r.chunk_times, strict=False))[1:]:
            out.append(arrived - float(sent))
    return np.asarray(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="256,1024")
    ap.add_argument("--rate", type=float, default=12_000.0, help="aggregate chunks/s the server produces")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--uvloop", action="store_true", help="run the client on uvloop (if installed)")
    args = ap.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    print(f"event loop: {'uvloop' if args.uvloop else 'asyncio'}; target {args.rate:,.0f} chunks/s")
    print(f"{'streams':>8} {'chunks':>10} {'chunks/s':>9} {'client µs/chunk':>16} {'lag p50':>9} {'lag p99':>9}")
    for streams in (int(s) for s in args.streams.split(",")):
        with sim_process(fast_profile(streams / args.rate), "--stamp-chunks") as (server, host, port):
            srv0 = cpu_seconds(server.pid)
            t0 = time.monotonic()
            records, cpu = asyncio.run(run_streams(f"http://{host}:{port}", streams, args.tokens, args.seconds))
            wall = time.monotonic() - t0
            srv = cpu_seconds(server.pid) - srv0
        ok = [r for r in records if r.ok]
        chunks = sum(len(r.chunk_times) for r in ok)
        lag = lags(ok) * 1e3
        print(
            f"{streams:>8} {chunks:>10,} {chunks / wall:>9,.0f} {1e6 * cpu / max(chunks, 1):>16.1f} "
            f"{np.percentile(lag, 50):>7.2f}ms {np.percentile(lag, 99):>7.2f}ms"
            f"   (server CPU {100 * srv / wall:.0f}%, {len(records) - len(ok)} failed requests)"
        )


if __name__ == "__main__":
    main()
