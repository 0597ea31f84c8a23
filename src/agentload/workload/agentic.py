"""Agentic sessions: the traffic shape of coding agents, scaled to a context target.

An agent session is one long conversation resent and extended every turn (docs/background.md §1): a system prompt shared
by every agent (so the server prefix-caches it once), a per-session prefix (the task, the files it read first),
then turns whose context grows by the model's reply and a tool result. Outputs are short against long, growing
prompts; between turns the agent runs a tool and thinks, slept on ``ctx.clock`` (virtual in simulated runs).

Two variants:

* ``grow`` (workload ``agentic``): the context grows from the opening prompt toward the target. A session ends
  when its next turn would pass the target, and the agent starts a fresh conversation — every session is a
  whole conversation, reported through ``ctx.session_done``.
* ``hold`` (workload ``agentic-hold``): the context stays near the target — a stable long prefix plus the last
  exchange, the idea of ``sim/virtual.py``'s held sessions — so every agent occupies about ``context`` tokens
  of KV cache all the time, which is what a knee search wants to hold fixed. A held session lasts the published
  median number of turns, then the agent starts a fresh one.

Sizes are in the simulator's tokens: its tokenizer makes one token of every whitespace-separated word (with its
trailing space), and the text here is random common English words, so N words are N tokens on the simulator.
On a real server such words cost about 1–1.3 tokens each; the drivers end sessions from the server's own
``prompt_tokens`` and scale new text by the tokens per word measured on the session's first turn, so the target
holds there too, but every other size is approximate.

Defaults follow the published shapes (docs/background.md §1): sessions start at ~12k tokens, last ~43 turns, and send
131 input tokens per output token. Those figures describe sessions reaching ~100k tokens — 12k growing linearly
over 43 turns to a mean prompt of 131 × 444 ≈ 58k ends near 104k — so at another target the turn count and the
ratio are held and the per-turn sizes scale: at 40,960 the reply is ~200 tokens and the tool result ~470 (at
~104k they are the published 444 and ~1.7k). Prefix reuse then comes out at ~97%, inside the published 94–96%+.

The scaled reply is small at small targets (~10 tokens a turn at 2,048), where real coding agents still write
hundreds. ``output_tokens`` (``bench --reply-tokens N``) sets the mean reply at any target; the tool result keeps
its scaled size, so a longer reply makes a grow session end sooner rather than shrink what the agent reads. A held
session's prefix leaves room for a tool result and twice the mean reply, so the context must hold that too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentload.agent.loop import STOPPED, ConversationDriver, End, Next, Request, Steps, Wait
from agentload.agent.shape import (  # the shape, re-exported: it is this workload's
    CAP_SIGMAS,
    OPENING_OVERHEAD_TOKENS,
    OUTPUT_SIGMA,
    PUBLISHED_IO_RATIO,
    PUBLISHED_OUTPUT_TOKENS,
    PUBLISHED_START_TOKENS,
    PUBLISHED_TURNS,
    SINGLE_MESSAGE_OVERHEAD_TOKENS,
    START_SHARE_CAP,
    SYSTEM_SHARE,
    THINK_MEDIAN_S,
    THINK_SIGMA,
    TOOL_LATENCY_MEDIAN_S,
    TOOL_LATENCY_SIGMA,
    TOOL_RESULT_SIGMA,
    TURN_OVERHEAD_TOKENS,
    AgenticShape,
    Growth,
    Lognormal,
)
from agentload.endpoint.records import RequestIds, RequestRecord, UsageSource
from agentload.errors import ConfigError
from agentload.workload.base import AgentDriver, LoadContext
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing, words
from agentload.workload.words import VOCAB, WORDS, stable_int

__all__ = [  # the text every workload writes and the agent shape, re-exported
    "CAP_SIGMAS",
    "OPENING_OVERHEAD_TOKENS",
    "OUTPUT_SIGMA",
    "PUBLISHED_IO_RATIO",
    "PUBLISHED_OUTPUT_TOKENS",
    "PUBLISHED_START_TOKENS",
    "PUBLISHED_TURNS",
    "SINGLE_MESSAGE_OVERHEAD_TOKENS",
    "START_SHARE_CAP",
    "SYSTEM_SHARE",
    "THINK_MEDIAN_S",
    "THINK_SIGMA",
    "TOOL_LATENCY_MEDIAN_S",
    "TOOL_LATENCY_SIGMA",
    "TOOL_RESULT_SIGMA",
    "TURN_OVERHEAD_TOKENS",
    "VOCAB",
    "WORDS",
    "AgenticShape",
    "Growth",
    "Lognormal",
    "stable_int",
    "words",
]

# A failed turn ends its session; the agent waits this long before a fresh one so a dead server is not hammered.
FAILURE_PAUSE_S = 1.0


class SizeStreams:
    """One agent's reproducible draws: a separate stream per quantity, so the sequence of reply lengths does not
    depend on how many pauses were drawn — the synthetic arm replays agent i's very sizes without the sleeps."""

    def __init__(self, shape: AgenticShape, seed: int, index: int) -> None:
        out, tool, pause = (np.random.default_rng(s) for s in np.random.SeedSequence([seed, index]).spawn(3))
        self.shape = shape
        self._out = out
        self._tool = tool
        self._pause = pause

    def output(self) -> int:
        return self.shape.output.tokens(self._out)

    def tool_result(self) -> int:
        return self.shape.tool_result.tokens(self._tool)

    def pause_s(self) -> float:
        """Tool latency plus think time before the next turn."""
        return self.shape.tool_latency_s.draw(self._pause) + self.shape.think_s.draw(self._pause)


