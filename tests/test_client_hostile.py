"""endpoint.client against a hostile server: a malformed chunk or body is a failed record with a
clear message, never an exception out of the client."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import ErrorKind, Outcome, RequestRecord
from agentload.endpoint.wire import SSEParser, SSETooLong
from tests.fuzzing import fuzz_examples
from tests.hostile import payloads, raw_http, serving, split, sse, valid_chunks, valid_usage

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def role() -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}


def chunk(**delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta}]}


def events(*objs: Any) -> bytes:
    return sse([json.dumps(o).encode() if not isinstance(o, bytes) else o for o in objs] + [b"[DONE]"])


async def ask(data: bytes, *, stream: bool = True, status: int = 200, headers: Any = None) -> RequestRecord:
    transport = serving(status, [data])
    if headers is not None:
        original = transport._handler

        async def with_headers(request: Any) -> Any:
            resp = await original(request)
            resp.headers = headers
            return resp

        transport._handler = with_headers
    client = ChatClient("http://127.0.0.1:9", transport=transport, api_key_env=None)
    return await client.chat({**BODY, "stream": stream})


async def test_a_well_formed_stream_is_recorded_whole() -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}
    call = {"index": 0, "id": "c1", "function": {"name": "ls", "arguments": "{}"}}
    data = events(
        role(), chunk(content="he"), chunk(content="y"), chunk(tool_calls=[call]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}, {"choices": [], "usage": usage},
    )  # fmt: skip
    record = await ask(data)
    assert record.ok, record.error_message
    assert (record.content, record.finish_reason) == ("hey", "tool_calls")
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (12, 2, 4)
    assert [(c.id, c.name, c.arguments) for c in record.tool_calls] == [("c1", "ls", "{}")]
    assert len(record.chunk_times) == 3


# The crashes (client.py:324, :373, :402, :387, :334) and their relatives; `says` is what the message names.
HOSTILE_CHUNKS = [
    pytest.param({"choices": "oops"}, "choices is a str", id="choices-a-string"),
    pytest.param({"choices": [], "usage": [1, 2]}, "usage is a list", id="usage-a-list"),
    pytest.param(chunk(content=42), "delta.content is a int", id="content-a-number"),
    pytest.param({"choices": [{"delta": {}, "finish_reason": ["stop"]}]}, "finish_reason is a list", id="finish-list"),
    pytest.param(chunk(tool_calls=[{"index": "first"}]), "index is 'first'", id="tool-index-a-string"),
    pytest.param(chunk(tool_calls=[{"index": -1}]), "index is -1", id="tool-index-negative"),
    pytest.param(chunk(tool_calls=[{"index": 10**9}]), "index is 1000000000", id="tool-index-huge"),
    pytest.param(chunk(tool_calls=[{"index": True}]), "index is True", id="tool-index-a-bool"),
    pytest.param(chunk(tool_calls="x"), "delta.tool_calls is a str", id="tool-calls-a-string"),
    pytest.param(chunk(tool_calls=[{"function": {"arguments": {"a": 1}}}]), "arguments is a dict", id="args-object"),
    pytest.param({"choices": [7]}, "choices[0] is a int", id="choice-a-number"),
    pytest.param({"choices": [{"delta": "d"}]}, "delta is a str", id="delta-a-string"),
    pytest.param({"choices": [], "usage": {"prompt_tokens": -3}}, "usage prompt_tokens", id="negative-count"),
    pytest.param({"choices": [], "usage": {"prompt_tokens": 10**30}}, "usage prompt_tokens", id="huge-count"),
    pytest.param({"choices": [], "usage": {"completion_tokens": 1.5}}, "usage completion_tokens", id="float-count"),
    pytest.param({"choices": [], "usage": {"prompt_tokens": "12"}}, "usage prompt_tokens", id="string-count"),
    pytest.param(
        {"choices": [], "usage": {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 9}}},
        "9 cached tokens of a 4-token prompt",
        id="more-cached-than-prompt",
    ),
    pytest.param([1, 2], "JSON list, not an object", id="json-array"),
    pytest.param(b"not json", "not JSON", id="not-json"),
    pytest.param(b'{"choices": [], "usage": {"prompt_tokens": NaN}}', "not JSON", id="nan-literal"),
    pytest.param(b'{"choices": [], "usage": {"prompt_tokens": 1e400}}', "not JSON", id="overflowing-number"),
    pytest.param(b'{"choices": [{"delta": {"content": "\\ud800"}}]}', "not JSON", id="lone-surrogate"),
    pytest.param(b"[" * 5000 + b"]" * 5000, "not JSON", id="deep-nesting"),
]


@pytest.mark.parametrize(("bad", "says"), HOSTILE_CHUNKS)
async def test_a_hostile_chunk_is_a_malformed_record(bad: Any, says: str) -> None:
    record = await ask(events(role(), chunk(content="a"), bad, chunk(content="b")))
    assert (record.outcome, record.error) == (Outcome.STREAM_ERROR, ErrorKind.MALFORMED)
    assert says in record.error_message
    assert record.content == "a"  # what came before the bad chunk is kept; nothing after it is read
    assert record.transient  # a resend may meet a healthy server


def message_body(**message: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param({"choices": "oops"}, "choices is a str", id="choices-a-string"),
        pytest.param({"choices": []}, "no choices", id="no-choices"),
        pytest.param(message_body(content=42), "message.content is a int", id="content-a-number"),
        pytest.param({**message_body(content="x"), "usage": [1, 2]}, "usage is a list", id="usage-a-list"),
        pytest.param(message_body(tool_calls=[{"function": "f"}]), "function is a str", id="function-a-string"),
        pytest.param(message_body(tool_calls=[{}] * 2000), "2000 tool calls", id="too-many-calls"),
        pytest.param({"choices": [{"message": {}, "finish_reason": 3}]}, "finish_reason is a int", id="finish-int"),
        pytest.param([message_body(content="x")], "the body is a list", id="json-array"),
        pytest.param(b"\xff\xfe", "not JSON", id="binary"),
    ],
)
async def test_a_hostile_body_is_a_malformed_record(body: Any, says: str) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    record = await ask(data, stream=False)
    assert (record.outcome, record.error) == (Outcome.STREAM_ERROR, ErrorKind.MALFORMED)
    assert says in record.error_message


@pytest.mark.parametrize("error", [{"message": ""}, "", None])
async def test_an_error_event_without_a_message_still_says_what_happened(error: Any) -> None:
    """Found by the fuzzer: an empty message left a failed record with no error_message."""
    record = await ask(events(role(), {"error": error}))
    assert (record.outcome, record.error) == (Outcome.SERVER_ERROR, ErrorKind.SERVER)
    assert record.error_message


async def test_a_well_formed_body_is_recorded() -> None:
    body = {**message_body(content="ok"), "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    record = await ask(json.dumps(body).encode(), stream=False)
    assert record.ok
    assert (record.content, record.prompt_tokens, record.finish_reason) == ("ok", 3, "stop")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "soon"])
async def test_a_retry_after_that_is_no_number_of_seconds_is_ignored(value: str) -> None:
    record = await ask(b'{"error": {"message": "slow down"}}', status=429, headers={"Retry-After": value})
    assert record.http_status == 429
    assert record.retry_after_s is None


async def test_a_retry_after_in_seconds_is_kept() -> None:
    record = await ask(b"{}", status=429, headers={"Retry-After": "2.5"})
    assert record.retry_after_s == 2.5


async def test_a_deeply_nested_error_body_is_quoted_not_a_crash() -> None:
    record = await ask(b"[" * 100_000, status=500)
    assert record.outcome is Outcome.HTTP_ERROR
    assert record.error_message.startswith("[[[")


def test_an_event_that_never_ends_is_refused_past_the_limit() -> None:
    parser = SSEParser(max_event_bytes=64)
    assert parser.feed(b"data: " + b"x" * 50) == []
    with pytest.raises(SSETooLong):
        parser.feed(b"x" * 50)


async def test_an_endless_event_is_a_malformed_record() -> None:
    record = await ask(b"data: " + b"x" * (17 * 1024 * 1024))
    assert (record.outcome, record.error) == (Outcome.STREAM_ERROR, ErrorKind.MALFORMED)
    assert "longer than" in record.error_message


@pytest.mark.parametrize(
    ("response", "says"),
    [
        pytest.param(b"HELLO\r\n\r\n", "Bad status line", id="garbage-status-line"),
        pytest.param(b"HTTP/1.1 abc OK\r\n\r\n", "Invalid status code", id="bad-status-code"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "8190 bytes", id="huge-header"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-\x00: y\r\n\r\n", "Invalid header token", id="nul-in-header"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n", "chunk size", id="bad-chunk"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
            "Duplicate Content-Length",
            id="two-lengths",
        ),
    ],
)
async def test_bytes_that_are_not_http_are_a_malformed_record(response: bytes, says: str) -> None:
    """Over a real socket: aiohttp's parser errors (ClientResponseError) used to escape the client."""
    async with raw_http(response) as url:
        client = ChatClient(url, api_key_env=None)
        try:
            record = await client.chat(BODY)
        finally:
            await client.aclose()
    assert (record.outcome, record.error) == (Outcome.STREAM_ERROR, ErrorKind.MALFORMED)
    assert says in record.error_message
    assert "\n" not in record.error_message


