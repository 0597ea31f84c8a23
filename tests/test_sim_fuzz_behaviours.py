"""Fuzzed chat bodies against every behaviour: no response is ever an HTTP 500, and no behaviour raises
(the server's guard would turn that into a plain answer; the fuzzer asserts the guard never had to).

Bodies are mostly well-formed enough to reach the behaviour — roles, tool calls with odd arguments, tool results
of any JSON, tools with arbitrary JSON-schema-like parameters, every ``tool_choice`` form, suite markers with
foreign results — and run through the in-process transport in virtual time. Lone surrogates are left to the
request parser's own fuzzer (another part of the issue tracker); this one is about what the model says.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.capacity.profile import load_profile
from agentload.clock import run_virtual
from agentload.sim.behaviour import Behaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.suite.app import make_behaviour
from tests.fuzzing import fuzz_examples

BEHAVIOURS: list[tuple[str, float, str | None]] = [
    ("filler", 0.0, None),
    ("agent", 0.0, None),
    ("agent", 0.5, None),
    ("oracle", 0.5, None),
    ("oracle", 0.0, "echo-result"),
    ("oracle", 0.0, "placeholder-args"),
]
PROFILE = load_profile("laptop")

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_words = st.sampled_from(
    ["weather", "Paris", "and", "Tokyo", "12 * 4", "notes.md", "INV-88213", "a@b.co", "search", "write", "file",
     "250 USD to EUR", "2025-03-14", "15:00", "list", "orders", "'quoted'", "C-1", "then", "send", "?"]
)  # fmt: skip
_markers = st.sampled_from(["", "[agentload:scenario=T6]", "[agentload:scenario=T17]", "[agentload:scenario=T13]",
                            "[agentload:scenario=T11]", "[agentload:scenario=H1]", "[agentload:scenario=echo]",
                            "[agentload:scenario=tool-roundtrip]", "[agentload:scenario=T10]"])  # fmt: skip
_prose = st.lists(_words | _text, max_size=8).map(" ".join)
_content = st.one_of(
    st.none(),
    _prose,
    st.builds(lambda m, p: f"{m} {p}", _markers, _prose),
    st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_text"]), "text": _prose}),
        max_size=3,
    ),
)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), _text)
_json = st.recursive(_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(_text, c, max_size=4), max_leaves=10)
_names = st.sampled_from(
    ["get_weather", "calculator", "search", "write_file", "read_file", "list_orders", "order_subtotal",
     "list_show", "next_hop", "x", ""]
) | _text  # fmt: skip
_types = st.sampled_from(["string", "integer", "number", "boolean", "array", "object", "null"])


def _schema(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": _types | st.lists(_types, max_size=3) | _leaf,
            "properties": st.dictionaries(
                _names | st.sampled_from(["path", "location", "customer_id", "amount"]), children, max_size=4
            )
            | _leaf,
            "required": st.lists(_names | st.sampled_from(["path", "location"]), max_size=3) | _leaf,
            "enum": st.lists(_leaf, max_size=3) | _leaf,
            "items": children | _leaf,
            "minimum": _leaf,
            "maximum": _leaf,
            "minLength": _leaf,
            "maxLength": _leaf,
            "minItems": _leaf,
            "default": _json,
            "const": _json,
            "description": _prose,
        },
    )


_schemas: st.SearchStrategy[Any] = st.recursive(st.just({}), _schema, max_leaves=8)
_call = st.fixed_dictionaries(
    {"id": st.sampled_from(["c0", "c1", "c2"]) | _text, "type": st.just("function"),
     "function": st.fixed_dictionaries({"name": _names, "arguments": _text | _json.map(json.dumps)})}
)  # fmt: skip
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])},
    optional={
        "content": _content | _json.map(json.dumps),
        "name": _text,
        "tool_calls": st.lists(_call, max_size=3),
        "tool_call_id": st.sampled_from(["c0", "c1", "c2"]) | _text,
    },
)
_tool = st.fixed_dictionaries(
    {"type": st.just("function"),
     "function": st.fixed_dictionaries({"name": _names}, optional={"description": _prose, "parameters": _schemas})}
)  # fmt: skip
_tool_choice = st.one_of(
    st.sampled_from(["auto", "none", "required", "any"]),
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": _names})}),
    _json,
)
bodies = st.fixed_dictionaries(
    {"messages": st.lists(_message, min_size=1, max_size=6)},
    optional={
        "tools": st.lists(_tool, max_size=4),
        "tool_choice": _tool_choice,
        "max_tokens": st.integers(1, 48) | st.none(),
        "stream": st.booleans(),
        "seed": st.integers(0, 2**31),
    },
)


class _GuardHits(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "could not interpret a request" in record.getMessage():
            self.hits.append(record.getMessage())


async def _send(behaviour: Behaviour, raw: bytes) -> tuple[int, bytes]:
    transport = InProcessTransport(SimServer(SimConfig(profile=PROFILE, behaviour=behaviour)))
    try:
        resp = await transport.send("POST", "http://sim.invalid/v1/chat/completions", raw, {})
        return resp.status, await resp.read()
    finally:
        await transport.aclose()


@settings(max_examples=fuzz_examples(60))
@given(body=bodies)
def test_fuzzed_chat_bodies_never_get_a_500_from_any_behaviour(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    guard = _GuardHits()
    sim_log = logging.getLogger("agentload.sim")
    sim_log.addHandler(guard)
    try:
        for kind, rate, bad in BEHAVIOURS:
            status, data = run_virtual(_send(make_behaviour(kind, rate, bad), raw))
            assert status != 500, (kind, bad, data[:300])
            if status == 200 and not body.get("stream"):
                assert json.loads(data)["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
            elif status == 200:
                assert data.endswith(b"data: [DONE]\n\n"), (kind, bad, data[-200:])
    finally:
        sim_log.removeHandler(guard)
    assert guard.hits == [], "a behaviour raised; the guard answered for it"
