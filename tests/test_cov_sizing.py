"""Measuring what our text costs in a server's tokens, against a fake server whose tokenizer and chat template are
known: 1.5 tokens a word, 5 tokens of header per message and 3 for the generation prompt. The measurement must
give those figures back, and refuse a server that cannot be measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from agentload.clock import run_virtual
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord, UsageSource
from agentload.errors import EndpointError
from agentload.sim.chat import ChatRequest, render_chat
from agentload.sim.tokens import tokenize
from agentload.workload.sizing import MEASURE_WORDS, SIMULATOR_SIZING, TokenSizing, measure_sizing

HEADER, GENERATION_PROMPT = 5, 3


class CountingServer:
    """Counts a prompt as ``per_word`` tokens a word plus the template's headers; records the bodies it got."""

    def __init__(self, per_word: float = 1.5, **record: Any) -> None:
        self.per_word = per_word
        self.record = record
        self.bodies: list[Mapping[str, Any]] = []

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        self.bodies.append(body)
        messages = body["messages"]
        n_words = sum(len(m["content"].split()) for m in messages)
        tokens = round(self.per_word * n_words) + HEADER * len(messages) + GENERATION_PROMPT
        fields = {"ids": ids, "t_sent": 0.0, "t_done": 0.1, "prompt_tokens": tokens, "completion_tokens": 1}
        return [RequestRecord.model_validate({**fields, **self.record})]


def test_the_measurement_gives_back_the_servers_tokenizer_and_template() -> None:
    server = CountingServer()
    sizing = run_virtual(measure_sizing(server, "m", seed=3))
    assert sizing.tokens_per_word == 1.5
    assert sizing.opening_overhead == 2 * HEADER + GENERATION_PROMPT  # system + user headers, generation prompt
    assert sizing.turn_overhead == 2 * HEADER  # the assistant reply's and the next user message's headers
    # Three prompts of 600 words (doubled for the second), each asking for one token of output.
    assert [len(b["messages"]) for b in server.bodies] == [2, 2, 4]
    assert all(b["max_tokens"] == 1 and b["model"] == "m" for b in server.bodies)
    assert sum(len(m["content"].split()) for m in server.bodies[0]["messages"]) == MEASURE_WORDS


def test_the_same_seed_sends_the_same_text() -> None:
    a, b = CountingServer(), CountingServer()
    run_virtual(measure_sizing(a, "m", seed=9))
    run_virtual(measure_sizing(b, "m", seed=9))
    assert a.bodies == b.bodies


def test_a_failed_count_is_an_endpoint_error() -> None:
    server = CountingServer(outcome=Outcome.HTTP_ERROR, http_status=500, error_message="HTTP 500: boom")
    with pytest.raises(EndpointError, match="cannot measure the server's token counts: HTTP 500: boom"):
        run_virtual(measure_sizing(server, "m"))


def test_a_server_without_usage_cannot_be_measured() -> None:
    server = CountingServer(usage_source=UsageSource.COUNTED)
    with pytest.raises(EndpointError, match=r"reports no usage\.prompt_tokens"):
        run_virtual(measure_sizing(server, "m"))


@pytest.mark.parametrize("per_word", [0.1, 5.0])
def test_an_implausible_tokens_per_word_is_refused(per_word: float) -> None:
    with pytest.raises(EndpointError, match=r"tokens per word of plain English text \(expected 0.2-4\)"):
        run_virtual(measure_sizing(CountingServer(per_word=per_word), "m"))


def test_words_for_a_token_budget() -> None:
    sizing = TokenSizing(tokens_per_word=1.4, opening_overhead=20, turn_overhead=8, source="measured")
    assert sizing.words(1400) == 1000
    assert sizing.words(1.0) == 1  # rounds to 1
    assert sizing.words(0) == 1  # never an empty text
    assert SIMULATOR_SIZING.words(512) == 512  # one token per word on the simulator


class SimulatorCounter(CountingServer):
    """Counts as the simulator does: its ChatML template (sim/chat.py) and its tokenizer (sim/tokens.py)."""

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        req = ChatRequest.model_validate(body)
        tokens = len(tokenize(render_chat(req)))
        return [RequestRecord(ids=ids, t_sent=0.0, t_done=0.1, prompt_tokens=tokens, completion_tokens=1)]


def test_measuring_the_simulator_gives_its_tokenizer_and_template() -> None:
    measured = run_virtual(measure_sizing(SimulatorCounter(), "m"))
    # One token a word, and the opening's three: "<|im_start|>system\n", "<|im_start|>user\n" and the generation
    # prompt (a message's last word and its "<|im_end|>\n" are one \S+\s* token).
    assert (measured.tokens_per_word, measured.opening_overhead) == (1.0, 3)
    assert (SIMULATOR_SIZING.tokens_per_word, SIMULATOR_SIZING.opening_overhead) == (1.0, 3)
    # One more user exchange costs the next user header and the next generation prompt: 2. (SIMULATOR_SIZING
    # states 3 — between this and a tool-result exchange, whose <tool_response> tags cost 2 more.)
    assert measured.turn_overhead == 2
