"""The shape of an agent's conversation: token sizes and the time between turns, from the published figures.

One description serves every place that models an agent: bench's agentic drivers (``workload.agentic``) run it
against a server, and the planner's virtual-time kernel (``sim.virtual``) is compiled from it, so the planner's
curve and bench measure the same agent. It lives here, low in the package graph, so the simulator can take it
without importing the workloads (which import the suite, which imports the simulator).

The figures and their sources are explained in ``workload.agentic``'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agentload.errors import ConfigError

# -- the published shape (docs/background.md §1) -------------------------------------------------------------
PUBLISHED_TURNS = 43  # median turns per session (one essay's figures)
PUBLISHED_OUTPUT_TOKENS = 444  # median reply
PUBLISHED_IO_RATIO = 131.0  # input : output tokens (Codex traces on SWE-bench Pro)
PUBLISHED_START_TOKENS = 12_000  # context of a session's first turn (same traces)
# When the target is too small for a 12k opening, the opening takes this share of it (12k of 40k ≈ 0.3).
START_SHARE_CAP = 0.3
# Of the opening, the part every agent shares (harness instructions and tool schemas); the rest is the
# session's own task and the files it read first. No source gives the split; a third keeps both substantial.
SYSTEM_SHARE = 1 / 3
# Spread of per-turn sizes (lognormal sigmas): replies vary less than tool results, which range from a one-line
# command status to a whole file. Published figures give medians only; these are judgement, not measurement.
OUTPUT_SIGMA = 0.6
TOOL_RESULT_SIGMA = 0.8
# Time between turns: tool latency (tests, builds: heavy-tailed) then the harness's own think time. No source
# gives figures; together they average ~2.2 s, near the planner's 2 s so planned and measured knees compare.
TOOL_LATENCY_MEDIAN_S = 1.0
TOOL_LATENCY_SIGMA = 1.0
THINK_MEDIAN_S = 0.5
THINK_SIGMA = 0.5
# Draws are capped at this many sigmas above the median, so one freak draw cannot blow a session's budget.
CAP_SIGMAS = 2.5

# -- the simulator's chat template (ChatML, sim/chat.py), in its tokens; a few tokens off on real templates ---
OPENING_OVERHEAD_TOKENS = 3  # system header, user header, the assistant generation prompt
SINGLE_MESSAGE_OVERHEAD_TOKENS = 2  # user header and the generation prompt
TURN_OVERHEAD_TOKENS = 3  # the reply's end marker, the next user header, the next generation prompt


@dataclass(frozen=True)
class Lognormal:
    """A positive size or duration: lognormal around ``median``, capped at ``CAP_SIGMAS`` sigmas above it."""

    median: float
    sigma: float

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)

    @property
    def cap(self) -> float:
        return self.median * math.exp(CAP_SIGMAS * self.sigma)

    def draw(self, rng: np.random.Generator) -> float:
        if self.sigma == 0:
            return self.median
        return min(float(rng.lognormal(math.log(self.median), self.sigma)), self.cap)

    def tokens(self, rng: np.random.Generator) -> int:
        return max(1, round(self.draw(rng)))

    @classmethod
    def with_mean(cls, mean: float, sigma: float) -> Lognormal:
        return cls(mean / math.exp(sigma**2 / 2), sigma)


Growth = Literal["grow", "hold"]


@dataclass(frozen=True)
class AgenticShape:
    """What one agent's sessions look like: token sizes (simulator tokens) and the time between turns."""

    context: int  # the target: grow sessions end before passing it, held ones stay just under it
    growth: Growth
    system_tokens: int  # shared by every agent
    prefix_tokens: int  # the session's own opening (task, first files)
    output: Lognormal  # reply per turn (sent as max_tokens)
    tool_result: Lognormal  # appended per turn
    tool_latency_s: Lognormal
    think_s: Lognormal
    turns: int  # grow: turns the sizes are scaled for; hold: turns per session

    @property
    def opening_tokens(self) -> int:
        return self.system_tokens + self.prefix_tokens + OPENING_OVERHEAD_TOKENS

    @classmethod
    def published(
        cls,
        context: int,
        growth: Growth = "grow",
        *,
        turns: int = PUBLISHED_TURNS,
        io_ratio: float = PUBLISHED_IO_RATIO,
        start_tokens: int | None = None,
        system_tokens: int | None = None,
        output_tokens: float | None = None,
        tool_result_tokens: float | None = None,
        tool_latency_s: float = TOOL_LATENCY_MEDIAN_S,
        think_s: float = THINK_MEDIAN_S,
        output_sigma: float = OUTPUT_SIGMA,
        tool_result_sigma: float = TOOL_RESULT_SIGMA,
        tool_latency_sigma: float = TOOL_LATENCY_SIGMA,
        think_sigma: float = THINK_SIGMA,
    ) -> AgenticShape:
        """The published agent shape scaled to ``context`` (see the module docstring); any size can be overridden.

        ``output_tokens`` and ``tool_result_tokens`` are means; the time figures are medians.
        """
        if context < 1024:
            raise ConfigError(f"agentic sessions need a context of at least 1024 tokens, got {context}")
        if turns < 1:
            raise ConfigError(f"turns must be positive, got {turns}")
        if io_ratio <= 1:
            raise ConfigError(f"the input:output ratio must exceed 1, got {io_ratio}")
        for label, value in (("tool latency", tool_latency_s), ("think time", think_s)):
            if value < 0:
                raise ConfigError(f"{label} must not be negative, got {value}")
        start = (
            start_tokens if start_tokens is not None else min(PUBLISHED_START_TOKENS, int(START_SHARE_CAP * context))
        )
        if not 0 < start < context:
            raise ConfigError(f"the opening ({start} tokens) must be positive and below the context ({context})")
        system = system_tokens if system_tokens is not None else round(start * SYSTEM_SHARE)
        if not 0 <= system < start:
            raise ConfigError(f"the system prompt ({system} tokens) must be shorter than the opening ({start})")
        # Grow: the prompt climbs ~linearly from ``start`` by ``step`` a turn, so its mean is about midway. The
        # published ratio splits that step into a reply and a tool result; the tool result keeps its share
        # whatever reply is asked for, so a longer reply makes a grow session end sooner rather than shrink
        # what the agent reads.
        step = (context - start) / turns
        mean_prompt = (start + context - step) / 2
        split_reply = mean_prompt / io_ratio
        out_mean = output_tokens if output_tokens is not None else split_reply
        tool_mean = tool_result_tokens if tool_result_tokens is not None else step - split_reply - TURN_OVERHEAD_TOKENS
        if out_mean < 1 or tool_mean < 1:
            raise ConfigError(
                f"a context of {context} is too small for {turns} turns at {io_ratio:g}:1 (reply {out_mean:.0f}, "
                f"tool result {tool_mean:.0f} tokens a turn); use a larger context or fewer turns"
            )
        exchange = _exchange_room(context, growth, system, start, out_mean, tool_mean)
        prefix = start - system
        if growth == "hold":
            prefix = context - system - OPENING_OVERHEAD_TOKENS - exchange
        shape = cls(
            context=context,
            growth=growth,
            system_tokens=system,
            prefix_tokens=prefix,
            output=Lognormal.with_mean(out_mean, output_sigma),
            tool_result=Lognormal.with_mean(tool_mean, tool_result_sigma),
            tool_latency_s=Lognormal(tool_latency_s, tool_latency_sigma if tool_latency_s > 0 else 0.0),
            think_s=Lognormal(think_s, think_sigma if think_s > 0 else 0.0),
            turns=turns,
        )
        shape.check()
        return shape

    def check(self) -> None:
        if self.opening_tokens + 1 > self.context:
            raise ConfigError(
                f"the opening ({self.opening_tokens} tokens) leaves no room for a reply in {self.context}"
            )
        for label, dist in (("output", self.output), ("tool result", self.tool_result)):
            if dist.median < 1 or dist.sigma < 0:
                raise ConfigError(f"{label} sizes must be at least one token with a non-negative spread")


