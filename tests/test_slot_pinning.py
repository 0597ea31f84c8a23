"""bench pins agents to llama.cpp slots (``endpoint.pinning``): agent i's turns name ``id_slot`` = i mod N.

Without it llama-server's similarity rule puts a new conversation into another agent's idle slot (agents share a
system prompt), so agents evict each other below the slot count; pinned, each of up to N agents keeps its slot and
past N two agents share one: a turn waits for its slot and re-prefills.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.endpoint.backend import RecordingBackend
from agentload.endpoint.output import EngineFields
from agentload.endpoint.pinning import SlotPins
from agentload.endpoint.records import RequestIds, RequestRecord


class _Capture:
    def __init__(self) -> None:
        self.bodies: list[Mapping[str, Any]] = []

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        self.bodies.append(body)
        return []


async def test_each_agent_names_its_slot_in_first_send_order_and_its_sessions_share_it() -> None:
    inner = _Capture()
    backend = RecordingBackend(inner, [], fields=EngineFields(pin_slots=3).add)
    for agent in ("agent-2/s0", "agent-0/s0", "agent-1/s0", "agent-3/s0", "agent-2/s1", "agent-4/s0"):
        await backend.complete({"model": "m", "messages": []}, RequestIds(agent=agent))
    # agent-2 sent first (slot 0), agent-0 second (1), agent-1 third (2), agent-3 fourth (3 mod 3 = 0), agent-2's
    # next session stays on slot 0, agent-4 fifth (4 mod 3 = 1).
    assert [b["id_slot"] for b in inner.bodies] == [0, 1, 2, 0, 0, 1]
    assert inner.bodies[0]["model"] == "m"


async def test_without_slots_the_body_is_unchanged() -> None:
    inner = _Capture()
    backend = RecordingBackend(inner, [])
    await backend.complete({"model": "m"}, RequestIds(agent="agent-0/s0"))
    assert inner.bodies == [{"model": "m"}]
    assert SlotPins(2).pin({"id_slot": 7}, "a") == {"id_slot": 0}  # bench's pin wins over the workload's


def _level(tmp_path: Path, *extra: str) -> dict[str, Any]:
    args = ["bench", "--sim", "llamacpp-8b-l40s", "--context", "8192", "--agents", "6", "--warmup", "20s",
            "--window", "60s", "--min-turns", "20", "--out", str(tmp_path), "--json", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_past_the_slots_pinned_agents_queue_for_their_own_slot_instead_of_taking_anothers(tmp_path: Path) -> None:
    # 6 agents on the profile's 4 slots: pinned, two slots are shared by two agents each and two agents keep
    # theirs, whose turns never lose their cache; unpinned, an idle slot goes to whichever agent sends next
    # (similarity through the shared system prompt), so every agent's cache is at risk (54 % vs 45 % when written).
    pinned = _level(tmp_path / "pinned")
    free = _level(tmp_path / "free", "--no-pin-slots")
    assert pinned["settings"]["pin_slots"] is True
    assert free["settings"]["pin_slots"] is False
    assert any("pinned to the server's 4 slots" in n for n in pinned["notes"])
    hit_pinned = pinned["levels"][0]["prefix_hit_rate_server"]
    hit_free = free["levels"][0]["prefix_hit_rate_server"]
    assert hit_pinned > hit_free
    assert pinned["levels"][0]["mean_waiting"] > 0  # turns wait for their slot


def test_a_mooncake_trace_is_not_pinned_because_its_jobs_overlap(tmp_path: Path) -> None:
    # An agent's Mooncake jobs start at their trace times whether or not its earlier ones finished: pinned to one
    # slot they would wait for each other while the other slots sat idle, so bench lets the server choose.
    trace = Path(__file__).parent / "data" / "mooncake_sessions.jsonl"
    args = ["bench", "--sim", "llamacpp-8b-l40s", "--workload", f"trace:{trace}", "--context", "8192", "--agents",
            "1", "--warmup", "1s", "--window", "30s", "--out", str(tmp_path), "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["settings"]["pin_slots"] is False
    assert any("not pinned to slots: the Mooncake trace's jobs overlap" in n for n in doc["notes"])
    assert not any("pinned to the server's" in n for n in doc["notes"])
