"""Record a fleet through ``agentload record``, replay the trace: the replay sends what the fleet sent.

The fleet (``agentload run``'s application, real sockets) talks to a simulator through the proxy; the recorded
trace is then replayed by the conversation-trace workload, at time_scale 1, against a fresh simulator of the same
profile. Each replayed turn's prompt, as the server counts it, is the recorded ``in`` within 2 %, and the replay's
prefix-hit rate is within 2 points of the trace's own (its sessions' shared leading blocks). The server's hit
rate while recording is higher: it also hit reply tokens that the next prompt resent and the system prompt
another session had sent, which a replay of separately salted trees cannot reproduce (docs/record.md).
``benchmarks/record_replay.py`` runs the same at a larger size and prints the figures.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp.test_utils import TestServer

from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.limiter import Mode
from agentload.record.app import RecordSettings, make_proxy
from agentload.sim.agentmodel import AgentBehaviour
from agentload.workload.conversation_trace import ConversationTraceWorkload, load_conversation_trace, trace_ceiling
from tests.simserver import running_sim
from tests.test_workload_harness import hit_rate, run_level, sim_server

PROFILE = "qwen3-235b-gb300"  # a pool of ~1M tokens: nothing is evicted at this size, recording or replaying
BLOCK = 16  # the simulator's KV block: the trace's blocks are then the server's cache granularity

FLEET = """
name = "recorded"
[defaults]
system = "You are a careful software engineer. Use the tools you are given; answer briefly."
max_rounds = 4
max_tokens = 256
think_time_s = 0.0
tool_latency_s = 0.0

[[tasks]]
id = "review"
prompt = "Review module {replica} of the storage service: search its documents, then write its defects to defects.md."
tools = ["read_file", "search", "write_file"]
count = 2
context_tokens = 600
tool_result_tokens = 80
"""


async def record_fleet(tmp_path: Path) -> Path:
    out = tmp_path / "trace.json"
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET, encoding="utf-8")
    async with running_sim(PROFILE, behaviour=AgentBehaviour()) as (_, upstream):  # it calls the offered tools
        proxy = make_proxy(RecordSettings("127.0.0.1", 0, upstream, out, BLOCK))
        server = TestServer(proxy.app(), host="127.0.0.1")
        await server.start_server()
        try:
            settings = FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none",
                                     url=f"http://127.0.0.1:{server.port}", mode=Mode.PARALLEL, width=2)  # fmt: skip
            result = await FleetApp(settings).run()
            assert result.totals.done == 2
        finally:
            await server.close()
    return out


def test_a_recorded_fleet_replays_its_prompt_sizes_and_its_prefix_hits(tmp_path: Path) -> None:
    out = asyncio.run(record_fleet(tmp_path))
    doc = json.loads(out.read_text())
    recorded = [r for c in doc for r in c["requests"]]
    # One session per agent over several turns; the run's probe of the server (two one-token requests marked as
    # agentload's own) is forwarded, not recorded.
    assert len(doc) == 2
    for agent in doc:
        assert len(agent["requests"]) >= 2
        assert sum(r["tool_calls"] for r in agent["requests"]) >= 1
    recorded_hits = sum(r["cached"] for r in recorded) / sum(r["in"] for r in recorded)

    workload = ConversationTraceWorkload(load_conversation_trace(out), time_scale=1.0)
    # One agent replays the trees one after another, so the level's first requests are exactly one draw of each.
    run = run_level(workload, 1, context=0, server=sim_server(PROFILE), stop_after_requests=len(recorded))
    assert len(run.records) == len(recorded)
    assert all(r.ok for r in run.records)
    by_turn = {(r.ids.agent.rsplit("/", 1)[-1], r.ids.turn): r for r in run.records}
    for index, conversation in enumerate(doc):
        for turn, request in enumerate(conversation["requests"]):
            sent = by_turn[(f"c{index}", turn)].prompt_tokens
            assert abs(sent - request["in"]) <= 0.02 * request["in"], (index, turn, sent, request["in"])
    replayed_hits = hit_rate(run.records)
    ceiling = trace_ceiling(workload.trace)
    print(f"prefix-hit rate: server while recording {recorded_hits:.3f}, the trace's blocks {ceiling:.3f}, "
          f"replayed {replayed_hits:.3f}")  # fmt: skip
    # The replay's hits are the recording's own prompt blocks: what each session had sent before, block for block.
    assert abs(replayed_hits - ceiling) <= 0.02
    # The server hit more while recording, never less: blocks of a reply the next prompt resends, and the system
    # prompt the other agent had sent, which a replay (each tree its own cache context) cannot reproduce.
    assert recorded_hits >= ceiling - 0.02
