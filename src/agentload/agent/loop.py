"""The conversation loop: send a turn, hand its reply to the conversation, wait, send the next, until it ends.

Every agent agentload drives is a conversation on this one loop (``converse``): the tool-calling agents of the
suite's tests and the fleet's tasks (``ToolConversation``: send the transcript, run the tools the model calls,
append their results, repeat), and the bench workloads' agentic sessions, synthetic requests and trace replays. A
``Conversation`` decides what each turn sends and what its reply means — go on after a pause, or end, and why;
the loop owns the order of things: one request a turn through a ``ChatBackend`` (declared here, by its consumer;
it returns every attempt, retries included), the ``on_turn`` report, the pause between turns on the clock, and
the stop check.

An agent does not call the loop: it *produces* its conversations (``Agent.conversations``, a generator that also
says what to wait for between them and hears how each ended), and ``ConversationDriver`` runs them on
``converse`` — the bench workloads' agents, the suite's sessions and the fleet's agents alike — so a module that
defines an agent is only ever called by the loop, never calls it, and no turn goes back up the stack it came
down. What happens around a conversation stays its owner's: the suite scores each test's transcript between its
conversations; the fleet's checkpoint is the ``ToolConversation``'s ``on_turn`` hook and its parking and limiter
feed are its backend.

``ToolConversation`` reports each finished turn through ``on_turn`` before keeping it — the fleet checkpoints
there, so a turn is either wholly in the checkpoint (assistant message, tool results, every attempt's record) or
redone on resume, never half-kept and never repeated.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

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


# -- the loop ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One turn's request: the body sent, and the ids its every attempt is recorded under."""

    body: Mapping[str, Any]
    ids: RequestIds


@dataclass(frozen=True, slots=True)
class Next:
    """The conversation goes on: wait ``pause_s`` (or until the clock reads ``until``), then send the next turn.

    A wait ``until`` a time is slept in slices of ``slice_s`` so a stop is seen within one slice (open-loop
    replays wait long for their next arrival); a pause is slept whole, the stop checked before and after it.
    """

    pause_s: float = 0.0
    until: float | None = None
    slice_s: float = math.inf
    log: TurnLog | None = None  # reported to ``on_turn``


@dataclass(frozen=True, slots=True)
class End:
    """The conversation ended with this turn; ``reason`` is the conversation's own word for why."""

    reason: str
    log: TurnLog | None = None  # reported to ``on_turn``


STOPPED: Final = "stopped"  # the caller's ``should_stop`` said so between turns: the conversation did not end
EXHAUSTED: Final = "exhausted"  # the conversation had no next request (a round cap)


@dataclass(frozen=True, slots=True)
class Ending:
    reason: str  # an ``End.reason``, or ``STOPPED`` / ``EXHAUSTED``
    turns: int  # the number of the turn that would have come next


class Conversation(Protocol):
    """What to send each turn and what its reply means; the loop does the sending, the waiting and the stopping."""

    def request(self, turn: int) -> Request | None:
        """Turn ``turn``'s request (built when it is due, after the pause), or None when there is no next turn."""
        ...

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        """Take in turn ``turn``'s attempts (the last one final): go on, or end."""
        ...


async def converse(
    conversation: Conversation,
    backend: ChatBackend,
    clock: Clock,
    *,
    first_turn: int = 0,
    should_stop: Callable[[], bool] | None = None,
    on_turn: TurnHook | None = None,
) -> Ending:
    """Run ``conversation`` from ``first_turn`` until it ends, has no next request, or ``should_stop`` between turns.

    Nothing is checked before the first request: whether to start at all is the caller's decision.
    """
    turn = first_turn
    while True:
        request = conversation.request(turn)
        if request is None:
            return Ending(EXHAUSTED, turn)
        records = await backend.complete(request.body, request.ids)
        step = await conversation.reply(turn, records)
        if step.log is not None:
            await _emit(on_turn, step.log)
        turn += 1
        if isinstance(step, End):
            return Ending(step.reason, turn)
        if step.until is not None:
            going_on = await wait_until(clock, step.until, should_stop or _never, step.slice_s)
        else:
            going_on = await pause(clock, step.pause_s, should_stop)
        if not going_on:
            return Ending(STOPPED, turn)


async def pause(clock: Clock, seconds: float, should_stop: Callable[[], bool] | None = None) -> bool:
    """Sleep ``seconds`` between turns; False when ``should_stop`` says so (before or after the sleep)."""
    if should_stop is not None and should_stop():
        return False
    if seconds > 0:
        await clock.sleep(seconds)
    return should_stop is None or not should_stop()


