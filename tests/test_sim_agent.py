"""The agent behaviour as a foreign harness meets it: an agent loop written here, not agentload's, with
17 tool-use tasks in the style of common agent suites, driven over HTTP with the ``openai`` SDK and
``tool_choice="auto"`` — tool calls where a task needs them, none where it does not, 0 HTTP errors."""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from agentload.errors import ConfigError
from agentload.sim.agent_conv import Conversation
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.behaviour import Turn
from agentload.sim.chat import Message, Tool
from agentload.suite.app import make_behaviour
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


# -- one rule at a time: argument values, tool_choice, chaining, retries, answers ----------------------------------

_Impl = Callable[..., Any]


def _drive(
    prompt: str, tools: list[tuple[dict[str, Any], _Impl]], tool_choice: str | dict[str, Any] = "auto", rounds: int = 8
) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """Runs the behaviour as an agent loop would, without HTTP: its calls (name, arguments) in order, its answer."""
    schemas = [s for s, _ in tools]
    impls = {s["function"]["name"]: f for s, f in tools}
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    calls: list[tuple[str, dict[str, Any]]] = []
    for rnd in range(rounds):
        choice = tool_choice if rnd == 0 else "auto"
        reply = AgentBehaviour().reply(_turn(messages, schemas, seed=rnd, tool_choice=choice))
        if not reply.tool_calls:
            return calls, reply.content
        ids = [f"c{rnd}-{i}" for i in range(len(reply.tool_calls))]
        messages.append({"role": "assistant", "tool_calls": [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in zip(ids, reply.tool_calls, strict=True)]})  # fmt: skip
        for i, c in zip(ids, reply.tool_calls, strict=True):
            args = json.loads(c.arguments)
            calls.append((c.name, args))
            messages.append({"role": "tool", "tool_call_id": i, "content": json.dumps(impls[c.name](**args))})
    return calls, ""


def _first_call(prompt: str, tools: list[dict[str, Any]], **kw: Any) -> tuple[str, dict[str, Any]]:
    calls = AgentBehaviour().reply(_turn([{"role": "user", "content": prompt}], tools, **kw)).tool_calls
    assert calls, f"no call for {prompt!r}"
    return calls[0].name, json.loads(calls[0].arguments)


LOOKUP = fn("lookup_record", "Look up a record by its id.", {"record_id": S})
UUID = "3f2b9c1e-8a7d-4e6f-9b1a-2c3d4e5f6a7b"


@pytest.mark.parametrize(
    ("prompt", "want"),
    [
        ("Look up record E-1093 for me.", "E-1093"),
        ("Please look up the record ZX-4471-Q.", "ZX-4471-Q"),
        ("Look up record 12345, please.", "12345"),
        (f"Look up record {UUID} and summarise it.", UUID),
        ("Look up record k07-3fa2b1 from yesterday.", "k07-3fa2b1"),
    ],
)
def test_each_id_shape_is_passed_whole(prompt: str, want: str) -> None:
    assert _first_call(prompt, [LOOKUP, WEATHER]) == ("lookup_record", {"record_id": want})


def test_an_id_named_as_another_kind_of_thing_is_not_used_for_this_one() -> None:
    # An order's UUID is no tracking number: the parcel is tracked with the number the order gives.
    order = fn("get_order", "Fetch an order by its order id.", {"order_id": S})
    track = fn("track_parcel", "Status of a parcel by tracking number.", {"tracking_number": S})
    tools = [
        (order, lambda order_id: {"carrier": "DHL", "tracking_number": "ZX-4471-Q"} if order_id == UUID else {}),
        (track, lambda tracking_number: {"status": "out for delivery" if tracking_number == "ZX-4471-Q" else "?"}),
    ]
    calls, answer = _drive(f"Has order {UUID} shipped, and where is the parcel now?", tools)
    assert calls == [("get_order", {"order_id": UUID}), ("track_parcel", {"tracking_number": "ZX-4471-Q"})]
    assert "out for delivery" in answer


@pytest.mark.parametrize(
    ("prompt", "city"),
    [
        ("What's the weather in San Francisco right now?", "San Francisco"),
        ("Is it raining in Rio de Janeiro today?", "Rio de Janeiro"),
        ("Weather for New York, please.", "New York"),
        ("How hot is it in Lisbon?", "Lisbon"),
    ],
)
def test_a_city_is_taken_without_the_words_around_it(prompt: str, city: str) -> None:
    assert _first_call(prompt, [WEATHER, CALC]) == ("get_current_weather", {"location": city})


def test_a_quoted_name_and_the_date_and_time_fill_their_parameters() -> None:
    name, args = _first_call("Schedule a meeting called 'Design review' on 2025-03-14 at 15:00 for 45 minutes.",
                             [CREATE_EVENT, WEATHER])  # fmt: skip
    assert name == "create_event"
    assert args == {"title": "Design review", "date": "2025-03-14", "time": "15:00", "duration_minutes": 45}