def grow_turn_sizes(shape: AgenticShape, sizes: SizeStreams) -> Iterator[tuple[int, int]]:
    """Endless (prompt tokens, output tokens) of back-to-back grow sessions, as the simulator would count them.

    The same draws in the same order as ``AgenticDriver`` makes them, so it is the agentic turn distribution
    without a server (the synthetic arm's shapes).
    """
    while True:
        prompt = shape.opening_tokens
        out = min(sizes.output(), shape.context - prompt)
        while True:
            yield prompt, out
            tool, nxt = sizes.tool_result(), sizes.output()
            grown = prompt + out + tool + TURN_OVERHEAD_TOKENS
            if grown + nxt > shape.context:
                break
            prompt, out = grown, nxt


def tokens_per_word(record: RequestRecord, words_sent: int) -> float:
    """What one of our words costs on this server, from a prompt that was all our text (1.0 on the simulator)."""
    if record.usage_source is not UsageSource.SERVER or words_sent <= 0 or record.prompt_tokens <= 0:
        return 1.0
    return min(4.0, max(1.0, record.prompt_tokens / words_sent))


@dataclass
class AgenticDriver:
    """One agent: sessions back to back until the level ends, each a conversation (``GrowSession`` or
    ``HoldSession``) that ``agent.loop.ConversationDriver`` runs on ``converse``, which sends its turns and sleeps
    its pauses; this only produces the sessions and hears how each ended.

    Every size is in the server's tokens: text is written at ``ctx.sizing``'s tokens per word, and each turn
    closes the loop on the ``usage.prompt_tokens`` the server counted for the last one (see ``HoldSession``).
    """

    agent_id: str
    index: int
    shape: AgenticShape
    seed: int
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    sessions_started: int = 0

    def conversations(self, ctx: LoadContext) -> Steps:
        sizes = SizeStreams(self.shape, self.seed, self.index)
        # The same words for every agent of the workload (seeded by the seed alone), so the server caches it once.
        system = system_prompt(self.seed, ctx.sizing.words(self.shape.system_tokens))
        session_kind = GrowSession if self.shape.growth == "grow" else HoldSession
        while not ctx.should_stop():
            n = self.sessions_started
            self.sessions_started += 1
            end = yield session_kind(self, ctx, sizes, n, system)
            if end is None or end.reason == STOPPED:  # the level ended mid-session: not a finished session
                return
            if end.reason == FAILED:
                ctx.session_done(self.agent_id, ok=False)
                yield Wait(FAILURE_PAUSE_S)
            else:
                ctx.session_done(self.agent_id, ok=True)

    def text_rng(self, ctx: LoadContext, session: int) -> np.random.Generator:
        # Salted with the run (``ctx.text_salt``: its id, or a constant under ``bench --same-text``) and level: the
        # same agent in the next level (or run) must not find its previous session's prefix still cached — only the
        # system prompt is meant to be shared.
        return np.random.default_rng([self.seed, self.index, ctx.level, stable_int(ctx.text_salt), session])

    def request(
        self, ctx: LoadContext, messages: list[dict[str, Any]], max_tokens: int, session: int, turn: int
    ) -> Request:
        body = {"model": ctx.model, "messages": list(messages), "max_tokens": max_tokens, **self.extra_body}
        ids = RequestIds(run=ctx.run_id, level=ctx.level, agent=f"{self.agent_id}/s{session}", turn=turn)
        return Request(body, ids)

    def opening(self, rng: np.random.Generator, system: str, sizing: TokenSizing) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": words(rng, sizing.words(self._prefix_tokens(sizing)))},
        ]

    def _prefix_tokens(self, sizing: TokenSizing) -> int:
        # The shape sized the prefix around the simulator's template; the server's template costs what it costs.
        sim = SIMULATOR_SIZING
        extra = (sim.opening_overhead - sizing.opening_overhead) + (sim.turn_overhead - sizing.turn_overhead)
        return max(1, self.shape.prefix_tokens + (extra if self.shape.growth == "hold" else 0))

    def planned_opening(self, sizing: TokenSizing) -> int:
        return self.shape.system_tokens + self._prefix_tokens(sizing) + sizing.opening_overhead


