"""The simulator's request bodies and chat template: every malformed body is one ``BadRequestError`` naming the
field (a 400, never a 500), and the template renders each message kind the way Qwen's ChatML does."""

from __future__ import annotations

import json

import pytest

from agentload.errors import BadRequestError
from agentload.sim.chat import (
    ChatRequest,
    CompletionRequest,
    Message,
    load_json,
    parse_body,
    render_chat,
    render_chat_parts,
    render_tool_call,
)

USER = {"role": "user", "content": "hi"}


def _chat(**fields: object) -> ChatRequest:
    req: ChatRequest = parse_body(ChatRequest, json.dumps({"messages": [USER], **fields}).encode())
    return req


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (b"{", "request body is not valid JSON", None),
        (b'{"messages": [{"role": "user", "content": NaN}]}', "not valid JSON", None),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON", None),  # orjson refuses deep nesting; json would recurse
        (b'"\\udc00"', "not valid JSON", None),  # a lone surrogate could not be encoded as a prompt
        (b"[]", "request body must be a JSON object", None),
        (b"{}", "messages: Field required", "messages"),
        (b'{"messages": []}', "messages: List should have at least 1 item", "messages"),
        (b'{"messages": [{"role": "robot", "content": "x"}]}', "messages.0.role", "messages.0.role"),
        (b'{"messages": [{"role": "user"}], "max_tokens": 0}', "max_tokens: Input should be greater", "max_tokens"),
        (b'{"messages": [{"role": "user"}], "n": 2}', "n must be 1", "n"),
        (b'{"messages": [{"role": "user"}], "min_tokens": -1}', "min_tokens", "min_tokens"),
        (b'{"messages": [{"role": "user"}], "tools": [{"type": "function"}]}', "tools.0.function", "tools.0.function"),
    ],
)
def test_a_malformed_chat_body_is_one_bad_request_naming_the_field(
    body: bytes, message: str, param: str | None
) -> None:
    with pytest.raises(BadRequestError, match=message) as info:
        parse_body(ChatRequest, body)
    assert info.value.param == param
    assert info.value.status == 400


def test_unknown_openai_parameters_are_accepted_as_vllm_does() -> None:
    req = _chat(temperature=0.2, top_p=0.9, logit_bias={"1": 2}, max_tokens=16)
    assert req.output_limit == 16


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert _chat(max_tokens=100, max_completion_tokens=7).output_limit == 7
    assert _chat().output_limit is None


def test_usage_in_the_stream_only_when_asked() -> None:
    assert not _chat(stream=True).include_usage
    assert not _chat(stream=True, stream_options={"include_usage": False}).include_usage
    assert _chat(stream=True, stream_options={"include_usage": True}).include_usage


def test_forced_tool_only_from_a_named_function_choice() -> None:
    assert _chat(tool_choice={"type": "function", "function": {"name": "read_file"}}).forced_tool() == "read_file"
    assert _chat(tool_choice="required").forced_tool() is None
    assert _chat(tool_choice="auto").forced_tool() is None
    assert _chat(tool_choice={"type": "function", "function": {"name": 3}}).forced_tool() is None
    assert _chat(tool_choice={"type": "function"}).forced_tool() is None


def test_content_parts_keep_the_text_and_drop_the_rest() -> None:
    msg = Message.model_validate(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at "},
                {"type": "image_url", "image_url": {"url": "data:..."}},
                {"type": "input_text", "text": "this"},
            ],
        }
    )
    assert msg.text() == "look at this"
    assert Message(role="assistant", content=None).text() == ""


def test_completion_prompt_forms() -> None:
    def prompt(value: object) -> CompletionRequest:
        req: CompletionRequest = parse_body(CompletionRequest, json.dumps({"prompt": value}).encode())
        return req

    assert prompt("once upon").prompt_text() == "once upon"
    assert prompt(["once upon"]).prompt_text() == "once upon"
    with pytest.raises(BadRequestError, match="one prompt per request") as many:
        prompt(["a", "b"]).prompt_text()
    assert many.value.param == "prompt"
    with pytest.raises(BadRequestError, match="token-id prompts are not supported"):
        prompt([1, 2, 3]).prompt_text()
    with pytest.raises(BadRequestError, match="prompt: Field required"):
        parse_body(CompletionRequest, b"{}")


