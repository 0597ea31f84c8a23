"""Record a fleet through ``agentload record``, replay the trace: how closely the replay sends what was recorded.

Design. A fleet file (``examples/fleet.toml`` by default: ten agents over three waves, tools, think times) runs
through ``agentload run``'s application (``fleet.app.FleetApp``, real time, HTTP) against the simulator
(``--profile``, the agent behaviour, in this process) with the recording proxy (``record.app.make_proxy``) in
between, writing a conversation trace at ``--block-size``. The trace is then replayed by the conversation-trace
workload at time_scale 1, one agent drawing each recorded session once in turn, against a fresh simulator of the
same profile in simulated time (``clock.run_virtual``: a replay's think times cost no wall time).

What is measured. Per replayed request, the prompt tokens the server counted against the recorded ``in``
(relative error: max and p95). Prefix-hit rates, cached over prompt tokens: the server's while recording; the
trace's own ceiling (each request's leading hash ids sent before, by its session or, for ids the file shares
across sessions with ``hash_scope: "trace"``, by another session; ``trace_ceiling``); the replay's. And the
recorded hits above the ceiling, which the trace cannot carry: mostly blocks of a reply that the next prompt
resends, which the server had cached as it generated them.

    .venv/bin/python benchmarks/record_replay.py [--fleet examples/fleet.toml] [--block-size 64]
        [--profile qwen3-235b-gb300]

The figures go into docs/record.md ("Measured"), dated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiohttp import web

from agentload.capacity.profile import load_profile
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.backend import RecordingBackend, SingleAttemptBackend
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.limiter import Mode
from agentload.load.runner import run_load
from agentload.record.app import RecordSettings, make_proxy
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.workload.conversation_trace import ConversationTraceWorkload, load_conversation_trace, trace_ceiling
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def record(fleet: Path, profile: str, block_size: int, out: Path, runs: Path) -> float:
    """Run the fleet through the proxy; returns the wall seconds it took."""
    sim = SimServer(SimConfig(profile=load_profile(profile), behaviour=AgentBehaviour()))
    sim_runner, upstream = await _serve(sim.app())
    proxy = make_proxy(RecordSettings("127.0.0.1", 0, upstream, out, block_size))
    proxy_runner, url = await _serve(proxy.app())
    try:
        started = time.monotonic()
        settings = FleetSettings(fleet=fleet, out=runs, progress="none", url=url, mode=Mode.PARALLEL, width=16)
        result = await FleetApp(settings).run()
        if result.totals.failed:
            raise SystemExit(f"{result.totals.failed} agents failed while recording")
        return time.monotonic() - started
    finally:
        await proxy_runner.cleanup()  # writes the trace a last time
        await sim_runner.cleanup()


@dataclass
class _Level:
    """The replay's context (``workload.base.LoadContext``): it stops once its one agent replayed every tree."""

    backend: RecordingBackend  # every attempt's record, in .records
    trees: int
    model: str
    clock: LoopClock = field(default_factory=LoopClock)
    sizing: TokenSizing = SIMULATOR_SIZING
    run_id: str = "record-replay"
    level: int = 0
    done: int = 0

    @property
    def text_salt(self) -> str:
        return self.run_id

    def should_stop(self) -> bool:
        return self.done >= self.trees

    def session_done(self, agent_id: str, *, ok: bool, passed: int | None = None, scored: int | None = None) -> None:
        self.done += 1

    def reply_clamped(self, ids: RequestIds, drawn: int) -> None:
        return None


async def replay(workload: ConversationTraceWorkload, profile: str) -> list[RequestRecord]:
    server = SimServer(SimConfig(profile=load_profile(profile)))
    client = ChatClient("http://sim.invalid", transport=InProcessTransport(server), api_key_env=None)
    try:
        level = _Level(RecordingBackend(SingleAttemptBackend(client), []), len(workload.trace.trees), server.model_name)
        await run_load(workload.agents(1, context=0, seed=0), level)
        return level.backend.records
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", type=Path, default=Path(__file__).parents[1] / "examples" / "fleet.toml")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--profile", default="qwen3-235b-gb300", help="a pool no run of this size fills")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.json"
        wall = asyncio.run(record(args.fleet, args.profile, args.block_size, out, Path(tmp) / "runs"))
        doc = json.loads(out.read_text())
        workload = ConversationTraceWorkload(load_conversation_trace(out), time_scale=1.0)
        records = run_virtual(replay(workload, args.profile))
    recorded = {(f"c{i}", turn): r for i, c in enumerate(doc) for turn, r in enumerate(c["requests"])}
    replayed = {(r.ids.agent.rsplit("/", 1)[-1], r.ids.turn): r for r in records}
    if len(replayed) != len(recorded) or not all(r.ok for r in records):
        sys.exit(f"replayed {len(replayed)} of {len(recorded)} requests, {sum(not r.ok for r in records)} failed")
    errors = np.array([abs(replayed[k].prompt_tokens - r["in"]) / r["in"] for k, r in recorded.items()])
    prompt = sum(r["in"] for r in recorded.values())
    cached = sum(r.get("cached", 0) for r in recorded.values())
    first = sum(r.get("cached", 0) for (_, turn), r in recorded.items() if turn == 0)
    replay_hits = sum(r.cached_tokens or 0 for r in records) / sum(r.prompt_tokens for r in records)
    print(f"fleet {args.fleet.name} on {args.profile}, block size {args.block_size}: recorded {len(recorded)} "
          f"requests in {len(doc)} sessions in {wall:.1f} s ({doc[0]['tokenizer']})")  # fmt: skip
    print(f"prompt tokens, replayed vs recorded: max error {errors.max():.2%}, p95 {np.quantile(errors, 0.95):.2%}")
    print(f"prefix-hit rate: server while recording {cached / prompt:.3f}; the trace's ceiling "
          f"{trace_ceiling(workload.trace):.3f}; replayed {replay_hits:.3f}")  # fmt: skip
    ceiling = trace_ceiling(workload.trace)
    print(f"recorded hits above the trace's ceiling, which a replay cannot carry: {cached / prompt - ceiling:.3f} "
          f"(sessions' first requests hit {first / prompt:.3f} while recording)")  # fmt: skip


if __name__ == "__main__":
    main()