# How a session ended (``End.reason``); a session the level stopped ends ``agent.loop.STOPPED``.
DONE = "done"
FAILED = "failed"


class GrowSession:
    """One growing conversation: each turn resends the last with the reply and a tool result appended; it ends
    rather than pass the target (a real agent would compact or start over)."""

    def __init__(self, driver: AgenticDriver, ctx: LoadContext, sizes: SizeStreams, session: int, system: str):
        self.driver, self.ctx, self.sizes, self.session = driver, ctx, sizes, session
        self.rng = driver.text_rng(ctx, session)
        self.messages = driver.opening(self.rng, system, ctx.sizing)
        self.drawn = sizes.output()
        self.out = min(self.drawn, driver.shape.context - driver.planned_opening(ctx.sizing))
        self.tool = 0

    def request(self, turn: int) -> Request:
        if turn > 0:
            self.messages.append({"role": "user", "content": words(self.rng, self.ctx.sizing.words(self.tool))})
        return asked(
            self.ctx, self.driver.request(self.ctx, self.messages, max(1, self.out), self.session, turn), self.drawn
        )

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        final = records[-1]
        if not final.ok:
            return End(FAILED)
        self.messages.append({"role": "assistant", "content": final.content})
        sizes = self.sizes
        tool, nxt = sizes.tool_result(), sizes.output()
        pause_s = sizes.pause_s()
        # The next prompt is this one as the server counted it, the reply, and the tool result.
        grown = final.prompt_tokens + final.completion_tokens + tool + self.ctx.sizing.turn_overhead
        if grown + nxt > self.driver.shape.context:
            return End(DONE)
        self.tool, self.out, self.drawn = tool, nxt, nxt
        return Next(pause_s)


class HoldSession:
    """A stable opening plus the last exchange, held at the target in the server's tokens, for ``shape.turns``.

    The opening was sized for the target at the measured tokens per word; whatever the server counted for it
    instead (``base``) is made up in the tool result, and ``bias`` learns what the prediction of each next
    prompt misses (the model's reply text is re-tokenised when it is sent back, which need not give its
    completion token count), so the mean prompt + reply sits at the target on any tokenizer.
    """

    def __init__(self, driver: AgenticDriver, ctx: LoadContext, sizes: SizeStreams, session: int, system: str):
        self.driver, self.ctx, self.sizes, self.session = driver, ctx, sizes, session
        shape, sizing = driver.shape, ctx.sizing
        self.rng = driver.text_rng(ctx, session)
        self.opening = driver.opening(self.rng, system, sizing)
        self.planned = driver.planned_opening(sizing)
        self.margin = hold_margin(shape.context)
        self.drawn = sizes.output()
        self.out = min(self.drawn, shape.context - self.planned - self.margin)
        self.tool = 0
        self.base = 0  # the opening as the server counted it
        self.bias = 0.0
        self.predicted = 0
        self.final: RequestRecord | None = None

    def request(self, turn: int) -> Request:
        driver, ctx, shape, sizing = self.driver, self.ctx, self.driver.shape, self.ctx.sizing
        final = self.final
        if final is None:
            return asked(ctx, driver.request(ctx, self.opening, max(1, self.out), self.session, 0), self.drawn)
        # Only the last exchange follows the stable prefix; clamp a long draw so the context stays under the
        # target (the prefix was sized for twice the mean reply, so this is rare).
        carried = final.completion_tokens + sizing.turn_overhead + self.bias
        room = math.floor(shape.context - self.base - carried) - self.margin
        nxt = max(1, min(self.out, room - 1))
        tool = max(1, min(self.tool + self.planned - self.base, room - nxt))
        messages = [
            *self.opening,
            {"role": "assistant", "content": final.content},
            {"role": "user", "content": words(self.rng, sizing.words(tool))},
        ]
        self.predicted = self.base + final.completion_tokens + sizing.turn_overhead + tool
        return asked(ctx, driver.request(ctx, messages, nxt, self.session, turn), self.drawn)

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        reply = records[-1]
        if not reply.ok:
            return End(FAILED)
        if self.final is None:
            self.base = reply.prompt_tokens
        else:
            self.bias += 0.5 * ((reply.prompt_tokens - self.predicted) - self.bias)
        self.final = reply
        if turn + 1 >= self.driver.shape.turns:
            return End(DONE)
        self.tool = self.sizes.tool_result()
        self.out = self.drawn = self.sizes.output()
        return Next(self.sizes.pause_s())


