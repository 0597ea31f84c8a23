"""Twenty multi-step tool tasks as a user would write them, for driving agent frameworks against the simulator.

Each task: a request, tools (OpenAI function schemas) with deterministic Python implementations, the
``tool_choice`` to run it under, and a check of the final answer. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Impl = Callable[..., Any]


def fn(name: str, description: str, props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": props}
    params["required"] = list(props) if required is None else required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


S = {"type": "string"}
N = {"type": "number"}


@dataclass
class AgentTask:
    prompt: str
    tools: list[tuple[dict[str, Any], Impl]]
    expect: str  # a substring the final answer must contain (case-insensitive)
    tool_choice: str | dict[str, Any] = "auto"
    chained: int = 1  # calls the task needs in sequence, at least

    def schemas(self) -> list[dict[str, Any]]:
        return [schema for schema, _ in self.tools]

    def impl(self, name: str) -> Impl:
        return next(f for s, f in self.tools if s["function"]["name"] == name)

    def run_tool(self, name: str, args: dict[str, Any]) -> str:
        try:
            result = self.impl(name)(**args)
        except (TypeError, KeyError, ValueError) as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        return result if isinstance(result, str) else json.dumps(result)

    def passed(self, answer: str) -> bool:
        return self.expect.lower() in (answer or "").lower()


FILES = {
    "team.txt": "The platform team has 4 engineers. Each one costs 1500 per month.",
    "start.md": "Setup notes are incomplete; see next.md for the rest.",
    "next.md": "The deploy password rotates every 30 days. The on-call lead is Ines Duarte.",
    "budget.csv": "item,amount\nservers,1200\nlicences,300\n",
}
EMPLOYEES = {"E-1093": {"name": "Marta Quaresma", "office": "Porto", "manager_id": "E-0088"},
             "E-0088": {"name": "Rui Lobo", "office": "Lisbon", "manager_id": None}}  # fmt: skip
OFFICES = {
    "porto": {"city": "Porto", "phone": "+351 220 000 100"},
    "lisbon": {"city": "Lisbon", "phone": "+351 210 000 200"},
}
WEATHER = {"porto": 17, "lisbon": 22, "san francisco": 15, "tokyo": 9}


def read_file(path: str) -> Any:
    return {"path": path, "text": FILES[path]} if path in FILES else {"error": f"no file named {path}"}


def calculator(expression: str) -> Any:
    from agentload.sim.agent_extract import evaluate

    value = evaluate(expression)
    return {"result": value} if value is not None else {"error": "cannot evaluate"}


def get_employee(employee_id: str) -> Any:
    return EMPLOYEES.get(employee_id, {"error": f"no employee {employee_id}"})


def office_info(city: str) -> Any:
    return OFFICES.get(city.lower(), {"error": f"unknown office {city}; valid values are: Porto, Lisbon"})


def weather(city: str) -> Any:
    t = WEATHER.get(city.lower())
    return {"city": city, "temperature_c": t} if t is not None else {"error": f"unknown city {city}"}


READ = (fn("read_file", "Read a text file and return its contents.", {"path": S}), read_file)
CALC = (fn("calculator", "Evaluate an arithmetic expression such as 3 * (4 + 5).", {"expression": S}), calculator)
EMP = (fn("get_employee", "Look up an employee record by employee id.", {"employee_id": S}), get_employee)
OFFICE = (fn("office_info", "Contact details of the company office in a city.", {"city": S}), office_info)
WX = (fn("get_weather", "Current temperature in a city.", {"city": S}), weather)
PARCELS = {"ZX-4471-Q": {"status": "out for delivery", "depot": "Setubal"}}
TRACK = (fn("track_parcel", "Status of a parcel by tracking number.", {"tracking_number": S}),
         lambda tracking_number: PARCELS.get(tracking_number, {"error": "unknown parcel"}))  # fmt: skip
PLACES = {"12345": {"name": "Trattoria Roma", "rating": 4.6, "address": "12 Post St"}}
SEARCH_PLACES = (
    fn("search_places", "Search for places such as restaurants or shops.", {"query": S}),
    lambda query: (
        {"results": [{"place_id": "12345", "name": "Trattoria Roma"}]}
        if "italian" in query.lower() and "union square" in query.lower()
        else {"results": []}
    ),
)
PLACE_DETAILS = (fn("place_details", "Details of a place by its place id.", {"place_id": S}),
                 lambda place_id: PLACES.get(place_id, {"error": "no such place"}))  # fmt: skip
UUID = "3f2b9c1e-8a7d-4e6f-9b1a-2c3d4e5f6a7b"
ORDERS = {UUID: {"order_id": UUID, "status": "shipped", "carrier": "DHL", "tracking_number": "ZX-4471-Q"}}
GET_ORDER = (fn("get_order", "Fetch an order by its order id.", {"order_id": S}),
             lambda order_id: ORDERS.get(order_id, {"error": "no such order"}))  # fmt: skip
SKUS = {"K-220": 14}
STOCK = (fn("check_stock", "Units in stock for a SKU.", {"sku": S}),
         lambda sku: {"sku": sku, "units": SKUS[sku]} if sku in SKUS else {"error": "unknown sku"})  # fmt: skip
CONVERT = (
    fn("convert_units", "Convert a distance between units.", {"value": N, "from_unit": {"type": "string",
       "enum": ["km", "mi"]}, "to_unit": {"type": "string", "enum": ["km", "mi"]}}),
    lambda value, from_unit, to_unit: {"result": round(value * (0.621371 if from_unit == "km" else 1.609344), 2),
                                       "unit": to_unit},
)  # fmt: skip
RELAY_KEYS = {f"r{n}-{n * 7919 % 1000:03d}": n for n in range(1, 6)}
RELAY = (
    fn("relay_step", "Send a relay key; returns the next key, or the final word.", {"key": S}),
    lambda key: (
        {"error": "unknown key"} if key not in RELAY_KEYS
        else {"final_word": "PELICAN"} if RELAY_KEYS[key] == 5
        else {"next_key": next(k for k, v in RELAY_KEYS.items() if v == RELAY_KEYS[key] + 1)}
    ),
)  # fmt: skip
FIRST_KEY = next(k for k, v in RELAY_KEYS.items() if v == 1)
TASKS: list[AgentTask] = [
    AgentTask("Read the file team.txt and tell me the monthly cost of the whole team (engineers times cost each).",
              [READ, CALC], "6000", chained=2),
    AgentTask("Please open budget.csv and add up the amounts for me.", [CALC, READ], "1500", chained=2),
    AgentTask("Who is the manager of employee E-1093? Give me the manager's name.", [EMP], "Rui Lobo", chained=2),
    AgentTask("Look up employee E-1093, then get the phone number of the office where they work.", [EMP, OFFICE],
              "220 000 100", chained=2),
    AgentTask("Where's my parcel ZX-4471-Q?", [TRACK, WX], "out for delivery", tool_choice="required"),
    AgentTask("Find Italian restaurants near Union Square, San Francisco and give me the rating of the first one.",
              [SEARCH_PLACES, PLACE_DETAILS], "4.6", chained=2),
    AgentTask("What is the address of place ID 12345?", [PLACE_DETAILS, SEARCH_PLACES], "12 Post St",
              tool_choice={"type": "function", "function": {"name": "place_details"}}),
    AgentTask(f"Has order {UUID} shipped yet, and where is the parcel now?", [GET_ORDER, TRACK],
              "out for delivery", chained=2),
    AgentTask("How many units of K-220 are in stock?", [STOCK, CALC], "14", tool_choice="required"),
    AgentTask("Convert 42 km to miles.", [CONVERT], "26.1", tool_choice="required"),
    AgentTask("What's the temperature in San Francisco right now?", [WX, OFFICE], "15"),
    AgentTask("Compare the weather in Porto and Lisbon.", [WX], "22"),
    AgentTask("Read start.md and follow whatever it points to; who is the on-call lead?", [READ], "Ines Duarte",
              chained=2),
    AgentTask(f"Start the relay with key {FIRST_KEY} and keep going until you get the final word.", [RELAY],
              "PELICAN", chained=5),
    AgentTask("What is 1234 * 5678?", [CALC, WX], "7006652",
              tool_choice={"type": "function", "function": {"name": "calculator"}}),
    AgentTask("Get me the phone number of our office in Oporto.", [OFFICE], "220 000 100"),
    AgentTask("Look up employee E-1093, find their manager, then tell me which city the manager's office is in.",
              [EMP, OFFICE], "Lisbon", chained=3),
    AgentTask("Order 3f2b9c1e-8a7d-4e6f-9b1a-2c3d4e5f6a7b: which carrier has it, and what's the parcel status?",
              [GET_ORDER, TRACK, WX], "DHL", chained=2),
    AgentTask("Read team.txt, then compute the team's yearly cost: engineers times monthly cost times 12.",
              [READ, CALC], "72000", chained=2),
    AgentTask("Look up employee E-1093 and then the weather in the city of their office.", [EMP, WX], "17",
              chained=2, tool_choice="required"),
]  # fmt: skip
