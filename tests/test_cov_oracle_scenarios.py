"""The oracle's built-in scenarios and how it picks a reply: the built-in scenarios have no fixed opening, so a
hand-written client names one with the marker in its system prompt (the suite's tests are recognised by their
openings instead, and send no marker: tests/test_suite_no_marker.py); ``known_bad`` forces a named (or generic)
bad reply, ``error_rate`` mixes bad replies in, anything it cannot read falls back; and the filler's lengths and
forced calls."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from agentload.errors import ConfigError
from agentload.sim.behaviour import (
    FillerBehaviour,
    GuardedBehaviour,
    Opening,
    OracleBehaviour,
    PlannedCall,
    Reply,
    Scenario,
    ScenarioBook,
    Turn,
)
from agentload.sim.chat import Message, Tool
from agentload.sim.scenarios import builtin_scenarios

LOOKUP = Tool.model_validate(
    {"function": {"name": "lookup", "parameters": {"properties": {"query": {"type": "string"}}, "required": ["query"]}}}
)


def turn(
    messages: list[dict[str, Any]],
    *,
    scenario: str | None = None,
    tools: list[Tool] | None = None,
    tool_choice: Any = None,
    max_tokens: int | None = None,
    max_output: int = 4096,
    seed: int = 0,
) -> Turn:
    system = [{"role": "system", "content": f"Be helpful. [agentload:scenario={scenario}]"}] if scenario else []
    return Turn(
        messages=[Message.model_validate(m) for m in [*system, *messages]],
        tools=tools or [],
        tool_choice=tool_choice,
        max_tokens=max_tokens,
        max_output=max_output,
        rng=random.Random(seed),
    )


def oracle(**kw: Any) -> OracleBehaviour:
    return OracleBehaviour(ScenarioBook(builtin_scenarios()), **kw)


def test_echo_replies_with_the_last_user_message() -> None:
    t = turn([{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
              {"role": "user", "content": "say this back"}], scenario="echo")  # fmt: skip
    assert oracle().reply(t) == Reply(content="say this back")
    assert oracle(known_bad="shout").reply(t) == Reply(content="SAY THIS BACK")


def test_tool_roundtrip_calls_the_offered_tool_then_answers_with_its_result() -> None:
    first = turn([{"role": "user", "content": "capital of France"}], scenario="tool-roundtrip", tools=[LOOKUP])
    assert oracle().reply(first) == Reply(tool_calls=[PlannedCall("lookup", '{"query": "capital of France"}')])
    after = turn(
        [
            {"role": "user", "content": "capital of France"},
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "Paris"},
        ],
        scenario="tool-roundtrip",
        tools=[LOOKUP],
    )
    assert oracle().reply(after) == Reply(content="The tool returned: Paris")


def test_tool_roundtrip_known_bad_replies() -> None:
    t = turn([{"role": "user", "content": "q"}], scenario="tool-roundtrip", tools=[LOOKUP])
    assert not oracle(known_bad="no-tool-call").reply(t).tool_calls
    invented = oracle(known_bad="invent-tool").reply(t).tool_calls
    assert [c.name for c in invented] == ["search_the_web"]  # a tool that was not offered


def test_generic_bad_replies_apply_to_every_scenario() -> None:
    t = turn([{"role": "user", "content": "say this"}], scenario="echo", tools=[LOOKUP])
    assert oracle(known_bad="refuse").reply(t).content.startswith("I am not able to help")
    # The placeholder cheat calls every offered tool with type-correct placeholders.
    assert oracle(known_bad="placeholder-args").reply(t).tool_calls == [PlannedCall("lookup", '{"query": "example"}')]


def test_an_unknown_known_bad_or_error_rate_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown known-bad behaviour 'mumble'; known: echo-result, invent-tool"):
        oracle(known_bad="mumble")
    with pytest.raises(ConfigError, match=r"error rate must be in \[0, 1\]"):
        oracle(error_rate=1.5)


def test_without_a_marker_or_with_an_unknown_one_the_fallback_answers() -> None:
    plain = turn([{"role": "user", "content": "hello"}], max_tokens=5)
    assert len(oracle().reply(plain).pieces()) == 5  # filler of the requested length
    unknown = turn([{"role": "user", "content": "hello"}], scenario="no-such-test", max_tokens=3)
    assert len(oracle().reply(unknown).pieces()) == 3


def test_a_scenario_with_an_opening_answers_that_opening_and_no_other() -> None:
    def named(t: Turn) -> Reply:
        return Reply(content="opened")

    opening = Opening("Be terse.", "Hi  there")
    book = ScenarioBook([*builtin_scenarios(), Scenario("opened", named, openings=(opening,))])
    exact = turn([{"role": "system", "content": "Be  terse.\n"}, {"role": "user", "content": "Hi there"}])
    assert OracleBehaviour(book).reply(exact) == Reply(content="opened")  # white space aside, the same opening
    other = turn([{"role": "system", "content": "Be terse!"}, {"role": "user", "content": "Hi there"}], max_tokens=2)
    assert len(OracleBehaviour(book).reply(other).pieces()) == 2
    offered = turn([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi there"}],
                   tools=[LOOKUP], max_tokens=2)  # fmt: skip
    assert len(OracleBehaviour(book).reply(offered).pieces()) == 2  # a tool the opening does not offer
    assert book.recognise(exact) is book.get("opened")
    assert book.recognise(other) is None


def test_an_error_rate_mixes_in_bad_replies_at_that_share() -> None:
    behaviour = oracle(error_rate=0.3)
    bad = sum(
        behaviour.reply(turn([{"role": "user", "content": "hi"}], scenario="echo", seed=s)).content == "HI"
        for s in range(2000)
    )
    # Binomial(2000, 0.3): sd ≈ 20; ±120 is six sd.
    assert abs(bad - 600) < 120


def test_a_scenario_that_cannot_read_the_conversation_falls_back() -> None:
    def needs_a_tool_result(t: Turn) -> Reply:
        return Reply(content=json.loads(t.messages[-1].text())["answer"])  # KeyError/ValueError on other input

    book = ScenarioBook([Scenario("reads-json", needs_a_tool_result)])
    t = turn([{"role": "user", "content": "not json"}], scenario="reads-json", max_tokens=4)
    assert len(OracleBehaviour(book).reply(t).pieces()) == 4


def test_a_scenario_registered_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="scenario 'echo' is registered twice"):
        ScenarioBook([*builtin_scenarios(), builtin_scenarios()[0]])


def test_the_book_lists_ids_and_bad_names() -> None:
    book = ScenarioBook(builtin_scenarios())
    assert book.ids() == ["echo", "tool-roundtrip"]
    assert book.bad_names() == {"shout", "no-tool-call", "invent-tool"}


# -- filler ----------------------------------------------------------------------------------------------------
def test_filler_length_is_the_request_capped_by_the_context() -> None:
    filler = FillerBehaviour()
    assert filler.length(turn([], max_tokens=100, max_output=40)) == 40
    assert filler.length(turn([], max_tokens=0)) == 1  # at least one token
    lengths = [filler.length(turn([], seed=s)) for s in range(1000)]
    assert sorted(lengths)[500] == pytest.approx(256, rel=0.15)  # lognormal with median 256
    assert max(filler.length(turn([], seed=s, max_output=300)) for s in range(200)) <= 300


def test_filler_makes_a_forced_call_with_typed_placeholders() -> None:
    tool = Tool.model_validate(
        {
            "function": {
                "name": "book",
                "parameters": {
                    "properties": {"n": {"type": "integer"}, "when": {"type": "string"}, "ok": {"type": "boolean"}},
                    "required": ["n", "ok"],
                },
            }
        }
    )
    forced = {"type": "function", "function": {"name": "book"}}
    reply = FillerBehaviour().reply(turn([{"role": "user", "content": "x"}], tools=[tool], tool_choice=forced))
    assert reply.tool_calls == [PlannedCall("book", '{"n": 1, "ok": true}')]
    required = FillerBehaviour().reply(turn([], tools=[tool], tool_choice="required"))
    assert [c.name for c in required.tool_calls] == ["book"]  # "required" picks the first offered tool


def test_a_forced_call_on_a_schema_that_is_no_schema_gets_empty_arguments() -> None:
    weird = Tool.model_validate({"function": {"name": "w", "parameters": {"properties": None, "required": 3}}})
    forced = {"type": "function", "function": {"name": "w"}}
    assert FillerBehaviour().reply(turn([], tools=[weird], tool_choice=forced)).tool_calls == [PlannedCall("w", "{}")]


def test_the_guard_turns_a_failing_behaviour_into_a_plain_answer() -> None:
    class Broken:
        name = "broken"

        def reply(self, t: Turn) -> Reply:
            raise RuntimeError("boom")

    guarded = GuardedBehaviour(Broken())
    assert guarded.name == "broken"
    assert guarded.reply(turn([])).content.startswith("I could not make sense of that conversation")
