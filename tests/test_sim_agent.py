"""The agent behaviour as a foreign harness meets it: an agent loop written here, not agentload's, with
17 tool-use tasks in the style of common agent suites, driven over HTTP with the ``openai`` SDK and
``tool_choice="auto"`` — tool calls where a task needs them, none where it does not, 0 HTTP errors."""

from __future__ import annotations

import ast
import json
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from agentload.cli.sim import make_behaviour
from agentload.errors import ConfigError
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.behaviour import Turn
from agentload.sim.chat import Message, Tool
from tests.simserver import running_sim


def fn(name: str, description: str, props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    params["required"] = list(props) if required is None else required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


S = {"type": "string"}
WEATHER = fn(
    "get_current_weather",
    "Get the current weather in a given location.",
    {"location": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    ["location"],
)
CALC = fn("calculator", "Evaluate an arithmetic expression.", {"expression": S})
SEARCH_FILES = fn("search_files", "Search the repository's files for text.", {"query": S, "directory": S}, ["query"])
READ_FILE = fn("read_file", "Read a file from the repository.", {"path": S})
WRITE_FILE = fn("write_file", "Write a text file.", {"path": S, "content": S})
FIND_CUSTOMER = fn("find_customer", "Find a customer by e-mail address.", {"email": S})
LIST_ORDERS = fn("list_orders", "List a customer's orders.", {"customer_id": S})
CONVERT = fn(
    "convert_currency",
    "Convert an amount between currencies.",
    {"amount": {"type": "number"}, "from_currency": S, "to_currency": S},
)
STOCK = fn("get_stock_price", "Latest stock price for a ticker symbol.", {"symbol": S})
SEND_EMAIL = fn("send_email", "Send an e-mail.", {"to": S, "subject": S, "body": S})
SEARCH_DOCS = fn("search_docs", "Search the documentation.", {"query": S})
CREATE_EVENT = fn(
    "create_event",
    "Create a calendar event.",
    {"title": S, "date": S, "time": S, "duration_minutes": {"type": "integer", "minimum": 5}},
    ["title", "date", "time"],
)
TRANSLATE = fn("translate_text", "Translate text into another language.", {"text": S, "target_language": S})
WEB = fn("search_web", "Search the web for up-to-date news.", {"query": S})


def _arith(node: ast.AST) -> float:
    ops: dict[type[ast.operator], Callable[[float, float], float]] = {
        ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv
    }  # fmt: skip
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        return ops[type(node.op)](_arith(node.left), _arith(node.right))
    raise ValueError("not arithmetic")


def tool_impl(name: str, args: dict[str, Any]) -> Any:
    """The harness's own fake tools: plausible results keyed on the arguments."""
    if name == "get_current_weather":
        temps = {"lisbon": 21, "paris": 14, "tokyo": 9}
        return {"location": args["location"], "temperature": temps.get(args["location"].lower(), 0), "sky": "clear"}
    if name == "calculator":
        return {"result": _arith(ast.parse(args["expression"], mode="eval"))}
    if name == "search_files":
        return {"matches": ["src/net/retry.py", "docs/retries.md"] if "retry_budget" in args["query"] else []}
    if name == "read_file":
        return {"path": args["path"], "text": "port: 8080\nworkers: 4"} if args["path"] == "config.yaml" else None
    if name == "find_customer":
        return {"customer_id": "C-7781", "name": "Ana Silva"} if args["email"] == "ana@example.com" else {}
    if name == "list_orders":
        return {"orders": [{"order_id": "O-551", "status": "open"}] if args["customer_id"] == "C-7781" else []}
    if name == "convert_currency":
        return {"converted": round(float(args["amount"]) * 0.92, 2), "currency": args["to_currency"]}
    if name == "get_stock_price":
        return {"symbol": args["symbol"], "price": 187.44}
    if name == "search_docs":
        return {"hits": ["Rate limits: 600 requests per minute per key."]}
    if name in ("send_email", "write_file", "create_event"):
        return {"ok": True}
    if name == "translate_text":
        return {"translation": "bonjour"}
    return {"error": "unknown tool"}


def schema_errors(schema: dict[str, Any], value: Any, where: str = "") -> list[str]:
    """A small JSON-schema check (type, required, enum, minimum, additionalProperties) for the calls made."""
    kind = schema.get("type")
    types = {"string": str, "number": int | float, "integer": int, "boolean": bool, "object": dict, "array": list}
    if (kind in types and not isinstance(value, types[kind])) or (kind != "boolean" and isinstance(value, bool)):
        return [f"{where}: {value!r} is not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in enum")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value!r} below minimum")
    if kind == "object":
        props = schema.get("properties", {})
        errors += [f"{where}.{k}: missing" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            errors += [f"{where}.{k}: not allowed" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                errors += schema_errors(props[k], v, f"{where}.{k}")
    return errors


@dataclass
class Task:
    prompt: str
    tools: list[dict[str, Any]]
    expect: list[str]  # the tools the task needs, in the order they are first called ([] = none)
    answer_has: list[str] = field(default_factory=list)  # what the final answer must mention
    args: dict[str, Any] = field(default_factory=dict)  # "tool.param" -> value the call must carry
    parallel: int = 0  # calls the first turn must make at once


TASKS = [
    Task("What's the weather in Lisbon right now?", [WEATHER, CALC], ["get_current_weather"], ["21"],
         {"get_current_weather.location": "Lisbon"}),
    Task("Compare the weather in Paris and Tokyo.", [WEATHER], ["get_current_weather"], ["14", "9"], parallel=2),
    Task("What is 1234 * 5678?", [CALC, WEATHER], ["calculator"], ["7006652"]),
    Task("Which files in the repository mention retry_budget?", [SEARCH_FILES, READ_FILE], ["search_files"],
         ["src/net/retry.py"]),
    Task("Show me what's in config.yaml.", [READ_FILE, SEARCH_FILES], ["read_file"], ["8080"],
         {"read_file.path": "config.yaml"}),
    Task("What is the capital of France?", [WEATHER, CALC], []),
    Task("Write a short haiku about autumn leaves.", [WRITE_FILE, WEATHER], []),
    Task("Explain the difference between a list and a tuple in Python.", [WEB, CALC], []),
    Task("Look up the customer with e-mail ana@example.com, then list their orders.", [FIND_CUSTOMER, LIST_ORDERS],
         ["find_customer", "list_orders"], ["O-551"], {"list_orders.customer_id": "C-7781"}),
    Task("Convert 250 USD to EUR.", [CONVERT], ["convert_currency"], ["230"],
         {"convert_currency.amount": 250, "convert_currency.from_currency": "USD",
          "convert_currency.to_currency": "EUR"}),
    Task("What's the latest stock price for AAPL?", [STOCK, WEB], ["get_stock_price"], ["187.44"],
         {"get_stock_price.symbol": "AAPL"}),
    Task("Send an email to bob@example.com saying the build is fixed.", [SEND_EMAIL, WEB], ["send_email"], [],
         {"send_email.to": "bob@example.com"}),
    Task("Search the docs for rate limits and save a summary to notes.md.", [SEARCH_DOCS, WRITE_FILE],
         ["search_docs", "write_file"], [], {"write_file.path": "notes.md"}),
    Task("Schedule a meeting called 'Design review' on 2025-03-14 at 15:00.", [CREATE_EVENT, WEATHER],
         ["create_event"], [], {"create_event.title": "Design review", "create_event.date": "2025-03-14",
                                "create_event.time": "15:00"}),
    Task("Translate 'good morning' into French.", [TRANSLATE], ["translate_text"], ["bonjour"],
         {"translate_text.text": "good morning", "translate_text.target_language": "French"}),
    Task("Thanks, that's all for now!", [WEATHER, CALC], []),
    Task("Will I need an umbrella today?", [WEATHER], [], ["location"]),  # no place given: ask for it
]  # fmt: skip


@dataclass
class Outcome:
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    first_turn_calls: int = 0
    answer: str = ""
    http_errors: int = 0
    schema_errors: list[str] = field(default_factory=list)

    def sensible(self, task: Task) -> bool:
        names = list(dict.fromkeys(n for n, _ in self.calls))
        if names != task.expect or self.schema_errors or not self.answer.strip():
            return False
        if task.parallel and self.first_turn_calls < task.parallel:
            return False
        for key, want in task.args.items():
            tool, param = key.split(".")
            if not any(n == tool and a.get(param) == want for n, a in self.calls):
                return False
        return all(s.lower() in self.answer.lower() for s in task.answer_has)


async def run_task(client: openai.AsyncOpenAI, model: str, task: Task, max_rounds: int = 6) -> Outcome:
    """A minimal agent loop of the kind every agent framework has: call, run the tools, send results back."""
    out = Outcome()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in task.tools}
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for rnd in range(max_rounds):
        try:
            # Plain dicts, as a harness builds them; the SDK's TypedDicts would only restate them.
            r = await client.chat.completions.create(  # type: ignore[call-overload]
                model=model, messages=messages, tools=task.tools, tool_choice="auto", max_tokens=400
            )
        except openai.APIStatusError:
            out.http_errors += 1
            return out
        msg = r.choices[0].message
        if not msg.tool_calls:
            out.answer = msg.content or ""
            return out
        if rnd == 0:
            out.first_turn_calls = len(msg.tool_calls)
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            out.calls.append((call.function.name, args))
            out.schema_errors += schema_errors(schemas.get(call.function.name, {}), args, call.function.name)
            result = tool_impl(call.function.name, args)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    return out


async def test_a_foreign_harness_gets_tool_calls_where_its_tasks_need_them() -> None:
    async with running_sim(behaviour=AgentBehaviour()) as (server, url):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)
        try:
            outcomes = [await run_task(client, server.model_name, task) for task in TASKS]
        finally:
            await client.close()
    sensible = [t.prompt for t, o in zip(TASKS, outcomes, strict=True) if o.sensible(t)]
    not_sensible = {t.prompt: (o.calls, o.answer[:120]) for t, o in zip(TASKS, outcomes, strict=True)
                    if not o.sensible(t)}  # fmt: skip
    print(f"\nforeign harness: {len(sensible)} of {len(TASKS)} tasks completed sensibly; not: {not_sensible}")
    assert sum(o.http_errors for o in outcomes) == 0
    assert [o.schema_errors for o in outcomes] == [[]] * len(TASKS)
    no_tool = [o for t, o in zip(TASKS, outcomes, strict=True) if not t.expect]
    assert all(not o.calls for o in no_tool), "a task that needs no tool got a tool call"
    assert len(sensible) >= 12, not_sensible


# -- the behaviour itself, without HTTP -------------------------------------------------------------------------


def _turn(messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int = 0, **kw: Any) -> Turn:
    return Turn(
        messages=[Message.model_validate(m) for m in messages],
        tools=[Tool.model_validate(t) for t in tools],
        tool_choice=kw.get("tool_choice", "auto"),
        max_tokens=kw.get("max_tokens"),
        max_output=4096,
        rng=random.Random(seed),
    )


def test_tool_choice_none_and_forced_are_honoured() -> None:
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    assert not AgentBehaviour().reply(_turn(ask, [WEATHER], tool_choice="none")).tool_calls
    forced = {"type": "function", "function": {"name": "calculator"}}
    calls = AgentBehaviour().reply(_turn(ask, [WEATHER, CALC], tool_choice=forced)).tool_calls
    assert [c.name for c in calls] == ["calculator"]
    assert set(json.loads(calls[0].arguments)) == {"expression"}


def test_it_stops_calling_after_its_round_cap() -> None:
    # Searched once; the write it was asked for is still to do — unless one round was all it may take.
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Search the docs for rate limits and save a summary to notes.md."},
        {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function",
                                              "function": {"name": "search_docs", "arguments": '{"query": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"hits": ["600 requests per minute"]}'},
    ]  # fmt: skip
    calls = AgentBehaviour(max_rounds=2).reply(_turn(messages, [SEARCH_DOCS, WRITE_FILE])).tool_calls
    assert [c.name for c in calls] == ["write_file"]
    assert "600 requests per minute" in json.loads(calls[0].arguments)["content"]
    capped = AgentBehaviour(max_rounds=1).reply(_turn(messages, [SEARCH_DOCS, WRITE_FILE]))
    assert not capped.tool_calls
    assert "600 requests per minute" in capped.content


def test_the_same_seed_gives_the_same_reply_and_plain_lengths_vary() -> None:
    ask = [{"role": "user", "content": "Tell me something about the sea."}]
    replies = [AgentBehaviour().reply(_turn(ask, [], seed=s)).content for s in range(20)]
    assert replies == [AgentBehaviour().reply(_turn(ask, [], seed=s)).content for s in range(20)]
    assert len({len(r.split()) for r in replies}) >= 5  # lengths are drawn, not fixed


def test_the_error_rate_makes_each_named_mistake() -> None:
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    good = AgentBehaviour().reply(_turn(ask, [WEATHER, CALC])).tool_calls
    wrong_tool = bad_arg = 0
    for seed in range(60):
        calls = AgentBehaviour(error_rate=1.0).reply(_turn(ask, [WEATHER, CALC], seed=seed)).tool_calls
        if calls[0].name != good[0].name:
            wrong_tool += 1
        elif calls[0].arguments != good[0].arguments:
            bad_arg += 1
    assert wrong_tool > 0
    assert bad_arg > 0
    answered: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "get_current_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": '{"temperature": 14}'},
    ]  # fmt: skip
    texts = [AgentBehaviour(error_rate=1.0).reply(_turn(answered, [WEATHER], seed=s)).content for s in range(30)]
    assert any("EUR" in t for t in texts)  # the invented fact
    assert "EUR" not in AgentBehaviour().reply(_turn(answered, [WEATHER])).content
    with pytest.raises(ConfigError):
        AgentBehaviour(error_rate=1.5)