def test_load_json_returns_any_json_value() -> None:
    assert load_json(b"[1, 2]") == [1, 2]
    assert load_json(b'{"a": null}') == {"a": None}


# -- the template ----------------------------------------------------------------------------------------------
def test_a_plain_conversation_renders_as_chatml() -> None:
    req = _chat(messages=[{"role": "system", "content": "Be brief."}, USER])
    assert render_chat(req) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_developer_message_is_the_system_turn() -> None:
    first = _chat(messages=[{"role": "developer", "content": "Rules."}, USER])
    assert render_chat_parts(first)[0] == "<|im_start|>system\nRules.<|im_end|>\n"
    # Not first: still rendered under the system role (ChatML has no developer role).
    later = _chat(messages=[USER, {"role": "developer", "content": "More."}])
    assert render_chat_parts(later)[1] == "<|im_start|>system\nMore.<|im_end|>\n"


def test_tools_are_listed_in_the_system_turn_and_calls_and_results_render_as_qwen_tags() -> None:
    tool = {"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    req = _chat(
        messages=[
            USER,
            {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        ],
        tools=[tool],
    )
    parts = render_chat_parts(req)
    assert len(parts) == 5  # system (tools), user, assistant, tool result, generation prompt
    assert parts[0].startswith("<|im_start|>system\n# Tools\n")
    assert '<tools>\n{"function": {"description": "list", "name": "ls", "parameters": {"type": "object"}}' in parts[0]
    assert parts[2] == (
        '<|im_start|>assistant\nLooking.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
        "<|im_end|>\n"
    )
    assert parts[3] == "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n"
    assert parts[-1] == "<|im_start|>assistant\n"


def test_a_system_prompt_comes_before_the_tool_listing() -> None:
    tool = {"type": "function", "function": {"name": "ls"}}
    req = _chat(messages=[{"role": "system", "content": "You code."}, USER], tools=[tool])
    assert render_chat_parts(req)[0].startswith("<|im_start|>system\nYou code.\n\n# Tools\n")


def test_a_call_without_arguments_renders_an_empty_object() -> None:
    assert render_tool_call("now", "") == '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    # An assistant turn that is only a call has no leading newline.
    call = {"function": {"name": "now"}}
    req = _chat(messages=[USER, {"role": "assistant", "content": None, "tool_calls": [call]}])
    assert render_chat_parts(req)[1].startswith("<|im_start|>assistant\n<tool_call>")


def test_the_same_conversation_renders_to_the_same_text_every_time() -> None:
    # Prefix caching depends on it: earlier messages must render identically when the conversation is resent,
    # whatever order the client wrote the tool schema's keys in.
    tool_a = {"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}
    tool_b = {"function": {"parameters": {"a": 2, "b": 1}, "name": "f"}, "type": "function"}
    short = _chat(messages=[USER], tools=[tool_a])
    longer = _chat(messages=[USER, {"role": "assistant", "content": "ok"}, USER], tools=[tool_b])
    assert render_chat_parts(longer)[:2] == render_chat_parts(short)[:2]


def test_a_tool_schema_nested_too_deep_to_render_is_a_bad_request() -> None:
    # 1,000 levels of parameters: within orjson's 1,024, past what json.dumps recurses through.
    body = b'{"messages": [{"role": "user"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": '
    body += b'{"p": ' * 1000 + b"{}" + b"}" * 1000 + b"}}]}"
    req = parse_body(ChatRequest, body)
    with pytest.raises(BadRequestError, match="nested too deeply") as info:
        render_chat(req)
    assert info.value.param == "tools"
