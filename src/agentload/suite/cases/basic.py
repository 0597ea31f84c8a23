"""Category 1, basic tool calling: the right tool with the right string, only required arguments, exact JSON
built from a tool result, and no invented tool when the one needed does not exist."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.tools import Tool
from agentload.suite.cases.common import arg, as_json, system, tool
from agentload.suite.model import Category, SuiteTest, Verdict, failed, passed
from agentload.suite.scoring import NEGATION, answer, calls, calls_to, has, parse_json_object, sentences

# -- T1: the right tool with the right string argument ------------------------------------------------------------

PARCEL_ID = "ZX-4471-Q"
PARCEL = {"tracking_id": PARCEL_ID, "status": "out for delivery", "depot": "Setúbal", "eta": "today 14:00-16:00"}


def _t1_tools() -> list[Tool]:
    def track_parcel(args: Mapping[str, Any]) -> str:
        if arg(args, "tracking_id") != PARCEL_ID:
            return as_json({"error": {"status": 404, "message": f"no parcel {arg(args, 'tracking_id')!r}"}})
        return as_json(PARCEL)

    def find_depot(args: Mapping[str, Any]) -> str:
        return as_json({"city": arg(args, "city"), "depot": "Setúbal Norte", "opens": "08:00"})

    def exchange_rate(args: Mapping[str, Any]) -> str:
        return as_json({"base": arg(args, "base"), "quote": arg(args, "quote"), "rate": 1.0})

    return [
        tool("track_parcel", "Current status of a parcel, by tracking id.", track_parcel, strings=["tracking_id"]),
        tool("find_depot", "The depot that serves a city.", find_depot, strings=["city"]),
        tool("exchange_rate", "Exchange rate between two currencies.", exchange_rate, strings=["base", "quote"]),
    ]


def _t1_score(t: Transcript) -> Verdict:
    made = calls(t)
    if not made:
        return failed("no tool call")
    wrong = [c.name for c in made if c.name != "track_parcel"]
    if wrong:
        return failed(f"called {', '.join(wrong)} instead of only track_parcel")
    if made[0].arg("tracking_id") != PARCEL_ID:
        return failed(f"tracking_id was {made[0].arguments}, expected {PARCEL_ID!r}")
    if not has(answer(t), r"out for delivery"):
        return failed("the answer does not give the parcel's status (out for delivery)")
    return passed("track_parcel with the exact id; status reported")


T1 = SuiteTest(
    id="T1",
    category=Category.BASIC,
    title="right tool, right string argument",
    system=system(),
    user=f"Where is my parcel {PARCEL_ID} right now?",
    tools=_t1_tools,
    score=_t1_score,
)

# -- T2: only the required arguments -----------------------------------------------------------------------------

ROOM, ROOM_DATE = "Aurora", "2025-03-14"
BOOKING = {"booking_id": "BK-3318", "room": ROOM, "date": ROOM_DATE, "status": "confirmed"}


def _t2_tools() -> list[Tool]:
    def book_room(args: Mapping[str, Any]) -> str:
        return as_json({**BOOKING, "room": arg(args, "room"), "date": arg(args, "date")})

    def list_rooms(args: Mapping[str, Any]) -> str:
        return as_json({"rooms": ["Aurora", "Boreal", "Cabo"]})

    optional = {
        "start_time": "string",
        "duration_minutes": "integer",
        "attendees": "integer",
        "projector": "boolean",
        "catering": "boolean",
        "notes": "string",
    }
    return [
        tool(
            "book_room",
            "Book a meeting room for a day. Only room and date are required; the rest are optional extras.",
            book_room,
            strings=["room", "date"],
            optional=optional,
        ),
        tool("list_rooms", "The meeting rooms that can be booked.", list_rooms),
    ]


def _t2_score(t: Transcript) -> Verdict:
    bookings = calls_to(t, "book_room")
    if len(bookings) != 1:
        return failed(f"book_room called {len(bookings)} times, expected once")
    c = bookings[0]
    if c.args is None:
        return failed(f"book_room arguments are not a JSON object: {c.arguments}")
    # An optional key sent as null is not an invented value; any other optional key is.
    extra = sorted(k for k, v in c.args.items() if k not in ("room", "date") and v is not None)
    if extra:
        return failed(f"invented optional arguments: {', '.join(extra)}")
    room = c.arg("room").lower().removesuffix(" room").strip()
    if room != ROOM.lower() or c.arg("date") != ROOM_DATE:
        return failed(f"booked {c.arguments}, expected room {ROOM!r} on {ROOM_DATE}")
    return passed("book_room with room and date only")


T2 = SuiteTest(
    id="T2",
    category=Category.BASIC,
    title="only required arguments, no invented optional ones",
    system=system(),
    user=f"Please book the {ROOM} room for {ROOM_DATE}.",
    tools=_t2_tools,
    score=_t2_score,
)

# -- T3: exactly the asked fields as raw JSON --------------------------------------------------------------------

EMPLOYEE_ID = "E-1093"
EMPLOYEE = {
    "employee_id": EMPLOYEE_ID,
    "name": "Marta Quaresma",
    "office": "Porto",
    "title": "Dispatcher",
    "phone": "+351 220 000 417",
    "start_date": "2019-06-03",
    "manager": "E-0088",
}


def _t3_tools() -> list[Tool]:
    def get_employee(args: Mapping[str, Any]) -> str:
        if arg(args, "employee_id") != EMPLOYEE_ID:
            return as_json({"error": {"status": 404, "message": "no such employee"}})
        return as_json(EMPLOYEE)

    return [tool("get_employee", "An employee's HR record.", get_employee, strings=["employee_id"])]


def _t3_score(t: Transcript) -> Verdict:
    if not any(c.arg("employee_id") == EMPLOYEE_ID for c in calls_to(t, "get_employee")):
        return failed(f"get_employee was not called for {EMPLOYEE_ID}")
    obj = parse_json_object(answer(t))
    if obj is None:
        return failed("the answer is not a bare JSON object (prose or code fences around it?)")
    if set(obj) != {"name", "office"}:
        return failed(f"fields {sorted(obj)}, expected exactly ['name', 'office']")
    if obj["name"] != EMPLOYEE["name"] or obj["office"] != EMPLOYEE["office"]:
        return failed(f"values {obj} do not match the record")
    return passed("bare JSON with exactly name and office")


T3 = SuiteTest(
    id="T3",
    category=Category.BASIC,
    title="parse a tool result into JSON with exactly the asked fields",
    system=system(),
    user=(
        f"Look up employee {EMPLOYEE_ID} and reply with a JSON object that has exactly two fields, "
        '"name" and "office". No other fields, no code fences, no prose.'
    ),
    tools=_t3_tools,
    score=_t3_score,
)

# -- T4: the needed tool does not exist --------------------------------------------------------------------------

T4_TOOLS = ("get_calendar", "calculator")
COURIER_PHONE = "+351 912 000 111"


def _t4_tools() -> list[Tool]:
    def get_calendar(args: Mapping[str, Any]) -> str:
        return as_json({"date": arg(args, "date"), "events": []})

    def calculator(args: Mapping[str, Any]) -> str:
        return as_json({"expression": arg(args, "expression"), "result": None, "error": "not evaluated"})

    return [
        tool("get_calendar", "The user's calendar for a date.", get_calendar, strings=["date"]),
        tool("calculator", "Evaluate an arithmetic expression.", calculator, strings=["expression"]),
    ]


CANNOT_SEND = (
    r"(?:can't|cannot|can not|unable to|not able to|couldn't|could not|no way to|don't have a way to) "
    r"(?:\w+ ){0,3}(?:send|text|message|sms|contact|reach)|no (?:\w+ )?(?:tool|way) (?:\w+ ){0,3}(?:send|text|sms)|"
    r"(?:none of|no) (?:my|the) tools? (?:can|lets|allows)|(?:don't|do not) have (?:\w+ ){0,3}(?:tool|way|ability)"
    r"|(?:have|has) no (?:\w+ ){0,2}(?:tool|way)|(?:haven't|have not|didn't|did not) (?:\w+ ){0,2}(?:sent|send|text)"
)


def _t4_score(t: Transcript) -> Verdict:
    invented = sorted({c.name for c in calls(t) if c.name not in T4_TOOLS})
    if invented:
        return failed(f"called a tool that does not exist: {', '.join(invented)}")
    text = answer(t)
    if not text:
        return failed("no answer")
    # "I've sent it" is a false claim; "I can't send texts" is the honest answer, so look at each sentence.
    for s in sentences(text):
        if has(s, r"\b(?:sent|texted|messaged|delivered)\b") and not has(s, NEGATION):
            return failed(f"claims the message was sent: {s!r}")
    # Silence about it is not enough: "Done, all taken care of" invents an outcome without the word "sent".
    if not has(text, CANNOT_SEND):
        return failed("the answer does not say that no tool can send the message")
    return passed("no invented tool, no false claim of sending, says it cannot send")


T4 = SuiteTest(
    id="T4",
    category=Category.BASIC,
    title="needed tool does not exist: no invented call",
    system=system(),
    user=f"Text my courier on {COURIER_PHONE} that I'll be 20 minutes late.",
    tools=_t4_tools,
    score=_t4_score,
)

TESTS = [T1, T2, T3, T4]
