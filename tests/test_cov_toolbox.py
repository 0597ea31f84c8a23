"""A fleet agent's built-in tools and the registry that calls them. The model's tool calls come from a server,
which is untrusted input: whatever it sends, a call ends in a result the agent can send back (an ``error:`` text
for a bad call), never an exception that kills the agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentload.agent.tools import Tool, ToolRegistry
from agentload.errors import ConfigError
from agentload.fleet.toolbox import BUILTIN_TOOLS, ToolSettings, build_registry, calculator


def _registry(tmp_path: Path, *names: str, agent: str = "agent-0", calls_before: int = 0) -> ToolRegistry:
    settings = ToolSettings(agent, tmp_path / agent, result_tokens=12, latency_s=0.0, calls_before=calls_before)
    return build_registry(list(names or sorted(BUILTIN_TOOLS)), settings)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1234 * 5678", "7.00665e+06"),  # %g: six significant digits
        ("2 ** 10", "1024"),
        ("7 // 2", "3"),
        ("7 % 3", "1"),
        ("-3 + +5", "2"),
        ("1 / 4", "0.25"),
        ("(1 + 2) * 3", "9"),
        ("2 ** -1", "0.5"),
    ],
)
def test_calculator_does_arithmetic(expression: str, value: str) -> None:
    assert calculator({"expression": expression}) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",  # never eval()
        "x + 1",
        "'a' * 3",
        "True + 1",  # a bool is not a number here
        "[1, 2]",
        "2 ** 65",  # the exponent cap keeps 10 ** 10 ** 10 from running for ever
        "1 < 2",
    ],
)
def test_calculator_refuses_anything_but_numbers_and_operators(expression: str) -> None:
    with pytest.raises(ValueError, match=r"only numbers|exponent too large"):
        calculator({"expression": expression})


async def test_a_failing_tool_is_an_error_result_for_the_model(tmp_path: Path) -> None:
    reg = _registry(tmp_path, "calculator")
    result = await reg.call("calculator", json.dumps({"expression": "1 / 0"}))
    assert result.error
    assert result.text == "error: calculator failed: float division by zero"
    overflow = await reg.call("calculator", json.dumps({"expression": "(9 ** 64) ** 64"}))
    assert overflow.error
    assert overflow.text.startswith("error: calculator failed:")
    syntax = await reg.call("calculator", json.dumps({"expression": "1 +"}))
    assert syntax.error
    # 5,000 nested minus signs: too deep for the parser, and over the length bound, so refused before parsing.
    deep = await reg.call("calculator", json.dumps({"expression": "-" * 5000 + "1"}))
    assert deep.text == "error: calculator failed: expression longer than 1,000 characters"
    # Within the bound, a nesting the parser cannot build still says why.
    nested = await reg.call("calculator", json.dumps({"expression": "-" * 990 + "1"}))
    assert nested.error
    assert nested.text != "error: calculator failed: "


async def test_an_exception_without_a_message_is_reported_by_its_kind(tmp_path: Path) -> None:
    from agentload.agent.tools import Tool, ToolRegistry

    def broken(args: object) -> str:
        raise MemoryError

    reg = ToolRegistry.of([Tool("broken", "Always fails.", {"type": "object", "properties": {}}, broken)])
    result = await reg.call("broken", "{}")
    assert result.error
    assert result.text == "error: broken failed: MemoryError"


@pytest.mark.parametrize(
    ("name", "arguments", "text"),
    [
        ("shell", "{}", "error: there is no tool named 'shell'"),
        ("echo", "{not json", "error: the arguments for echo are not valid JSON"),
        ("echo", "[1, 2]", "error: the arguments for echo must be a JSON object"),
        ("echo", '"text"', "error: the arguments for echo must be a JSON object"),
        # Nested deeper than json's C decoder recurses: RecursionError, not ValueError — it escaped and ended the
        # agent until the registry caught it too.
        ("echo", "[" * 100_000 + "]" * 100_000, "error: the arguments for echo are not valid JSON"),
    ],
)
async def test_a_bad_call_from_the_model_is_an_error_result(
    tmp_path: Path, name: str, arguments: str, text: str
) -> None:
    result = await _registry(tmp_path, "echo").call(name, arguments)
    assert (result.error, result.text) == (True, text)


async def test_empty_arguments_are_an_empty_object(tmp_path: Path) -> None:
    result = await _registry(tmp_path, "echo").call("echo", "  ")
    assert (result.error, result.text) == (False, "")


async def test_echo_returns_its_text(tmp_path: Path) -> None:
    result = await _registry(tmp_path, "echo").call("echo", json.dumps({"text": "héllo"}))
    assert (result.error, result.text) == (False, "héllo")


async def test_search_results_have_the_stated_size_and_are_reproducible(tmp_path: Path) -> None:
    first = await _registry(tmp_path, "search").call("search", json.dumps({"query": "retry"}))
    again = await _registry(tmp_path, "search").call("search", json.dumps({"query": "retry"}))
    assert first == again  # same agent, same query, same call number: same text
    head, _, words = first.text.partition(": ")
    assert head == "Result 1 for 'retry'"
    assert len(words.split()) == 12  # result_tokens words: the context grows by a known amount


async def test_search_results_differ_by_agent_and_by_call(tmp_path: Path) -> None:
    reg = _registry(tmp_path, "search")
    one = await reg.call("search", json.dumps({"query": "q"}))
    two = await reg.call("search", json.dumps({"query": "q"}))
    assert two.text.startswith("Result 2 for 'q': ")
    assert one.text.split(": ", 1)[1] != two.text.split(": ", 1)[1]
    other = await _registry(tmp_path, "search", agent="agent-1").call("search", json.dumps({"query": "q"}))
    assert other.text.split(": ", 1)[1] != one.text.split(": ", 1)[1]


async def test_a_resumed_agent_continues_the_search_sequence(tmp_path: Path) -> None:
    # Three calls were committed before the run stopped: the resumed agent's first call is the fourth.
    fresh = _registry(tmp_path, "search")
    for _ in range(3):
        await fresh.call("search", json.dumps({"query": "q"}))
    fourth = await fresh.call("search", json.dumps({"query": "q"}))
    resumed = await _registry(tmp_path, "search", calls_before=3).call("search", json.dumps({"query": "q"}))
    assert resumed == fourth


def test_a_registry_holds_exactly_the_named_tools_in_order(tmp_path: Path) -> None:
    reg = _registry(tmp_path, "echo", "read_file", "search")
    assert reg.names() == ["echo", "read_file", "search"]
    assert [s["function"]["name"] for s in reg.schemas()] == ["echo", "read_file", "search"]
    assert reg.get("write_file") is None  # a file tool named pulls in only itself, not its siblings
    assert (tmp_path / "agent-0").is_dir()  # the agent's workspace, made for its file tool


def test_without_file_tools_no_workspace_is_made(tmp_path: Path) -> None:
    _registry(tmp_path, "echo", "calculator")
    assert not (tmp_path / "agent-0").exists()


async def test_each_agent_has_its_own_files(tmp_path: Path) -> None:
    a = _registry(tmp_path, "write_file", "read_file", "list_files", agent="a")
    b = _registry(tmp_path, "read_file", "list_files", agent="b")
    wrote = await a.call("write_file", json.dumps({"path": "notes/x.txt", "content": "mine"}))
    assert wrote.text == "wrote 4 characters to notes/x.txt"
    assert (await a.call("read_file", json.dumps({"path": "notes/x.txt"}))).text == "mine"
    theirs = await b.call("read_file", json.dumps({"path": "notes/x.txt"}))
    assert theirs.error
    assert (await b.call("list_files", "{}")).text == "(empty)"
    escape = await a.call("read_file", json.dumps({"path": "../b/notes/x.txt"}))
    assert escape.error


def test_a_tool_registered_twice_is_refused() -> None:
    tool = Tool("echo", "", {}, lambda args: "")
    with pytest.raises(ConfigError, match="tool 'echo' is registered twice"):
        ToolRegistry.of([tool, tool])


async def test_an_async_tool_is_awaited() -> None:
    async def later(args: object) -> str:
        return "done"

    reg = ToolRegistry.of([Tool("later", "", {}, later)])
    assert (await reg.call("later", "{}")).text == "done"
