"""How often one bench level asks the server about itself: /metrics and /health requests, and timeline samples.

Why: a level used to run two pollers at once (the watchdog's ``SignalPoller`` and the bench sampler's own
/metrics scraper), each at 1 Hz. With one connection there is one monitor, so every /metrics request is one poll
that feeds the watchdog and becomes one timeline sample. The level runs against the in-process simulator on
virtual time (no sockets; the request counts do not depend on the machine's speed).

    .venv/bin/python benchmarks/level_polls.py [--agents 4] [--window 60]
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping
from urllib.parse import urlsplit

from agentload.bench.runner import run_level
from agentload.bench.target import Target
from agentload.capacity.profile import load_profile
from agentload.clock import run_virtual
from agentload.endpoint.transport import Response, Transport
from agentload.sim.behaviour import FillerBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.workload.agentic import AgenticWorkload


class Counting:
    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sent: Counter[str] = Counter()

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        self.sent[f"{method} {urlsplit(url).path}"] += 1
        return await self.inner.send(method, url, body, headers)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def level(agents: int, window_s: float) -> tuple[Counter[str], int, float]:
    server = SimServer(SimConfig(profile=load_profile("laptop"), behaviour=FillerBehaviour()))
    transport = Counting(InProcessTransport(server))
    target = Target(transport, "http://sim.invalid", server.model_name, "sim", virtual=True, engine="agentload-sim")
    data = await run_level(target, AgenticWorkload(), agents=agents, context=2000, level=0, run_id="polls",
                           run_t0=0.0, warmup_s=10.0, window_s=window_s)  # fmt: skip
    await transport.aclose()
    return transport.sent, len(data.samples), data.end - data.start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    sent, samples, seconds = run_virtual(level(args.agents, args.window))
    print(f"level of {args.agents} agents, {seconds:.0f} s (simulated)")
    print(f"  GET /metrics      {sent['GET /metrics']:6d}")
    print(f"  GET /health       {sent['GET /health']:6d}")
    print(f"  timeline samples  {samples:6d}")
    print(f"  chat requests     {sent['POST /v1/chat/completions']:6d}")


if __name__ == "__main__":
    main()
