"""How many streamed chunks per second the simulated HTTP server sustains on one core.

The server runs in its own process pinned to core 0 with a profile whose modelled steps are tiny, so the only
limit is the server's own CPU; a lean raw-socket client (pinned to core 1) opens N concurrent streams and
counts SSE events. Prints chunks/s of wall time and chunks per second of server CPU time (from /proc).
Goal: ≥ 20,000 streamed chunks/s on one core.

    .venv/bin/python benchmarks/bench_server.py [--streams 256] [--tokens 400] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from simproc import cpu_seconds, fast_profile, sim_process  # benchmarks run as plain scripts


async def one_stream(host: str, port: int, tokens: int, stop_at: float, counts: list[int]) -> None:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "bench"}], "max_tokens": tokens, "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < stop_at:
            writer.write(head + body)
            n = 0
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                n += data.count(b"data: {")  # one per SSE event; HTTP chunk framing sits between events
                if b"data: [DONE]" in data:
                    break
            counts[0] += n
    finally:
        writer.close()


async def drive(host: str, port: int, streams: int, tokens: int, seconds: float) -> int:
    counts = [0]
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(one_stream(host, port, tokens, stop_at, counts) for _ in range(streams)))
    return counts[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    with sim_process(fast_profile(0.0005)) as (server, host, port):
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        chunks = asyncio.run(drive(host, port, args.streams, args.tokens, args.seconds))
        cpu1, t1 = cpu_seconds(server.pid), time.monotonic()
    wall, cpu = t1 - t0, cpu1 - cpu0
    print(f"streams                         {args.streams}")
    print(f"chunks streamed                 {chunks:,}")
    print(f"wall time                       {wall:.2f} s")
    print(f"server CPU time                 {cpu:.2f} s ({100 * cpu / wall:.0f}% of one core)")
    print(f"chunks/s (wall)                 {chunks / wall:,.0f}")
    print(f"chunks per server CPU second    {chunks / cpu:,.0f}   (goal ≥ 20,000)")
    print(f"server CPU per chunk            {1e6 * cpu / chunks:.1f} µs")


if __name__ == "__main__":
    main()
