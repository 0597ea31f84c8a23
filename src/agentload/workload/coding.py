"""``agentic-coding``: sessions shaped like real coding agents, at any context, compacting at the limit.

The ``agentic`` workloads scale every size with the context target, so at a small target a turn asks a reply of a
few tokens; real coding agents write hundreds of tokens a turn whatever their window. Here every size is drawn
from distributions fitted to published traces of real agents, in the server's tokens, and the context target
only decides when a session compacts. The figures, their public sources and how each is used:
``docs/workloads.md``.

* **Turns per session**: lognormal, median 43 (Claude Code sessions; Codex on SWE-bench Pro: 33).
* **Reply**: lognormal, median 444 tokens (Claude Code), with a long tail; never scaled by the context. A reply
  is shortened only where the remaining room cannot hold it, and the level is told (``reply_clamped``).
* **New input a turn** (tool results, file reads): mostly small (command output, a grep), sometimes large (a
  whole file): a mixture of two lognormals, so that a turn's append (reply plus tool result) has the median of
  ~750 tokens and the long tail of published per-step append sizes.
* **Time between turns** (tool run plus the harness's own time): lognormal through the published inter-turn
  delays, 5.2 s at p50 and 81.4 s at p99.
* **Subagents**: 44 % of sessions hand work to 1-4 child sessions at one turn (Claude Code's Task tool), run
  alongside on the same server (``agent.loop.Spawn``); the parent waits for them and reads their final replies
  as its next tool result. Children have their own system prompt, shared by every subagent.
* **Growth and compaction**: each turn resends the conversation with the reply and the tool result appended, so
  the server serves all but the newest tokens from its prefix cache. A session whose next turn would not fit the
  target compacts, as agents do: one request sends the whole context with a fixed instruction to summarise it,
  and the session goes on from its system prompt, that summary and the pending tool result.

The opening is the published ~12k-token start of a session (at most 30 % of the target), most of it the
harness's system prompt and tool schemas, which every session shares. Compaction requests are not work turns:
a session's turn count and its reply-length distribution count only the turns that do the task.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentload.agent.loop import STOPPED, ConversationDriver, End, Ending, Next, Request, Spawn, Steps, Wait
from agentload.agent.shape import (
    OPENING_OVERHEAD_TOKENS,
    PUBLISHED_OUTPUT_TOKENS,
    PUBLISHED_START_TOKENS,
    PUBLISHED_TURNS,
    START_SHARE_CAP,
    Lognormal,
)
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.workload.agentic import (
    DONE,
    FAILED,
    FAILURE_PAUSE_S,
    agent_ids,
    asked,
    hold_margin,
    stable_int,
    system_prompt,
)
from agentload.workload.base import AgentDriver, LoadContext
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing, words

# -- the published figures (sources: docs/workloads.md) ---------------------------------------------------------
PUBLISHED_DELAY_P50_S = 5.2  # inter-turn delay, Codex on SWE-bench Pro
PUBLISHED_DELAY_P99_S = 81.4
PUBLISHED_SUBAGENT_SHARE = 0.44  # sessions that spawn subagents (Claude Code)
Z_P99 = 2.3263  # the standard normal's 99th percentile: a lognormal's p99 is its median times exp(Z_P99 sigma)

# -- judgement where no figure is published (each explained in docs/workloads.md) ------------------------------
TURNS_SIGMA = 0.8  # medians only are published; 0.8 puts one session in ten past ~120 turns
REPLY_SIGMA = 0.9  # a long tail: one reply in ten past ~1,400 tokens, capped at ~4,200
# Tool results: a small part (command output, a search's hits) most turns, a whole file sometimes. Together with
# the reply they give a per-turn append of median ~750 tokens, p90 ~3-4k, as published per-step appends.
TOOL_SMALL_MEDIAN = 120
TOOL_SMALL_SIGMA = 1.0
TOOL_LARGE_MEDIAN = 3_000
TOOL_LARGE_SIGMA = 0.8
TOOL_LARGE_SHARE = 0.15
# Of the opening, the harness's system prompt and tool schemas, shared by every session: ~21k of a ~25k first
# request in a published Claude Code session.
CODING_SYSTEM_SHARE = 0.8
# Subagents: their count per spawning session, their turns, and their system prompt against the parent's (a
# published Claude Code session's Explore subagents opened at ~13k tokens against the parent's ~25k).
MAX_SUBAGENTS = 4
SUBAGENT_TURNS_MEDIAN = 8.0
SUBAGENT_TURNS_SIGMA = 0.6
SUBAGENT_SYSTEM_SHARE = 0.5
SUBAGENT_POLL_S = 1.0  # the parent checks this often whether its subagents are done
# The compaction summary: about a twentieth of the window (no figure is published), within these bounds.
SUMMARY_SHARE = 0.05
SUMMARY_MIN_TOKENS = 128
SUMMARY_MAX_TOKENS = 4_096
SUMMARY_SIGMA = 0.3
# What a session sends to be compacted (fixed text, as a harness's compaction prompt is).
COMPACT_INSTRUCTION = (
    "Your context window is nearly full. Write a detailed summary of this conversation so far: the task, the "
    "files you read and changed, what you tried, what failed, and what is left to do, so that the work can go "
    "on from the summary alone."
)


def instruction_tokens(sizing: TokenSizing) -> int:
    """What the compaction instruction costs, over- rather than underestimated: its punctuation costs tokens of
    its own (English prose is about four characters a token on BPE vocabularies; a third of its characters leaves
    room), and a compaction request that passed the target would be rejected at the server's limit."""
    return math.ceil(len(COMPACT_INSTRUCTION) / 3 * max(1.0, sizing.tokens_per_word))