# -- no 500 from any behaviour ----------------------------------------------------------------------------------


@dataclass
class _Broken:
    name: str = "broken"

    def reply(self, turn: Turn) -> Any:
        raise TypeError("float() argument must be a string or a real number, not 'NoneType'")


async def test_a_behaviour_that_raises_gets_a_plain_answer_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    async with running_sim(behaviour=_Broken()) as (server, url):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)
        try:
            r = await client.chat.completions.create(
                model=server.model_name, messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            await client.close()
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    logged = [rec for rec in caplog.records if "could not interpret" in rec.getMessage()]
    assert len(logged) == 1
    assert "broken" in logged[0].getMessage()


@pytest.mark.parametrize(
    ("scenario", "tool", "result"),
    [
        # Two crashes a foreign harness once caused: T6 met a result without figures, T17 a list result without items.
        ("T6", "order_subtotal", '{"subtotal": null}'),
        ("T17", "list_show", '{"items": null}'),
        ("T10", "search_catalogue", ""),
        ("H1", "next_hop", "[1, 2]"),
    ],
)
def test_the_oracle_reads_foreign_tool_results_without_crashing(
    scenario: str, tool: str, result: str, caplog: pytest.LogCaptureFixture
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"[agentload:scenario={scenario}]"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": tool, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": result},
    ]  # fmt: skip
    reply = make_behaviour("oracle").reply(_turn(messages, []))
    assert reply.content or reply.tool_calls
    assert not [rec for rec in caplog.records if "could not interpret" in rec.getMessage()]