def test_numbers_with_units_fill_a_conversion() -> None:
    convert = fn("convert_units", "Convert a distance between units.",
                 {"value": {"type": "number"}, "from_unit": S, "to_unit": S})  # fmt: skip
    # "convert" and two units are the evidence: the tool is chosen under "auto", with nothing else to go on.
    assert _first_call("Convert 42 km to miles.", [convert, WEATHER]) == (
        "convert_units", {"value": 42.0, "from_unit": "km", "to_unit": "mi"}
    )  # fmt: skip
    enum = {"type": "string", "enum": ["mi", "km"]}
    typed = fn(
        "convert_units", "Convert a distance.", {"value": {"type": "number"}, "from_unit": enum, "to_unit": enum}
    )
    assert _first_call("How far is 10 miles in km?", [typed]) == (
        "convert_units", {"value": 10.0, "from_unit": "mi", "to_unit": "km"}
    )  # fmt: skip
    # A lone duration is a quantity, not a conversion: no converter for it.
    reply = AgentBehaviour().reply(_turn([{"role": "user", "content": "Remind me in 20 minutes."}], [convert]))
    assert not reply.tool_calls


def test_tool_choice_auto_required_none_and_named() -> None:
    ask = [{"role": "user", "content": "Where's my parcel ZX-4471-Q?"}]
    track = fn("track_parcel", "Status of a parcel by tracking number.", {"tracking_number": S})
    auto = AgentBehaviour().reply(_turn(ask, [track, WEATHER], tool_choice="auto")).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in auto] == [("track_parcel", {"tracking_number": "ZX-4471-Q"})]
    assert not AgentBehaviour().reply(_turn(ask, [track, WEATHER], tool_choice="none")).tool_calls
    chat = [{"role": "user", "content": "Hello there, how are you?"}]
    assert not AgentBehaviour().reply(_turn(chat, [track, WEATHER], tool_choice="auto")).tool_calls
    forced = AgentBehaviour().reply(_turn(chat, [track, WEATHER], tool_choice="required")).tool_calls
    assert len(forced) == 1
    assert forced[0].name in ("track_parcel", "get_current_weather")
    named = {"type": "function", "function": {"name": "get_current_weather"}}
    called = AgentBehaviour().reply(_turn(ask, [track, WEATHER], tool_choice=named)).tool_calls
    assert [c.name for c in called] == ["get_current_weather"]
    assert set(json.loads(called[0].arguments)) >= {"location"}


def _employees() -> list[tuple[dict[str, Any], _Impl]]:
    people = {"E-1093": {"name": "Marta Quaresma", "office": "Porto", "manager_id": "E-0088"},
              "E-0088": {"name": "Rui Lobo", "office": "Lisbon", "manager_id": None}}  # fmt: skip
    phones = {"Porto": "+351 220 000 100", "Lisbon": "+351 210 000 200"}
    return [
        (fn("get_employee", "Look up an employee record by employee id.", {"employee_id": S}),
         lambda employee_id: people.get(employee_id, {"error": "no such employee"})),
        (fn("office_info", "Contact details of the company office in a city.", {"city": S}),
         lambda city: {"city": city, "phone": phones[city]} if city in phones else {"error": "unknown office"}),
    ]  # fmt: skip


def test_a_relative_the_request_asks_about_is_looked_up_before_what_depends_on_it() -> None:
    prompt = "Look up employee E-1093, find their manager, then tell me which city the manager's office is in."
    calls, answer = _drive(prompt, _employees())
    assert calls == [("get_employee", {"employee_id": "E-1093"}), ("get_employee", {"employee_id": "E-0088"}),
                     ("office_info", {"city": "Lisbon"})]  # fmt: skip
    assert "Lisbon" in answer
    # Without a word about the manager, the employee's own office is the one wanted: no detour.
    calls, answer = _drive("Look up employee E-1093, then get the phone number of the office where they work.",
                           _employees())  # fmt: skip
    assert calls == [("get_employee", {"employee_id": "E-1093"}), ("office_info", {"city": "Porto"})]
    assert "220 000 100" in answer


def _files(files: dict[str, str]) -> tuple[dict[str, Any], _Impl]:
    def read(path: str) -> dict[str, Any]:
        return {"path": path, "text": files[path]} if path in files else {"error": f"no file {path}"}

    return fn("read_file", "Read a text file and return its contents.", {"path": S}), read


def _calculator() -> tuple[dict[str, Any], _Impl]:
    from agentload.sim.agent_extract import evaluate

    return (CALC, lambda expression: {"result": evaluate(expression)})