# -- fuzzers ------------------------------------------------------------------------------------------------------
def run(pieces: list[bytes], *, stream: bool, status: int = 200, break_after: int | None = None) -> RequestRecord:
    client = ChatClient("http://127.0.0.1:9", transport=serving(status, pieces, break_after=break_after),
                        api_key_env=None)  # fmt: skip
    return asyncio.run(client.chat({**BODY, "stream": stream}))


@settings(max_examples=fuzz_examples(300))
@given(
    st.lists(payloads, max_size=8),
    st.lists(st.integers(0, 10_000), max_size=6),
    st.booleans(),
    st.sampled_from([200, 200, 200, 429, 500]),
    st.none() | st.integers(0, 4),
)
def test_fuzz_sse_stream_to_record(
    events_: list[bytes], cuts: list[int], stream: bool, status: int, break_after: int | None
) -> None:
    """Any sequence of chunks, cut anywhere, gives a record (the client raises nothing) that survives a file."""
    data = sse(events_) if stream else b"".join(events_)
    record = run(split(data, cuts), stream=stream, status=status, break_after=break_after)
    assert RequestRecord.model_validate_json(record.model_dump_json()) == record
    event(f"outcome {record.error or 'ok'}")  # --hypothesis-show-statistics: how often each path was taken
    if record.ok:
        assert status == 200
        assert b"[DONE]" in data or not stream
    else:
        assert record.error is not None
        assert record.error_message


@settings(max_examples=fuzz_examples(200))
@given(st.lists(valid_chunks, max_size=6), st.none() | valid_usage, st.lists(st.integers(0, 10_000), max_size=6))
def test_fuzz_a_well_formed_stream_is_never_refused(
    chunks: list[dict[str, Any]], usage: dict[str, Any] | None, cuts: list[int]
) -> None:
    """The other side of the validation: nothing a real server sends is mistaken for a hostile chunk."""
    objs: list[Any] = [*chunks, {"choices": [], "usage": usage}] if usage else list(chunks)
    record = run(split(events(*objs), cuts), stream=True)
    assert record.ok, record.error_message
    assert record.content == "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    if usage is not None:
        assert record.prompt_tokens == usage["prompt_tokens"]
