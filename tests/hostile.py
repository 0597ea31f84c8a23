"""A hostile server for the property-based fuzzers: strategies for what a broken or malicious server
sends, and a MockTransport that streams it.

The strategies mix shapes a real server sends with the same shapes whose fields hold anything JSON can carry
(wrong types, huge integers, NaN / Infinity literals, lone surrogates, deep nesting) and bytes that are not JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from hypothesis import strategies as st

from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport

# Anything a JSON document can hold, including what strict parsers refuse (json.dumps writes NaN / Infinity).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "stop", "first", "", "-4", "1e400"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def dumps(value: Any) -> bytes:
    """JSON as a careless server writes it: NaN / Infinity literals allowed, surrogates escaped."""
    return json.dumps(value, allow_nan=True).encode()


def deep(depth: int) -> bytes:
    """Valid JSON nested ``depth`` arrays deep."""
    return b"[" * depth + b"]" * depth


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The field's real value, or anything at all."""
    return value | json_values


valid_deltas = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": st.text(max_size=8),
        "reasoning_content": st.text(max_size=8),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 3)},
                optional={
                    "id": st.text(max_size=6),
                    "function": st.fixed_dictionaries(
                        {}, optional={"name": st.text(max_size=6), "arguments": st.text(max_size=8)}
                    ),
                },
            ),
            max_size=2,
        ),
    },
)
valid_chunks = st.fixed_dictionaries(
    {"choices": st.lists(st.fixed_dictionaries({"index": st.just(0), "delta": valid_deltas}), min_size=1, max_size=1)},
    optional={"id": st.text(max_size=6), "object": st.just("chat.completion.chunk")},
)
valid_usage = st.integers(0, 10_000).flatmap(
    lambda prompt: st.fixed_dictionaries(
        {"prompt_tokens": st.just(prompt), "completion_tokens": st.integers(0, 10_000)},
        optional={"prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": st.integers(0, prompt)})},
    )
)

# A chunk whose every level may be swapped for anything: the shapes of the crashes and their relatives.
hostile_chunks = st.fixed_dictionaries(
    {},
    optional={
        "choices": _maybe(
            st.lists(
                _maybe(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "delta": _maybe(
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "content": _maybe(st.text(max_size=6)),
                                        "reasoning": _maybe(st.text(max_size=6)),
                                        "tool_calls": _maybe(
                                            st.lists(
                                                _maybe(
                                                    st.fixed_dictionaries(
                                                        {},
                                                        optional={
                                                            "index": _maybe(st.integers(0, 3)),
                                                            "id": _maybe(st.text(max_size=4)),
                                                            "function": _maybe(
                                                                st.fixed_dictionaries(
                                                                    {},
                                                                    optional={
                                                                        "name": _maybe(st.text(max_size=4)),
                                                                        "arguments": _maybe(st.text(max_size=4)),
                                                                    },
                                                                )
                                                            ),
                                                        },
                                                    )
                                                ),
                                                max_size=2,
                                            )
                                        ),
                                    },
                                )
                            ),
                            "message": json_values,
                            "finish_reason": _maybe(st.sampled_from(["stop", "length", "tool_calls"])),
                        },
                    )
                ),
                max_size=2,
            )
        ),
        "usage": _maybe(valid_usage),
        "error": json_values,
    },
)

# One SSE ``data:`` payload: a real chunk, a hostile one, any JSON value, bytes that are not JSON, or deep nesting.
payloads = st.one_of(
    valid_chunks.map(dumps),
    hostile_chunks.map(dumps),
    json_values.map(dumps),
    st.binary(max_size=20).filter(lambda b: b"\n" not in b),
    st.integers(1020, 1100).map(deep),
    st.just(b"[DONE]"),
)


def sse(payloads: Sequence[bytes]) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``data`` cut at the given offsets, as a socket may deliver it."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@asynccontextmanager
async def raw_http(response: bytes) -> AsyncIterator[str]:
    """A loopback server that reads the request and answers with exactly these bytes, valid HTTP or not."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(response)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def serving(status: int, pieces: Sequence[bytes], *, break_after: int | None = None) -> MockTransport:
    """A server that answers every request with ``status`` and these body pieces, then closes (or breaks)."""

    async def handler(request: MockRequest) -> MockResponse:
        return MockResponse(
            status=status,
            headers={"Content-Type": "text/event-stream"},
            chunks_script=[(0.0, p) for p in pieces],
            break_after=break_after,
        )

    return MockTransport(handler)