def test_a_file_a_result_points_to_is_read_before_answering() -> None:
    files = {"start.md": "Setup notes are incomplete; see next.md for the rest.",
             "next.md": "The on-call lead is Ines Duarte."}  # fmt: skip
    calls, answer = _drive("Read start.md and follow whatever it points to; who is the on-call lead?", [_files(files)])
    assert calls == [("read_file", {"path": "start.md"}), ("read_file", {"path": "next.md"})]
    assert "Ines Duarte" in answer


def test_a_computation_asked_for_after_reading_is_done_with_the_calculator() -> None:
    files = {"team.txt": "The platform team has 4 engineers. Each one costs 1500 per month."}
    prompt = "Read the file team.txt and tell me the monthly cost of the whole team (engineers times cost each)."
    calls, answer = _drive(prompt, [_files(files), _calculator()])
    assert [n for n, _ in calls] == ["read_file", "calculator"]
    assert "6000" in answer
    calls, answer = _drive("Please open team.txt and sum the numbers in it.", [_calculator(), _files(files)])
    assert [n for n, _ in calls] == ["read_file", "calculator"]
    assert "1504" in answer


def test_a_value_from_one_result_feeds_the_next_step() -> None:
    tools = [(FIND_CUSTOMER, lambda email: {"customer_id": "C-7781"} if email == "ana@example.com" else {}),
             (LIST_ORDERS, lambda customer_id: {"orders": ["O-551"] if customer_id == "C-7781" else []})]  # fmt: skip
    calls, answer = _drive("Look up the customer with e-mail ana@example.com, then list their orders.", tools)
    assert calls == [("find_customer", {"email": "ana@example.com"}), ("list_orders", {"customer_id": "C-7781"})]
    assert "O-551" in answer


def test_a_tool_error_that_lists_the_valid_values_is_retried_once() -> None:
    office = fn("office_info", "Contact details of the company office in a city.", {"city": S})
    tried: list[str] = []

    def info(city: str) -> dict[str, Any]:
        tried.append(city)
        if city == "Porto":
            return {"city": "Porto", "phone": "+351 220 000 100"}
        return {"error": f"unknown office {city}; valid values are: Porto, Lisbon"}

    _, answer = _drive("Get me the phone number of our office in Oporto.", [(office, info)])
    assert tried == ["Oporto", "Porto"]
    assert "220 000 100" in answer
    # An error that keeps coming back is reported, not retried without end.
    stubborn: list[str] = []

    def never(city: str) -> dict[str, Any]:
        stubborn.append(city)
        return {"error": "unknown office; valid values are: Faro, Braga"}

    _, answer = _drive("Get me the phone number of our office in Oporto.", [(office, never)])
    assert len(stubborn) == 2
    assert "failed" in answer.lower() or "could not" in answer.lower()


def test_then_remove_uses_the_remove_tool_and_the_answer_says_so() -> None:
    items: list[str] = []

    def add(item: str) -> dict[str, Any]:
        items.append(item)
        return {"added": item}

    def remove(item: str) -> dict[str, Any]:
        items.remove(item)
        return {"removed": item}

    tools: list[tuple[dict[str, Any], _Impl]] = [
        (fn("list_add", "Add an item to the shopping list.", {"item": S}), add),
        (fn("list_remove", "Remove an item from the list.", {"item": S}), remove),
        (fn("list_show", "The items on the shopping list.", {}), lambda: {"items": list(items)}),
    ]
    calls, answer = _drive("On my shopping list: add 'oat milk', 'rye bread' and 'lemons'. Then remove 'rye bread'. "
                           "Then tell me what is on the list.", tools)  # fmt: skip
    assert [n for n, _ in calls] == ["list_add"] * 3 + ["list_remove", "list_show"]
    assert items == ["oat milk", "lemons"]
    assert ("list_remove", {"item": "rye bread"}) in calls
    assert "removed rye bread" in answer