async def wait_until(clock: Clock, when: float, should_stop: Callable[[], bool], slice_s: float = math.inf) -> bool:
    """Sleep until ``clock`` reads ``when``, in slices of ``slice_s``; False as soon as ``should_stop`` says so."""
    while True:
        if should_stop():
            return False
        left = when - clock.now()
        if left <= 0:
            return True
        await clock.sleep(min(left, slice_s))


def _never() -> bool:
    return False


# -- an agent's conversations, one after another -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wait:
    """Before the agent's next step: pause ``pause_s``, or until the clock reads ``until`` (in ``slice_s`` slices).

    A wait the stop cuts short ends the agent (its generator is closed, as after the level's last turn).
    """

    pause_s: float = 0.0
    until: float | None = None
    slice_s: float = math.inf


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start ``conversation`` alongside the agent's next steps (an open-loop arrival), once ``slots`` lets it in;
    ``on_end`` hears how it ended. The agent ends only after every conversation it spawned has."""

    conversation: Conversation
    slots: asyncio.Semaphore
    on_end: Callable[[Ending], None]


@dataclass(frozen=True, slots=True)
class Whole:
    """Run ``conversation`` to its end: the stop is not checked between its turns (a suite test is scored only
    whole, so the test in flight when a level ends finishes; the agent checks the stop before its next one)."""

    conversation: Conversation


Step = Conversation | Wait | Spawn | Whole
# What an agent yields (a conversation to run now, whole or until the stop, a wait, a spawn) and is sent back: a
# conversation's Ending, None after a wait or a spawn. What a step raised (a harness bug, the task's cancel) is
# raised in the agent at the yield that asked for it, so an agent that keeps failures as data (the suite's
# sessions) or takes back a cancel it asked for (the fleet's restart) does so in its own code.
Steps = Generator[Step, Ending | None, None]


class TurnContext(Protocol):
    """What running an agent's conversations needs of its context (``workload.base.LoadContext`` fits)."""

    @property
    def backend(self) -> ChatBackend: ...

    @property
    def clock(self) -> Clock: ...

    def should_stop(self) -> bool: ...


C = TypeVar("C", bound=TurnContext, contravariant=True)


class Agent(Protocol[C]):
    """A workload's agent: its conversations (agentic sessions, synthetic requests, trace replays) as ``Steps``."""

    agent_id: str

    def conversations(self, ctx: C) -> Steps: ...


class ConversationDriver(Generic[C]):
    """Runs an agent's conversations on ``converse``: every send, wait and spawn the agent asks for happens here."""

    def __init__(self, agent: Agent[C]) -> None:
        self.agent = agent
        self.agent_id = agent.agent_id

    async def run(self, ctx: C) -> None:
        steps = self.agent.conversations(ctx)
        running: set[asyncio.Task[None]] = set()
        failed: list[BaseException] = []  # a spawned conversation's bug, raised here rather than lost with its task
        try:
            answer: Ending | None = None
            raised: BaseException | None = None
            while True:
                if failed:
                    raise failed[0]
                try:
                    step = steps.send(answer) if raised is None else steps.throw(raised)
                except StopIteration:
                    break
                answer = raised = None
                try:
                    if isinstance(step, Wait):
                        if step.until is not None:
                            going_on = await wait_until(ctx.clock, step.until, ctx.should_stop, step.slice_s)
                        else:
                            going_on = await pause(ctx.clock, step.pause_s, ctx.should_stop)
                        if not going_on:
                            break
                    elif isinstance(step, Spawn):
                        await step.slots.acquire()
                        task = asyncio.create_task(_spawned(step, ctx))
                        running.add(task)
                        task.add_done_callback(running.discard)
                        task.add_done_callback(functools.partial(_release, step.slots))
                        task.add_done_callback(functools.partial(_note_failure, failed))
                    elif isinstance(step, Whole):
                        answer = await converse(step.conversation, ctx.backend, ctx.clock)
                    else:
                        answer = await converse(step, ctx.backend, ctx.clock, should_stop=ctx.should_stop)
                except BaseException as exc:  # raised in the agent (see ``Step``), which may re-raise it
                    raised = exc
            steps.close()
            if running:  # spawned conversations finish their turn in flight (the stop ends them between turns)
                await asyncio.gather(*running)
        finally:
            steps.close()
            for task in running:
                task.cancel()
            if running:  # awaited, so no spawned conversation outlives its level and the connection under it
                await asyncio.gather(*running, return_exceptions=True)


def _note_failure(failed: list[BaseException], task: asyncio.Task[None]) -> None:
    error = None if task.cancelled() else task.exception()
    if error is not None:
        failed.append(error)


