"""Scenarios the oracle knows out of the box.

The behaviour suite's own scenarios (``agentload.suite.oracle``) are not imported here: the suite imports the
simulator, so the suite builds the book (``agentload.suite.app.oracle_book``) and hands it to
``OracleBehaviour``. These two small scenarios show the pattern — a correct reply plus named
known-bad replies that a scorer must fail:

* ``echo`` — reply with the last user message verbatim. Bad: ``refuse`` (generic), ``shout`` (upper-cased).
* ``tool-roundtrip`` — call the one offered tool with ``{"query": <last user text>}``; once its result is in the
  conversation, answer with that result. Bad: ``no-tool-call`` (answers without calling), ``invent-tool``
  (calls a tool that was not offered).
"""

from __future__ import annotations

import json

from agentload.sim.behaviour import PlannedCall, Reply, Scenario, Turn


def _echo(turn: Turn) -> Reply:
    return Reply(content=turn.last_user_text())


def _shout(turn: Turn) -> Reply:
    return Reply(content=turn.last_user_text().upper())


def _roundtrip(turn: Turn) -> Reply:
    last = turn.messages[-1]
    if last.role == "tool":
        return Reply(content=f"The tool returned: {last.text()}")
    name = turn.tools[0].function.name if turn.tools else "lookup"
    return Reply(tool_calls=[PlannedCall(name, json.dumps({"query": turn.last_user_text()}))])


def _no_tool_call(turn: Turn) -> Reply:
    return Reply(content="I believe the answer is 42.")


def _invent_tool(turn: Turn) -> Reply:
    return Reply(tool_calls=[PlannedCall("search_the_web", json.dumps({"q": turn.last_user_text()}))])


def builtin_scenarios() -> list[Scenario]:
    return [
        Scenario("echo", _echo, {"shout": _shout}),
        Scenario("tool-roundtrip", _roundtrip, {"no-tool-call": _no_tool_call, "invent-tool": _invent_tool}),
    ]
