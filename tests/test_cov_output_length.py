"""Asking each engine for exactly the reply length a workload wants (docs/background.md §9): vLLM and the simulator take
``ignore_eos`` + ``min_tokens``, SGLang ``ignore_eos``, llama.cpp ``ignore_eos`` + ``n_predict``; Ollama and unknown
servers have no switch and the body goes unchanged. Also the prompt-size guess the watchdog budgets with."""

from __future__ import annotations

from typing import Any

import pytest

from agentload.endpoint.output import can_force_length, exact_output, length_control
from agentload.endpoint.watchdog import estimate_prompt_tokens

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}


@pytest.mark.parametrize(
    ("engine", "extra"),
    [
        ("vllm", {"ignore_eos": True, "min_tokens": 64}),
        ("agentload-sim", {"ignore_eos": True, "min_tokens": 64}),
        ("sglang", {"ignore_eos": True}),
        ("llamacpp", {"ignore_eos": True, "n_predict": 64}),
    ],
)
def test_engines_that_can_be_told_get_their_own_fields(engine: str, extra: dict[str, Any]) -> None:
    assert can_force_length(engine)
    assert exact_output(engine, BODY) == {**BODY, **extra}
    assert "ignore_eos" not in BODY  # the caller's body is not changed in place


@pytest.mark.parametrize("engine", ["ollama", "openai-compatible", None, ""])
def test_engines_without_a_switch_get_the_body_unchanged(engine: str | None) -> None:
    assert not can_force_length(engine)
    assert exact_output(engine, BODY) is BODY
    assert length_control(engine) is None


def test_max_completion_tokens_is_the_cap_when_both_are_given() -> None:
    body = {**BODY, "max_completion_tokens": 32}
    assert exact_output("vllm", body)["min_tokens"] == 32


@pytest.mark.parametrize("cap", [None, 0, -5, True, 12.0, "64"])
def test_without_a_usable_cap_there_is_nothing_to_force(cap: object) -> None:
    body = {**BODY, "max_tokens": cap}
    assert exact_output("vllm", body) is body


def test_length_control_in_words() -> None:
    assert length_control("vllm") == "ignore_eos + min_tokens=max_tokens"
    assert length_control("sglang") == "ignore_eos"
    assert length_control("llamacpp") == "ignore_eos + n_predict=max_tokens"


def test_the_prompt_size_guess_is_characters_over_four() -> None:
    # [[{"role":"user","content":"xxx…"}],""] (compact JSON) is 432 characters: 108 tokens.
    body = {"messages": [{"role": "user", "content": "x" * 400}]}
    assert estimate_prompt_tokens(body) == 108
    # Characters, not UTF-8 bytes: 400 "é" are 800 bytes and still 400 characters.
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "é" * 400}]}) == 108
    with_tools = {**body, "tools": [{"type": "function", "function": {"name": "f" * 40}}]}
    assert estimate_prompt_tokens(with_tools) > estimate_prompt_tokens(body)  # tool schemas are prompt too
    assert estimate_prompt_tokens({"prompt": "y" * 80}) == 21  # ["yyy…",""]: 87 characters
    assert estimate_prompt_tokens({}) == 1  # ["",""]: 7 characters


def test_the_guess_counts_characters_not_bytes() -> None:
    # ensure_ascii=False: "é" is one character, not a six-character \\u escape.
    assert estimate_prompt_tokens({"messages": "é" * 400}) == estimate_prompt_tokens({"messages": "e" * 400})


def test_a_null_max_completion_tokens_leaves_max_tokens_as_the_cap() -> None:
    body = {"max_completion_tokens": None, "max_tokens": 64}
    out = exact_output("vllm", body)
    assert out["min_tokens"] == 64
    assert out["ignore_eos"] is True