# How a session ended beside agentic's ``DONE`` / ``FAILED``: it handed work to subagents and waits for them.
SPAWNED = "spawned"


@dataclass(frozen=True)
class CodingShape:
    """The distributions of ``agentic-coding`` for one context target, in the server's tokens and in seconds."""

    context: int
    system_tokens: int  # the parent's system prompt, shared by every session
    prefix_tokens: int  # the session's own opening (its task)
    turns: Lognormal
    reply: Lognormal
    tool_small: Lognormal
    tool_large: Lognormal
    tool_large_share: float
    delay_s: Lognormal
    subagent_share: float
    subagent_turns: Lognormal
    subagent_system_tokens: int
    summary: Lognormal

    @classmethod
    def published(
        cls,
        context: int,
        *,
        turns: float = PUBLISHED_TURNS,
        output_tokens: float = PUBLISHED_OUTPUT_TOKENS,
        output_sigma: float = REPLY_SIGMA,
        delay_p50_s: float = PUBLISHED_DELAY_P50_S,
        delay_p99_s: float = PUBLISHED_DELAY_P99_S,
        subagent_share: float = PUBLISHED_SUBAGENT_SHARE,
        start_tokens: int | None = None,
        system_tokens: int | None = None,
    ) -> CodingShape:
        """The published shape at ``context`` (only the opening and the summary depend on it); medians can be
        overridden, and a bad value is a ``ConfigError``."""
        if context < 1024:
            raise ConfigError(f"agentic-coding needs a context of at least 1024 tokens, got {context}")
        if not turns >= 1:
            raise ConfigError(f"turns must be at least 1, got {turns}")
        if not output_tokens >= 1 or not output_sigma >= 0:
            raise ConfigError(f"output_tokens must be at least 1 and output_sigma not negative, got "
                              f"{output_tokens} and {output_sigma}")  # fmt: skip
        if not 0 <= delay_p50_s <= delay_p99_s:
            raise ConfigError(f"the delays need 0 <= p50 <= p99, got {delay_p50_s} s and {delay_p99_s} s")
        if not 0 <= subagent_share <= 1:
            raise ConfigError(f"subagent_share must be within 0-1, got {subagent_share}")
        start = (
            start_tokens if start_tokens is not None else min(PUBLISHED_START_TOKENS, int(START_SHARE_CAP * context))
        )
        if not 0 < start < context // 2:
            raise ConfigError(f"the opening ({start} tokens) must be positive and under half the context ({context})")
        system = system_tokens if system_tokens is not None else round(start * CODING_SYSTEM_SHARE)
        if not 0 <= system < start:
            raise ConfigError(f"the system prompt ({system} tokens) must be shorter than the opening ({start})")
        delay_sigma = math.log(delay_p99_s / delay_p50_s) / Z_P99 if delay_p50_s > 0 else 0.0
        summary = min(SUMMARY_MAX_TOKENS, max(SUMMARY_MIN_TOKENS, SUMMARY_SHARE * context))
        return cls(
            context=context,
            system_tokens=system,
            prefix_tokens=start - system,
            turns=Lognormal(turns, TURNS_SIGMA),
            reply=Lognormal(output_tokens, output_sigma),
            tool_small=Lognormal(TOOL_SMALL_MEDIAN, TOOL_SMALL_SIGMA),
            tool_large=Lognormal(TOOL_LARGE_MEDIAN, TOOL_LARGE_SIGMA),
            tool_large_share=TOOL_LARGE_SHARE,
            delay_s=Lognormal(delay_p50_s, delay_sigma),
            subagent_share=subagent_share,
            subagent_turns=Lognormal(SUBAGENT_TURNS_MEDIAN, SUBAGENT_TURNS_SIGMA),
            subagent_system_tokens=round(system * SUBAGENT_SYSTEM_SHARE),
            summary=Lognormal(summary, SUMMARY_SIGMA),
        )

    def reserve(self, sizing: TokenSizing) -> int:
        """Tokens a session keeps free below the target so its compaction request (the context, the instruction
        and the longest summary) still fits: it compacts once its next turn would reach into them."""
        return (
            math.ceil(self.summary.cap)
            + instruction_tokens(sizing)
            + 2 * sizing.turn_overhead
            + hold_margin(self.context)
        )


