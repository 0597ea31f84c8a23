"""The matched synthetic arm: the agentic token shapes without the agent.

The source benchmark compared real agents with a synthetic load of single-turn random requests and found the
agents reaching 72% and 59% of its throughput (docs/background.md §1). To make that ratio say something about agent
structure rather than about sizes, this arm sends exactly the agentic turns' sizes — agent i's prompt and
output lengths come from the same seeded draws as agentic agent i's, in the same order — but every request is
a fresh, unique prompt: no conversation, no shared system prompt, nothing for the prefix cache to reuse.

Each agent sends its requests back to back (closed loop, like ``vllm bench serve --max-concurrency``); with
``pace=True`` it also sleeps the agentic think and tool time between them. Each request is reported as a
one-turn session. Sizes are the server's tokens: text is written at ``ctx.sizing``'s measured tokens per word.

Unique from the first token we write: a chat template's own fixed header (a few tokens) is still common to every
request, as it is to any chat workload, and stays below one KV block on the usual templates.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentload.agent.loop import ConversationDriver, Request, Steps, Wait
from agentload.endpoint.records import RequestIds
from agentload.errors import ConfigError
from agentload.workload.agentic import (
    DONE,
    FAILURE_PAUSE_S,
    SHAPE_OPTIONS,
    SINGLE_MESSAGE_OVERHEAD_TOKENS,
    AgenticShape,
    OneTurn,
    SizeStreams,
    agent_ids,
    grow_turn_sizes,
    stable_int,
    words,
)
from agentload.workload.base import AgentDriver, LoadContext


@dataclass
class SyntheticDriver:
    agent_id: str
    index: int
    shape: AgenticShape
    seed: int
    pace: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    fixed: tuple[int, int] | None = None  # every request this (prompt, output) in server tokens

    def conversations(self, ctx: LoadContext) -> Steps:
        sizes = SizeStreams(self.shape, self.seed, self.index)
        turns = itertools.repeat(self.fixed) if self.fixed is not None else grow_turn_sizes(self.shape, sizes)
        # Salted with the run and level so no prompt of this level was ever sent before (see agentic's text).
        salt = [stable_int(ctx.text_salt), stable_int("synthetic")]
        rng = np.random.default_rng([self.seed, self.index, ctx.level, *salt])
        n = 0
        while not ctx.should_stop():
            prompt, out = next(turns)
            content = words(rng, ctx.sizing.words(max(1, prompt - SINGLE_MESSAGE_OVERHEAD_TOKENS)))
            body = {"model": ctx.model, "messages": [{"role": "user", "content": content}], "max_tokens": out}
            ids = RequestIds(run=ctx.run_id, level=ctx.level, agent=f"{self.agent_id}/r{n}", turn=0)
            end = yield OneTurn(Request({**body, **self.extra_body}, ids))
            n += 1
            ok = end is not None and end.reason == DONE
            ctx.session_done(self.agent_id, ok=ok)
            pause = sizes.pause_s() if self.pace else 0.0
            if not ok:
                pause = max(pause, FAILURE_PAUSE_S)  # a dead server is not hammered in a tight loop
            if pause > 0:
                yield Wait(pause)


@dataclass
class SyntheticWorkload:
    """``synthetic``: unique single-turn requests shaped like the agentic turns (same shape options)."""

    shape_options: Mapping[str, Any] = field(default_factory=dict)
    pace: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    name: str = "synthetic"
    # Fixed sizes (server tokens) for every request, as ``vllm bench serve --random-input-len/--random-output-len``
    # sends; unset, the sizes are the agentic grow shape's draws.
    input_len: int | None = None
    output_len: int | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.shape_options) - set(SHAPE_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown synthetic option {', '.join(unknown)}; known: {', '.join(SHAPE_OPTIONS)}")
        if (self.input_len is None) != (self.output_len is None):
            raise ConfigError("a fixed-size synthetic load needs both input_len and output_len")
        for value in (self.input_len, self.output_len):
            if value is not None and value < 1:
                raise ConfigError(f"input_len and output_len must be at least 1 token, got {value}")

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # The grow shape: its turns are the distribution of prompt sizes an agentic run sends.
        shape = AgenticShape.published(context, "grow", **self.shape_options)
        return [
            ConversationDriver(
                SyntheticDriver(agent_id, i, shape, seed, self.pace, dict(self.extra_body), self.fixed_sizes())
            )
            for i, agent_id in enumerate(agent_ids(count))
        ]

    def fixed_sizes(self) -> tuple[int, int] | None:
        if self.input_len is None or self.output_len is None:
            return None
        return self.input_len, self.output_len

    def matched(self, prompt_tokens: int, output_tokens: int) -> SyntheticWorkload:
        """This arm with every request of the given sizes: an agentic level's mean prompt and reply, so the two
        arms differ in structure (conversation, reuse, think time), not in how big their requests are."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise ConfigError(
                f"a synthetic request needs a prompt and a reply, got {prompt_tokens} and {output_tokens}"
            )
        return dataclasses.replace(self, input_len=prompt_tokens, output_len=output_tokens,
                                   name=f"synthetic {prompt_tokens:,} in / {output_tokens:,} out")  # fmt: skip