def asked(ctx: LoadContext, request: Request, drawn: int) -> Request:
    """``request``, with the level told when it asks for fewer output tokens than the workload drew (a held
    session shortens a long draw to stay at its context; a grow session's first reply fits its opening)."""
    cap = request.body.get("max_tokens")
    if isinstance(cap, int) and cap < drawn:
        ctx.reply_clamped(request.ids, drawn)
    return request


class OneTurn:
    """A conversation of one request (a synthetic request, a lone trace row): done when it succeeds."""

    def __init__(self, request: Request) -> None:
        self._request = request

    def request(self, turn: int) -> Request:
        return self._request

    async def reply(self, turn: int, records: list[RequestRecord]) -> End:
        return End(DONE if records[-1].ok else FAILED)


def hold_margin(context: int) -> int:
    """Tokens a held turn's clamp keeps below the target: a prediction of the next prompt can miss by a token or
    two (a re-tokenised reply, a template that counts a turn differently), and at a target equal to the server's
    max_model_len one token over is a rejected request. Only long draws are clamped, so the mean barely moves."""
    return 2 + math.ceil(0.002 * context)


def agent_ids(count: int) -> list[str]:
    """``agent-0`` … with a fixed width, so they sort in order (the suite runner names agents the same way)."""
    if count < 1:
        raise ConfigError(f"the agent count must be positive, got {count}")
    width = len(str(count - 1))
    return [f"agent-{i:0{width}d}" for i in range(count)]


def system_prompt(seed: int, n_words: int) -> str:
    """The system prompt every agent of a workload shares (depends on the seed only, so it is cached once)."""
    return words(np.random.default_rng([seed, stable_int("system")]), n_words)


# Options the registry accepts for the agentic workloads (keyword arguments of ``AgenticShape.published``).
SHAPE_OPTIONS: tuple[str, ...] = (
    "turns",
    "io_ratio",
    "start_tokens",
    "system_tokens",
    "output_tokens",
    "tool_result_tokens",
    "tool_latency_s",
    "think_s",
    "output_sigma",
    "tool_result_sigma",
    "tool_latency_sigma",
    "think_sigma",
)


@dataclass
class AgenticWorkload:
    """``agentic`` (growing sessions) or ``agentic-hold`` (sessions held near the target)."""

    growth: Growth = "grow"
    shape_options: Mapping[str, Any] = field(default_factory=dict)
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"ignore_eos": True} on vLLM / SGLang
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = "agentic" if self.growth == "grow" else "agentic-hold"
        unknown = sorted(set(self.shape_options) - set(SHAPE_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown agentic option {', '.join(unknown)}; known: {', '.join(SHAPE_OPTIONS)}")

    def shape(self, context: int) -> AgenticShape:
        return AgenticShape.published(context, self.growth, **self.shape_options)

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        shape = self.shape(context)
        return [
            ConversationDriver(AgenticDriver(agent_id, i, shape, seed, dict(self.extra_body)))
            for i, agent_id in enumerate(agent_ids(count))
        ]
