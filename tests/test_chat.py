"""The chat template and the server's per-message token cache agree with tokenizing the whole prompt."""

from __future__ import annotations

from agentload.capacity.profile import load_profile
from agentload.sim.chat import ChatRequest, render_chat, render_chat_parts
from agentload.sim.server import SimConfig, SimServer
from agentload.sim.tokens import tokenize


def _conversation() -> ChatRequest:
    long = " ".join(f"token{i}" for i in range(400))
    return ChatRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "You are terse.  Double  spaces stay.\n"},
                {"role": "user", "content": long},
                {
                    "role": "assistant",
                    "content": "calling ",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": long + " trailing   "},
                {"role": "user", "content": [{"type": "text", "text": "  leading spaces"}]},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        }
    )


def test_parts_join_to_the_rendered_prompt() -> None:
    req = _conversation()
    assert "".join(render_chat_parts(req)) == render_chat(req)
    assert render_chat(req).endswith("<|im_start|>assistant\n")


def test_cached_per_part_tokens_equal_whole_prompt_tokens() -> None:
    server = SimServer(SimConfig(profile=load_profile("laptop")))
    req = _conversation()
    whole = tokenize(render_chat(req))
    first = server._tokenize_parts(render_chat_parts(req))
    again = server._tokenize_parts(render_chat_parts(req))  # now from the cache
    assert first == whole
    assert again == whole
    assert len(server._token_cache) >= 2  # the long parts were kept
