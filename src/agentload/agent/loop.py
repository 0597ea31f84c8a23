"""The agent loop: send the conversation, run the tools the model calls, append their results, repeat.

The loop owns conversation state and nothing else: it reaches the server through a ``ChatBackend`` (declared
here, by its consumer) and reports each finished turn through ``on_turn`` — the fleet checkpoints there, so a
turn is either wholly in the checkpoint (assistant message, tool results, every attempt's record) or redone on
resume, never half-kept and never repeated.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from agentload.agent.tools import ToolRegistry
from agentload.clock import Clock
from agentload.endpoint.records import RequestIds, RequestRecord


class ChatBackend(Protocol):
    """What the loop needs of a server: all attempts of one turn (retries included), the last one final."""

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]: ...


class AgentSpec(BaseModel):
    """One agent's task."""

    agent_id: str
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1, description="initial conversation (system, user, ...)")
    max_rounds: int = Field(default=20, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    think_time_s: float = Field(default=0.0, ge=0)
    temperature: float | None = None
    tool_choice: str | dict[str, Any] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)


class TurnLog(BaseModel):
    """One finished turn: what was sent back to the model next, and every attempt it took."""

    round: int
    records: list[RequestRecord]
    assistant: dict[str, Any] | None = None  # None when the turn failed
    tool_results: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def final(self) -> RequestRecord:
        return self.records[-1]


StopReason = Literal["answer", "round_cap", "failed"]


class Transcript(BaseModel):
    """Everything one agent did, kept whole so it can be re-scored later."""

    agent_id: str
    spec: AgentSpec
    turns: list[TurnLog] = Field(default_factory=list)
    stop_reason: StopReason = "answer"
    final_content: str = ""

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as the model last saw it plus its last reply."""
        out = [dict(m) for m in self.spec.messages]
        for t in self.turns:
            if t.assistant is not None:
                out.append(t.assistant)
                out.extend(t.tool_results)
        return out

    def records(self) -> list[RequestRecord]:
        return [r for t in self.turns for r in t.records]


TurnHook = Callable[[TurnLog], Awaitable[None] | None]


def assistant_message(record: RequestRecord) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": record.content or None}
    if record.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id or f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(record.tool_calls)
        ]
    return msg


async def run_agent(
    spec: AgentSpec,
    backend: ChatBackend,
    tools: ToolRegistry,
    clock: Clock,
    *,
    run_id: str = "",
    level: int = 0,
    on_turn: TurnHook | None = None,
    resume: Sequence[TurnLog] = (),
) -> Transcript:
    """Run one agent to its answer, its round cap, or a failed turn; ``resume`` replays committed turns."""
    transcript = Transcript(agent_id=spec.agent_id, spec=spec, turns=list(resume))
    if transcript.turns:
        last = transcript.turns[-1]
        if last.assistant is None or not last.final.tool_calls:
            # The agent had already finished before the stop; nothing to redo.
            transcript.stop_reason = "failed" if last.assistant is None else "answer"
            transcript.final_content = last.final.content
            return transcript
    schemas = tools.schemas()
    for rnd in range(len(transcript.turns), spec.max_rounds):
        body: dict[str, Any] = {"model": spec.model, "messages": transcript.messages(), **spec.extra_body}
        if schemas:
            body["tools"] = schemas
            if spec.tool_choice is not None:
                body["tool_choice"] = spec.tool_choice
        if spec.max_tokens is not None:
            body["max_tokens"] = spec.max_tokens
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        records = await backend.complete(body, RequestIds(run=run_id, level=level, agent=spec.agent_id, turn=rnd))
        final = records[-1]
        if not final.ok:
            turn = TurnLog(round=rnd, records=records)
            await _emit(on_turn, turn)
            transcript.turns.append(turn)
            transcript.stop_reason = "failed"
            return transcript
        assistant = assistant_message(final)
        results: list[dict[str, Any]] = []
        for i, call in enumerate(final.tool_calls):
            tool = tools.get(call.name)
            if tool is not None and tool.latency_s > 0:
                await clock.sleep(tool.latency_s)
            result = await tools.call(call.name, call.arguments)
            results.append({"role": "tool", "tool_call_id": call.id or f"call_{i}", "content": result.text})
        turn = TurnLog(round=rnd, records=records, assistant=assistant, tool_results=results)
        await _emit(on_turn, turn)
        transcript.turns.append(turn)
        if not final.tool_calls:
            transcript.final_content = final.content
            transcript.stop_reason = "answer"
            return transcript
        if spec.think_time_s > 0:
            await clock.sleep(spec.think_time_s)
    transcript.stop_reason = "round_cap"
    transcript.final_content = transcript.turns[-1].final.content if transcript.turns else ""
    return transcript


async def _emit(hook: TurnHook | None, turn: TurnLog) -> None:
    if hook is None:
        return
    out = hook(turn)
    if inspect.isawaitable(out):
        await out