def test_one_observation_message_answering_two_calls_is_split_between_them() -> None:
    # A framework that replays its calls as text and sends both results in one user message.
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Has order {UUID} shipped, and where is the parcel now?"},
        {"role": "assistant", "content": "Calling tools:\n[{'id': 'a', 'type': 'function', 'function': {'name': "
         f"'get_order', 'arguments': {{'order_id': '{UUID}'}}}}}}, {{'id': 'b', 'type': 'function', 'function': "
         "{'name': 'track_parcel', 'arguments': {'tracking_number': 'X'}}}]"},
        {"role": "user", "content": 'Observation:\n{"carrier": "DHL", "tracking_number": "ZX-4471-Q"}\n'
                                    '{"error": "unknown parcel"}'},
    ]  # fmt: skip
    order = fn("get_order", "Fetch an order by its order id.", {"order_id": S})
    track = fn("track_parcel", "Status of a parcel by tracking number.", {"tracking_number": S})
    turn = _turn(messages, [order, track])
    results = Conversation.read(turn.messages).results
    assert [(r.name, r.failed) for r in results] == [("get_order", False), ("track_parcel", True)]
    assert results[0].value == {"carrier": "DHL", "tracking_number": "ZX-4471-Q"}
    calls = AgentBehaviour().reply(turn).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("track_parcel", {"tracking_number": "ZX-4471-Q"})]


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        (UUID, "english"),
        (json.dumps({"order_id": UUID, "status": "shipped", "carrier": "DHL"}), "english"),
        ("Porto e Lisboa", "english"),  # two place names and an "e": too little to call it Portuguese
        ("The parcel is on its way and arrives tomorrow.", "english"),
        ("A casa é muito bonita e fica no centro da cidade.", "portuguese"),
        ("El hotel está cerca de la playa y tiene una piscina.", "spanish"),
        ("Le colis est arrivé dans la boîte aux lettres.", "french"),
        ("Das Paket ist auf dem Weg zu dir und kommt morgen.", "german"),
    ],
)
def test_a_language_is_named_only_on_several_of_its_own_words(text: str, lang: str) -> None:
    from agentload.sim.agent_extract import language

    assert language(text) == lang


def test_an_answer_is_whole_sentences_not_word_salad() -> None:
    for seed in range(10):
        plain = AgentBehaviour().reply(
            _turn([{"role": "user", "content": "Tell me about lighthouses."}], [], seed=seed)
        )
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", plain.content.strip()) if s]
        assert sentences
        assert all(s[0].isupper() and s[-1] in ".!?" and len(s.split()) >= 4 for s in sentences), sentences
        assert "lighthouses" in plain.content
        assert not re.search(r"\b(\w+) \1\b", plain.content, re.I)  # no word said twice in a row
    calls, answer = _drive("What's the weather in Lisbon right now?",
                           [(WEATHER, lambda location: {"location": location, "temperature": 21})])  # fmt: skip
    assert calls == [("get_current_weather", {"location": "Lisbon"})]
    assert re.fullmatch(r"(?:[A-Z][^.!?]*[.!?]\s*)+", answer.strip()), answer
    assert "21" in answer


async def test_a_call_fits_the_output_cap_so_its_arguments_stay_valid_json() -> None:
    # A long result to write out under a small max_tokens: the content is shortened, not cut mid-JSON.
    hits = " ".join(f"Rate limit rule {i}: 600 requests per minute per key, burst of {i} allowed." for i in range(40))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Search the docs for rate limits and save a summary to notes.md."},
        {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function",
                                              "function": {"name": "search_docs", "arguments": '{"query": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": json.dumps({"hits": [hits]})},
    ]  # fmt: skip
    async with running_sim(behaviour=AgentBehaviour()) as (server, url):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)
        try:
            # Plain dicts, as a harness builds them; the SDK's TypedDicts would only restate them.
            r = await client.chat.completions.create(
                model=server.model_name,
                messages=messages,  # type: ignore[arg-type]
                tools=[SEARCH_DOCS, WRITE_FILE],  # type: ignore[list-item]
                max_tokens=48,
            )
        finally:
            await client.close()
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    args = json.loads(call.function.arguments)
    assert args["path"] == "notes.md"
    assert args["content"].startswith("From search_docs")


def _shipments() -> list[dict[str, Any]]:
    rng = random.Random(7)
    states = ["delivered", "in transit"]
    rows = [{"id": f"SH-{1000 + i}", "carrier": rng.choice(["DHL", "UPS"]), "state": rng.choice(states)}
            for i in range(60)]  # fmt: skip
    rows[41]["state"] = "lost"
    return rows


def test_a_long_list_is_read_for_the_record_the_request_singles_out() -> None:
    """ "Which one is lost?" over 60 records: the answer names the one whose state is "lost", not the first lines."""
    list_tool = fn("list_shipments", "List every shipment of the week.", {})
    _, answer = _drive("List this week's shipments and tell me which one is lost.", [(list_tool, lambda: _shipments())])
    assert "SH-1041" in answer
    assert "SH-1000" not in answer


def test_json_lines_are_records_too() -> None:
    export = fn("export_shipments", "Export shipments, one JSON record per line.", {})
    lines = "\n".join(json.dumps(r) for r in _shipments())
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Export the shipments and tell me which one is lost."},
        {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function",
                                               "function": {"name": "export_shipments", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": lines},
    ]  # fmt: skip
    answer = AgentBehaviour().reply(_turn(messages, [export], seed=1)).content
    assert "SH-1041" in answer
    assert "SH-1000" not in answer