def _release(slots: asyncio.Semaphore, _: asyncio.Task[None]) -> None:
    slots.release()


async def _spawned(spawn: Spawn, ctx: TurnContext) -> None:
    spawn.on_end(await converse(spawn.conversation, ctx.backend, ctx.clock, should_stop=ctx.should_stop))


# -- the tool-calling agent --------------------------------------------------------------------------------------


class ToolConversation:
    """The tool-calling agent's conversation: the whole transcript resent each round, the model's tool calls run
    between rounds, until an answer, the round cap or a failed turn.

    The suite's tests and the fleet's tasks are this conversation, yielded by their agents to ``ConversationDriver``
    (``run_agent`` runs one alone). ``resume`` is the turns already committed (the fleet's checkpoint): the rounds
    go on from there, numbered on. Each finished turn goes to ``on_turn`` first and then into the transcript, so a
    turn the hook did not take (the fleet's checkpoint failed, or stopped the run) is not in the transcript either.
    ``finish`` reads how the conversation ended into its ``Transcript``.
    """

    def __init__(
        self,
        spec: AgentSpec,
        tools: ToolRegistry,
        clock: Clock,
        *,
        run_id: str = "",
        level: int = 0,
        on_turn: TurnHook | None = None,
        resume: Sequence[TurnLog] = (),
    ) -> None:
        self.spec = spec
        self.tools = tools
        self.clock = clock
        self.run_id = run_id
        self.level = level
        self.on_turn = on_turn
        self.schemas = tools.schemas()
        self.transcript = Transcript(agent_id=spec.agent_id, spec=spec, turns=list(resume))
        self.first_round = len(self.transcript.turns)
        last = self.transcript.turns[-1] if self.transcript.turns else None
        # The agent had already finished before the stop it resumes from: nothing to redo.
        self.ended_before = last is not None and (last.assistant is None or not last.final.tool_calls)

    def request(self, turn: int) -> Request | None:
        spec = self.spec
        rnd = self.first_round + turn
        if self.ended_before or rnd >= spec.max_rounds:
            return None
        body: dict[str, Any] = {"model": spec.model, "messages": self.transcript.messages(), **spec.extra_body}
        if self.schemas:
            body["tools"] = self.schemas
            if spec.tool_choice is not None:
                body["tool_choice"] = spec.tool_choice
        if spec.max_tokens is not None:
            body["max_tokens"] = spec.max_tokens
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        return Request(body, RequestIds(run=self.run_id, level=self.level, agent=spec.agent_id, turn=rnd))

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        rnd = self.first_round + turn
        final = records[-1]
        if not final.ok:
            await self._keep(TurnLog(round=rnd, records=records))
            return End("failed")
        assistant = assistant_message(final)
        results: list[dict[str, Any]] = []
        for i, call in enumerate(final.tool_calls):
            tool = self.tools.get(call.name)
            if tool is not None and tool.latency_s > 0:
                await self.clock.sleep(tool.latency_s)
            result = await self.tools.call(call.name, call.arguments)
            results.append({"role": "tool", "tool_call_id": call.id or f"call_{i}", "content": result.text})
        await self._keep(TurnLog(round=rnd, records=records, assistant=assistant, tool_results=results))
        if not final.tool_calls:
            return End("answer")
        return Next(pause_s=self.spec.think_time_s)

    async def _keep(self, turn: TurnLog) -> None:
        await _emit(self.on_turn, turn)
        self.transcript.turns.append(turn)

    def finish(self, ending: Ending) -> Transcript:
        """The transcript, with why the conversation stopped and its last answer."""
        transcript = self.transcript
        if self.ended_before:
            last = transcript.turns[-1]
            transcript.stop_reason = "failed" if last.assistant is None else "answer"
            transcript.final_content = last.final.content
        elif ending.reason == "failed":
            transcript.stop_reason = "failed"
        else:
            transcript.stop_reason = "answer" if ending.reason == "answer" else "round_cap"
            transcript.final_content = transcript.turns[-1].final.content if transcript.turns else ""
        return transcript


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
    """Run one tool-calling agent alone to its answer, its round cap, or a failed turn; ``resume`` replays
    committed turns. (The suite and the fleet yield their ``ToolConversation``s to ``ConversationDriver``.)"""
    conversation = ToolConversation(spec, tools, clock, run_id=run_id, level=level, on_turn=on_turn, resume=resume)
    return conversation.finish(await converse(conversation, backend, clock))


async def _emit(hook: TurnHook | None, turn: TurnLog) -> None:
    if hook is None:
        return
    out = hook(turn)
    if inspect.isawaitable(out):
        await out
