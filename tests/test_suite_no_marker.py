"""The suite sends a server its tests and nothing else, and the simulator's oracle still knows which test it plays.

A real model must see only what a test says: no tag naming the test (the oracle once read one from the system
prompt), no test id anywhere in a request. The oracle instead recognises a conversation by how it opens — the
system prompt, the first user message and the offered tools, equal up to white space — so every suite test is
recognised as itself, whatever T11's payload size and however far into the conversation, and anything that
merely resembles a test (another system prompt, another request, other tools) gets the fallback behaviour.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentload.capacity.profile import load_profile
from agentload.clock import run_virtual
from agentload.endpoint.connection import ConnectionOptions, open_connection
from agentload.endpoint.transport import Response
from agentload.errors import ConfigError
from agentload.sim.behaviour import MARKER, OracleBehaviour, Reply, Scenario, ScenarioBook, Turn
from agentload.sim.chat import Message, Tool
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.suite.app import oracle_book, suite_over
from agentload.suite.cases import all_tests, by_id, select
from agentload.suite.model import SuiteTest
from agentload.suite.oracle import scenarios
from agentload.suite.results import SuiteRun
from agentload.suite.runner import SuiteConfig
from agentload.suite.scoring import Status

AGENTS = 2
# A test id standing alone ("T7", "H1"): what a tag naming the test would carry. The tests' own data (INV-88213,
# TP1351, k01-…) never has one.
TEST_ID = re.compile(r"(?<![\w-])(?:T\d{1,2}|H1)(?![\w-])")


@dataclass
class Recording:
    """A transport that keeps every request it is given, then hands it to the simulator in process."""

    inner: InProcessTransport
    sent: list[tuple[str, str, bytes, dict[str, str]]] = field(default_factory=list)

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        self.sent.append((method, url, body or b"", dict(headers)))
        return await self.inner.send(method, url, body, headers)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def chats(self) -> list[dict[str, Any]]:
        return [json.loads(body) for method, url, body, _ in self.sent if url.endswith("/chat/completions")]


def _run(tests: list[SuiteTest], payload_tokens: int) -> tuple[SuiteRun, Recording]:
    """The suite as ``agentload suite`` runs it, on the oracle simulator, every request recorded on its way."""

    async def go() -> tuple[SuiteRun, Recording]:
        server = SimServer(SimConfig(profile=load_profile("qwen3-235b-gb300"),
                                     behaviour=OracleBehaviour(oracle_book()), seed=7))  # fmt: skip
        recording = Recording(InProcessTransport(server))
        options = ConnectionOptions(retry_rng=random.Random(7))
        async with open_connection("http://sim.invalid", recording, options=options, close_transport=True) as conn:
            config = SuiteConfig(model=server.model_name, payload_tokens=payload_tokens)
            run = await suite_over(conn, tests, config, [AGENTS], endpoint="in-process oracle")
        return run, recording

    result: tuple[SuiteRun, Recording] = run_virtual(go())
    return result


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@pytest.mark.parametrize("payload_tokens", [30_000, 2_000])
def test_the_suite_sends_each_test_exactly_and_no_tag_or_test_id(payload_tokens: int) -> None:
    tests = select(payload_tokens=payload_tokens)
    run, recording = _run(tests, payload_tokens)
    # The oracle recognised every test without being told: each one passes, for every agent.
    verdicts = [t.status for a in run.levels[0].agent_results for t in a.tests]
    assert verdicts == [Status.PASS] * (AGENTS * len(tests))

    chats = recording.chats()
    assert len(chats) == run.levels[0].requests
    openings = {t.id: t.messages() for t in tests}
    seen: set[str] = set()
    for body in chats:
        # Every conversation opens with the test's own system prompt and request, exactly as the test wrote them.
        found = [test_id for test_id, opening in openings.items() if body["messages"][:2] == opening]
        assert len(found) == 1, body["messages"][:2]
        seen.add(found[0])
        assert [m["role"] for m in body["messages"]].count("system") == 1
        for text in _strings(body):
            assert MARKER.search(text) is None, text[:200]
            assert "agentload" not in text.lower(), text[:200]
            assert TEST_ID.search(text) is None, text[:200]
    assert seen == {t.id for t in tests}
    for _method, _url, body_bytes, headers in recording.sent:
        assert b"agentload:" not in body_bytes
        for name, value in headers.items():
            assert TEST_ID.search(value) is None, name
            assert "agentload" not in value.lower(), name


# -- the oracle recognises a test by its opening, and nothing else ------------------------------------------------


def _tools(test: SuiteTest) -> list[Tool]:
    return [Tool.model_validate(t.schema()) for t in test.tools()]


def _turn(messages: list[dict[str, Any]], tools: list[Tool]) -> Turn:
    return Turn(messages=[Message.model_validate(m) for m in messages], tools=tools, tool_choice=None,
                max_tokens=8, max_output=4096, rng=random.Random(0))  # fmt: skip


def _opening(test: SuiteTest, *, system: str | None = None, user: str | None = None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": test.system if system is None else system},
            {"role": "user", "content": test.user if user is None else user}]  # fmt: skip


def _recognised(turn: Turn) -> str | None:
    found = oracle_book().recognise(turn)
    return None if found is None else found.id


SUITE = all_tests()
IDS = [t.id for t in SUITE]


def test_every_scenario_in_the_book_has_an_opening_and_every_suite_test_is_one() -> None:
    book = oracle_book()
    with_openings = {i for i in book.ids() if (s := book.get(i)) is not None and s.openings}
    assert with_openings == set(IDS)


@pytest.mark.parametrize("test", SUITE, ids=IDS)
def test_each_test_is_recognised_by_its_opening_as_itself(test: SuiteTest) -> None:
    assert _recognised(_turn(_opening(test), _tools(test))) == test.id
    # White space is all a client may change: re-wrapped, padded, tools in another order.
    spaced = _opening(test, system="\n  " + test.system.replace(" ", "\n", 3) + "  ", user=f" {test.user}\t")
    assert _recognised(_turn(spaced, list(reversed(_tools(test))))) == test.id
    # And the oracle then plays that test: its reply is the scenario's own, not the fallback's filler.
    scenario = oracle_book().get(test.id)
    assert scenario is not None
    turn = _turn(_opening(test), _tools(test))
    assert OracleBehaviour(oracle_book()).reply(turn) == scenario.correct(_turn(_opening(test), _tools(test)))


@pytest.mark.parametrize("test", SUITE, ids=IDS)
def test_anything_but_the_opening_itself_is_not_recognised(test: SuiteTest) -> None:
    tools = _tools(test)
    foreign = "You are a helpful assistant. Use the tools you are given when they help."
    assert _recognised(_turn(_opening(test, system=foreign), tools)) is None  # another system prompt
    assert _recognised(_turn(_opening(test, system=f"{test.system} Be brief."), tools)) is None
    assert _recognised(_turn(_opening(test, user=f"{test.user} Thanks!"), tools)) is None  # another request
    other = by_id()["T17" if test.id != "T17" else "T1"]
    assert _recognised(_turn(_opening(test), [*tools, *_tools(other)])) is None  # more tools
    assert _recognised(_turn(_opening(test), tools[1:])) is None  # a tool fewer
    assert _recognised(_turn(_opening(test)[1:], tools)) is None  # no system prompt
    # The test's request after some other conversation: not how the test opens.
    later = [*_opening(test, user="Hello."), {"role": "assistant", "content": "Hi."},
             {"role": "user", "content": test.user}]  # fmt: skip
    assert _recognised(_turn(later, tools)) is None
    # The fallback answers such a conversation, as it answers any foreign client.
    filler = OracleBehaviour(oracle_book()).reply(_turn(_opening(test, system=foreign), tools))
    assert not filler.tool_calls
    assert len(filler.pieces()) == 8


def test_the_opening_does_not_depend_on_the_payload_size_or_on_how_far_the_conversation_went() -> None:
    for size in (1_000, 2_000, 50_000, 120_000):
        t11 = by_id(payload_tokens=size)["T11"]
        assert _recognised(_turn(_opening(t11), _tools(t11))) == "T11"
    t11 = by_id(payload_tokens=2_000)["T11"]
    call = {"id": "c0", "type": "function",
            "function": {"name": "export_inventory", "arguments": '{"warehouse": "LIS-2"}'}}  # fmt: skip
    result = t11.tools()[0].fn({"warehouse": "LIS-2"})
    after = [*_opening(t11), {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c0", "content": str(result)}]  # fmt: skip
    reply = OracleBehaviour(oracle_book()).reply(_turn(after, _tools(t11)))
    assert "QX-40721" in reply.content  # read out of the payload it was given
    h1 = by_id()["H1"]
    deep = _opening(h1)
    for hop in range(1, 30):
        c = {"id": f"c{hop}", "type": "function", "function": {"name": "next_hop", "arguments": "{}"}}
        deep += [{"role": "assistant", "content": None, "tool_calls": [c]},
                 {"role": "tool", "tool_call_id": f"c{hop}", "content": "{}"}]  # fmt: skip
    assert _recognised(_turn(deep, _tools(h1))) == "H1"


def test_two_scenarios_on_one_opening_are_refused() -> None:
    (opening,) = next(s for s in scenarios() if s.id == "T1").openings

    def answer(_turn: Turn) -> Reply:
        return Reply(content="x")

    with pytest.raises(ConfigError, match="scenarios 'a' and 'b' open the same conversation"):
        ScenarioBook([Scenario("a", answer, openings=(opening,)), Scenario("b", answer, openings=(opening,))])