def _exchange_room(context: int, growth: Growth, system: int, start: int, out_mean: float, tool_mean: float) -> int:
    """The tokens one exchange keeps room for, checked against the context.

    The stable part (a held session's prefix; a grow session's opening, so it reaches a second turn) leaves room for
    a tool result and twice the mean reply (the one carried back and the next), so the context peaks at the target
    on average; a long draw is clamped (see the driver). A ``ConfigError`` names the largest reply that fits.
    """
    exchange = round(2 * out_mean + tool_mean) + TURN_OVERHEAD_TOKENS
    stable = (system if growth == "hold" else start) + OPENING_OVERHEAD_TOKENS
    if stable + exchange < context:
        return exchange
    # The largest whole reply that fits, through the same rounding.
    room = context - 1 - stable - TURN_OVERHEAD_TOKENS
    most = math.floor((room + 0.5 - tool_mean) / 2)
    while most >= 1 and round(2 * most + tool_mean) > room:
        most -= 1
    raise ConfigError(
        f"a context of {context} leaves no room for "
        f"{'a held prefix' if growth == 'hold' else f'a second turn after the {start}-token opening'} "
        f"and a {tool_mean:.0f}-token tool result with twice the {out_mean:.0f}-token reply"
        + (f"; the reply can be at most {most} tokens here" if most >= 1 else "")
    )
