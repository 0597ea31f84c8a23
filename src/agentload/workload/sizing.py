"""agentload's text and what it costs in the server's tokens, measured on the server: context is counted in
the server's tokens, never in ours.

Workloads write prompts with ``words``: random common words from the vocabulary (``words.WORDS``). On the
simulator each word is one token, on a real model it is whatever the model's tokenizer makes of it (seen: 1.4
tokens a word), and the chat template adds its own tokens around every message. A workload that aims at a context
must therefore size its text in the tokens the *server* counts (``TokenSizing.words``: words for a number of
server tokens), or pool ÷ context and every context figure is off by the tokenizer's ratio.

``measure_sizing`` asks the server to count three prompts of our own text with ``max_tokens=1`` (the only
counter every OpenAI-compatible engine offers is ``usage.prompt_tokens``; vLLM's and SGLang's ``/tokenize`` count
the same): a short opening, the same opening with twice the words, and the opening plus one exchange. From them:
tokens per word (the slope), the template's cost of an opening (system + user + generation prompt) and of one
more exchange (the reply's end, the next user message's header, the next generation prompt). The drivers then
size text with these figures and close the loop on each turn's ``usage.prompt_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentload.agent.loop import ChatBackend
from agentload.endpoint.records import RequestIds, RequestRecord, UsageSource
from agentload.errors import EndpointError
from agentload.workload.words import VOCAB

# Words in the measuring prompts: enough that the random mix of words averages out (the spread of tokens per word
# over 600 random words is well under 1 % on BPE vocabularies), few enough to cost nothing to prefill.
MEASURE_WORDS = 600
# A tokenizer that makes more than this many tokens of one common English word is not a text tokenizer we can
# size for (or the server counts something else); clamp rather than build absurd prompts.
MAX_TOKENS_PER_WORD = 4.0


def words(rng: np.random.Generator, n: int) -> str:
    """``n`` random words: ``n`` tokens on the simulator (no trailing space, so the last word ends the message)."""
    if n <= 0:
        return ""
    return " ".join(VOCAB[rng.integers(0, len(VOCAB), n)])


@dataclass(frozen=True)
class TokenSizing:
    """Server tokens per word of our text and the chat template's overheads, with where the figures came from."""

    tokens_per_word: float
    opening_overhead: int  # system + user headers and the generation prompt, around an opening's words
    turn_overhead: int  # what one more exchange (assistant reply end, user header, generation prompt) adds
    source: str

    def words(self, tokens: float) -> int:
        """Words of our text that make about ``tokens`` server tokens (at least one)."""
        return max(1, round(tokens / self.tokens_per_word))


# The simulator's tokenizer (sim/tokens.py: one token per word) and its ChatML template (sim/chat.py); used
# where nothing was measured, e.g. by workloads driven without a server.
SIMULATOR_SIZING = TokenSizing(
    tokens_per_word=1.0, opening_overhead=3, turn_overhead=3, source="the simulator's tokenizer (not measured)"
)


async def measure_sizing(backend: ChatBackend, model: str, *, seed: int = 0) -> TokenSizing:
    """Count three prompts on the server (see the module docstring); raise ``EndpointError`` when it cannot."""
    rng = np.random.default_rng([seed, 0x51DE])
    system, user = words(rng, MEASURE_WORDS // 3), words(rng, MEASURE_WORDS - MEASURE_WORDS // 3)
    more_system, more_user = words(rng, MEASURE_WORDS // 3), words(rng, MEASURE_WORDS - MEASURE_WORDS // 3)
    reply, tool = words(rng, 50), words(rng, 150)
    opening = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    doubled = [
        {"role": "system", "content": f"{system} {more_system}"},
        {"role": "user", "content": f"{user} {more_user}"},
    ]
    exchange = [*opening, {"role": "assistant", "content": reply}, {"role": "user", "content": tool}]

    async def count(messages: list[dict[str, str]], turn: int) -> int:
        body = {"model": model, "messages": messages, "max_tokens": 1}
        final: RequestRecord = (await backend.complete(body, RequestIds(agent="sizing", turn=turn)))[-1]
        if not final.ok:
            raise EndpointError(f"cannot measure the server's token counts: {final.error_message or final.outcome}")
        if final.usage_source is not UsageSource.SERVER or final.prompt_tokens <= 0:
            raise EndpointError("the server reports no usage.prompt_tokens, so its token counts cannot be measured")
        return final.prompt_tokens

    base = await count(opening, 0)
    twice = await count(doubled, 1)
    longer = await count(exchange, 2)
    per_word = (twice - base) / MEASURE_WORDS
    if not 0.2 <= per_word <= MAX_TOKENS_PER_WORD:
        raise EndpointError(
            f"the server counted {per_word:.2f} tokens per word of plain English text "
            f"(expected 0.2-{MAX_TOKENS_PER_WORD:g})"
        )
    opening_overhead = max(0, round(base - per_word * MEASURE_WORDS))
    turn_overhead = max(0, round(longer - base - per_word * 200))
    return TokenSizing(
        tokens_per_word=per_word,
        opening_overhead=opening_overhead,
        turn_overhead=turn_overhead,
        source=f"measured on the server: {per_word:.3f} tokens per word, template {opening_overhead} + "
        f"{turn_overhead} per exchange",
    )