@dataclass(frozen=True)
class SessionPlan:
    """What one session will do, drawn when it starts: its work turns and when (if ever) it spawns subagents."""

    turns: int
    spawn_at: int | None  # after this many work turns the session hands work to subagents
    subagents: int

    @classmethod
    def draw(cls, shape: CodingShape, rng: np.random.Generator) -> SessionPlan:
        turns = shape.turns.tokens(rng)
        spawns = rng.random() < shape.subagent_share
        count = int(rng.integers(1, MAX_SUBAGENTS + 1))
        at = int(rng.integers(1, turns)) if turns >= 2 else None
        return cls(turns, at if spawns else None, count if spawns and at is not None else 0)


class SessionDraws:
    """One session's reproducible draws, a stream per quantity (the sequence of replies does not depend on how
    many tool results or pauses were drawn), seeded by the agent and the session's number."""

    def __init__(self, shape: CodingShape, key: list[int]) -> None:
        self.shape = shape
        plan, out, tool, pause, summary = (np.random.default_rng(s) for s in np.random.SeedSequence(key).spawn(5))
        self._plan, self._out, self._tool, self._pause, self._summary = plan, out, tool, pause, summary

    def plan(self) -> SessionPlan:
        return SessionPlan.draw(self.shape, self._plan)

    def reply(self) -> int:
        return self.shape.reply.tokens(self._out)

    def tool_result(self) -> int:
        large = self._tool.random() < self.shape.tool_large_share
        return (self.shape.tool_large if large else self.shape.tool_small).tokens(self._tool)

    def subagent_turns(self) -> int:
        return self.shape.subagent_turns.tokens(self._plan)

    def delay_s(self) -> float:
        return self.shape.delay_s.draw(self._pause)

    def summary(self) -> int:
        return self.shape.summary.tokens(self._summary)


class CodingSession:
    """One coding session (or a subagent's): growing turns, a compaction when the next turn would not fit, and,
    for a parent, an ``End(SPAWNED)`` at its spawn turn — the agent runs the subagents, then ``resume``s it.

    Every size is in the server's tokens and closes the loop on the ``usage.prompt_tokens`` the server counted
    for the last turn, as ``workload.agentic.GrowSession`` does. Its turns are numbered across its resumptions.
    """

    def __init__(
        self,
        driver: CodingAgent,
        ctx: LoadContext,
        draws: SessionDraws,
        plan: SessionPlan,
        name: str,
        system: str,
        system_tokens: int,
        text: np.random.Generator,
    ) -> None:
        self.driver, self.ctx, self.draws, self.plan, self.name = driver, ctx, draws, plan, name
        shape, sizing = driver.shape, ctx.sizing
        self.text = text
        self.system = {"role": "system", "content": system}
        self.system_tokens = system_tokens
        self.messages: list[dict[str, Any]] = [self.system]
        self.limit = shape.context - shape.reserve(sizing)
        prefix = max(1, shape.prefix_tokens + OPENING_OVERHEAD_TOKENS - sizing.opening_overhead)
        self.next_user = words(text, sizing.words(prefix))
        opening = system_tokens + prefix + sizing.opening_overhead
        self.drawn = draws.reply()
        self.out = min(self.drawn, self.limit - opening)
        self.sent = 0  # requests sent, compactions included: the turn numbers of its ids
        self.work = 0  # work turns done
        self.compactions = 0
        self.compacting = False
        self.pending_tool = 0  # the tool result held back while the session compacts, and the reply drawn after it
        self.pending_reply = 0
        self.last: RequestRecord | None = None

    def request(self, turn: int) -> Request:
        self.messages.append({"role": "user", "content": self.next_user})
        ctx = self.ctx
        body = {"model": ctx.model, "messages": list(self.messages), "max_tokens": max(1, self.out),
                **self.driver.extra_body}  # fmt: skip
        ids = RequestIds(run=ctx.run_id, level=ctx.level, agent=self.name, turn=self.sent)
        self.sent += 1
        request = Request(body, ids)
        return request if self.compacting else asked(ctx, request, self.drawn)

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        final = records[-1]
        if not final.ok:
            return End(FAILED)
        self.last = final
        if self.compacting:
            # The summary replaces everything after the system prompt; the tool result the turn before brought
            # is read after it.
            self.compacting = False
            self.compactions += 1
            self.messages = [self.system]
            base = self.system_tokens + self.ctx.sizing.opening_overhead + final.completion_tokens
            self._next_turn(base, self.pending_tool, summary=final.content)
            return Next(0.0)
        self.messages.append({"role": "assistant", "content": final.content})
        self.work += 1
        if self.work >= self.plan.turns:
            return End(DONE)
        if self.plan.spawn_at == self.work:
            return End(SPAWNED)
        pause = self.draws.delay_s()
        self._after_work(self.draws.tool_result())
        return Next(pause)

    def resume(self, report_tokens: int) -> None:
        """Go on after the subagents: their reports are the next tool result."""
        self._after_work(max(1, report_tokens))

    def _after_work(self, tool: int) -> None:
        final, sizing = self.last, self.ctx.sizing
        assert final is not None  # a work turn has been answered
        grown = final.prompt_tokens + final.completion_tokens + sizing.turn_overhead
        nxt = self.draws.reply()
        if grown + tool + nxt <= self.limit:
            self.next_user = words(self.text, sizing.words(tool))
            self.out = self.drawn = nxt
            return
        # Compact: the whole context with the instruction; the summary fits the room the reserve kept.
        self.compacting, self.pending_tool, self.pending_reply = True, tool, nxt
        room = self.driver.shape.context - grown - instruction_tokens(sizing) - hold_margin(self.driver.shape.context)
        self.next_user = COMPACT_INSTRUCTION
        self.out = max(1, min(self.draws.summary(), room))
        self.drawn = self.out

    def _next_turn(self, base: int, tool: int, *, summary: str) -> None:
        """The first turn after a compaction: the summary and the held tool result in one user message, the
        tool result and the reply shortened only where the room cannot hold them."""
        sizing = self.ctx.sizing
        nxt = self.pending_reply
        room = self.limit - base - sizing.turn_overhead
        reply = max(1, min(nxt, room // 2))
        tool = max(1, min(tool, room - reply))
        reply = max(1, min(nxt, room - tool))
        self.next_user = f"{summary}\n\n{words(self.text, sizing.words(tool))}"
        self.out, self.drawn = reply, nxt


@dataclass
class CodingAgent:
    """One agent: coding sessions back to back until the level ends; a session that spawns subagents runs them
    alongside (``Spawn``) and goes on when they are done. Only the parent sessions are reported through
    ``ctx.session_done``: the agent count of a level counts parents, its subagents are load on top."""

    agent_id: str
    index: int
    shape: CodingShape
    seed: int
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    sessions_started: int = 0

    def conversations(self, ctx: LoadContext) -> Steps:
        sizing = ctx.sizing
        # Shared by every session (and every subagent) of the workload: seeded by the seed alone, cached once.
        system = system_prompt(self.seed, sizing.words(self.shape.system_tokens))
        sub_system = system_prompt(self.seed + stable_int("subagent"), sizing.words(self.shape.subagent_system_tokens))
        while not ctx.should_stop():
            n = self.sessions_started
            self.sessions_started += 1
            draws = SessionDraws(self.shape, [self.seed, self.index, n])
            plan = draws.plan()
            session = CodingSession(self, ctx, draws, plan, f"{self.agent_id}/s{n}", system,
                                    self.shape.system_tokens, self._text(ctx, n))  # fmt: skip
            end = yield session
            if end is not None and end.reason == SPAWNED:
                reports: list[int] = []
                children = [self._subagent(ctx, n, k, sub_system) for k in range(plan.subagents)]
                slots = asyncio.Semaphore(max(1, len(children)))  # every subagent at once
                for child in children:
                    yield Spawn(child, slots, _reporter(child, reports))
                while len(reports) < len(children):  # the parent waits on its subagents (a stop ends it here)
                    yield Wait(SUBAGENT_POLL_S)
                session.resume(sum(reports))
                end = yield session
            if end is None or end.reason == STOPPED:  # the level ended mid-session: not a finished session
                return
            if end.reason == FAILED:
                ctx.session_done(self.agent_id, ok=False)
                yield Wait(FAILURE_PAUSE_S)
            else:
                ctx.session_done(self.agent_id, ok=True)

    def _subagent(self, ctx: LoadContext, session: int, k: int, system: str) -> CodingSession:
        draws = SessionDraws(self.shape, [self.seed, self.index, session, k + 1])
        plan = SessionPlan(draws.subagent_turns(), None, 0)
        return CodingSession(self, ctx, draws, plan, f"{self.agent_id}.sub{k}/s{session}", system,
                             self.shape.subagent_system_tokens, self._text(ctx, session, k + 1))  # fmt: skip

    def _text(self, ctx: LoadContext, session: int, child: int = 0) -> np.random.Generator:
        # Salted with the run and level, as agentic's text: only the system prompts are meant to be shared.
        return np.random.default_rng([self.seed, self.index, ctx.level, stable_int(ctx.text_salt), session, child])


def _reporter(child: CodingSession, reports: list[int]) -> Callable[[Ending], None]:
    def on_end(_: Ending) -> None:
        # A subagent's report is its last reply; one that failed or was stopped reports what it had.
        reports.append(child.last.completion_tokens if child.last is not None else 1)

    return on_end


# Options the registry accepts for ``agentic-coding`` (keyword arguments of ``CodingShape.published``).
CODING_OPTIONS: tuple[str, ...] = (
    "turns",
    "output_tokens",
    "output_sigma",
    "delay_p50_s",
    "delay_p99_s",
    "subagent_share",
    "start_tokens",
    "system_tokens",
)


@dataclass
class CodingWorkload:
    """``agentic-coding``: sessions drawn from published coding-agent traces, compacting at the context."""

    shape_options: Mapping[str, Any] = field(default_factory=dict)
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"ignore_eos": True} on vLLM / SGLang
    name: str = field(init=False, default="agentic-coding")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.shape_options) - set(CODING_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown agentic-coding option {', '.join(unknown)}; known: {', '.join(CODING_OPTIONS)}")
        for key, value in self.shape_options.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"agentic-coding option {key} must be a number, got {value!r}")

    def shape(self, context: int) -> CodingShape:
        return CodingShape.published(context, **self.shape_options)

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        shape = self.shape(context)
        opening = shape.system_tokens + shape.prefix_tokens + OPENING_OVERHEAD_TOKENS
        if opening + shape.reserve(SIMULATOR_SIZING) + 1 > context:
            raise ConfigError(f"a context of {context} leaves no room for a turn after the {opening}-token opening")
        return [
            ConversationDriver(CodingAgent(agent_id, i, shape, seed, dict(self.extra_body)))
            for i, agent_id in enumerate(agent_ids(count))
        ]
