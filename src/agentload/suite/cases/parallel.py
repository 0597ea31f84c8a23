"""Category 2, parallel tool calls: two independent lookups in one turn with each answer attributed, three
results combined into one figure, and two sources that disagree — the conflict flagged, not silently resolved."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.tools import Tool
from agentload.suite.cases.common import arg, as_json, system, tool
from agentload.suite.model import Category, SuiteTest, Verdict, failed, passed
from agentload.suite.scoring import Call, answer, call_rounds, calls_to, has, nearest


def _branch(c: Call) -> str:
    return c.arg("branch").lower().removesuffix(" branch").strip()


def _number(n: str) -> str:
    """``n`` as a whole number in text: not part of a time, a decimal or a longer number."""
    return rf"(?<![\d.,:]){n}(?![\d]|[.,:]\d)"


# -- T5: two independent tools in one turn, each answer attributed -----------------------------------------------

HOURS = {"porto": "08:30-17:45", "braga": "09:00-18:00", "lisboa": "08:00-20:00"}
QUEUE = {"porto": 3, "braga": 12, "lisboa": 25}


def _t5_tools() -> list[Tool]:
    def opening_hours(args: Mapping[str, Any]) -> str:
        b = arg(args, "branch").lower().removesuffix(" branch").strip()
        if b not in HOURS:
            return as_json({"error": {"status": 404, "message": f"unknown branch {b!r}"}})
        return as_json({"branch": b.title(), "hours_today": HOURS[b]})

    def queue_length(args: Mapping[str, Any]) -> str:
        b = arg(args, "branch").lower().removesuffix(" branch").strip()
        if b not in QUEUE:
            return as_json({"error": {"status": 404, "message": f"unknown branch {b!r}"}})
        return as_json({"branch": b.title(), "customers_waiting": QUEUE[b]})

    return [
        tool("opening_hours", "Today's opening hours of a branch.", opening_hours, strings=["branch"]),
        tool("queue_length", "Customers waiting at a branch right now.", queue_length, strings=["branch"]),
    ]


def _t5_score(t: Transcript) -> Verdict:
    together = any(
        any(c.name == "opening_hours" and _branch(c) == "porto" for c in batch)
        and any(c.name == "queue_length" and _branch(c) == "braga" for c in batch)
        for batch in call_rounds(t)
    )
    if not together:
        return failed("opening_hours(Porto) and queue_length(Braga) were not called in the same turn")
    text = answer(t)
    hours = r"\b0?8[:h.]30\b"
    if not has(text, hours) or not has(text, r"\b(?:17[:h.]45|5[:h.]45\s?pm)\b"):
        return failed("the answer does not give Porto's hours (08:30-17:45)")
    if not has(text, _number("12")):
        return failed("the answer does not give Braga's queue (12)")
    branches = ("porto", "braga")
    if nearest(text, hours, branches) != "porto" or nearest(text, _number("12"), branches) != "braga":
        return failed("the figures are attributed to the wrong branch")
    return passed("both lookups in one turn, each figure attributed to its branch")


T5 = SuiteTest(
    id="T5",
    category=Category.PARALLEL,
    title="two independent tools in one turn, each answer attributed",
    system=system("When lookups do not depend on each other, make them in the same turn."),
    user=(
        "Two things, please look them up at the same time: today's opening hours of our Porto branch, and how "
        "many customers are waiting at the Braga branch right now."
    ),
    tools=_t5_tools,
    score=_t5_score,
)

# -- T6: three results combined -----------------------------------------------------------------------------------

ORDER_ID = "5521"
SUBTOTAL_USD, SHIPPING_USD, USD_EUR = 240.00, 35.00, 0.9
TOTAL_EUR = "247.50"  # (240.00 + 35.00) × 0.9


def _order(args: Mapping[str, Any]) -> str:
    return arg(args, "order_id").lower().removeprefix("order").strip().lstrip("#").strip()


def _t6_tools() -> list[Tool]:
    def order_subtotal(args: Mapping[str, Any]) -> str:
        if _order(args) != ORDER_ID:
            return as_json({"error": {"status": 404, "message": "no such order"}})
        return as_json({"order_id": ORDER_ID, "subtotal": SUBTOTAL_USD, "currency": "USD"})

    def shipping_quote(args: Mapping[str, Any]) -> str:
        if _order(args) != ORDER_ID:
            return as_json({"error": {"status": 404, "message": "no such order"}})
        return as_json({"order_id": ORDER_ID, "shipping": SHIPPING_USD, "currency": "USD"})

    def exchange_rate(args: Mapping[str, Any]) -> str:
        pair = (arg(args, "base").upper(), arg(args, "quote").upper())
        rate = {("USD", "EUR"): USD_EUR, ("EUR", "USD"): round(1 / USD_EUR, 4)}.get(pair)
        if rate is None:
            return as_json({"error": {"status": 400, "message": f"no rate for {pair[0]}/{pair[1]}"}})
        return as_json({"base": pair[0], "quote": pair[1], "rate": rate})

    return [
        tool("order_subtotal", "An order's item subtotal.", order_subtotal, strings=["order_id"]),
        tool("shipping_quote", "The shipping cost of an order.", shipping_quote, strings=["order_id"]),
        tool(
            "exchange_rate", "How many units of quote one unit of base buys.", exchange_rate, strings=["base", "quote"]
        ),
    ]


def _t6_score(t: Transcript) -> Verdict:
    need = {"order_subtotal", "shipping_quote", "exchange_rate"}
    if not any(need <= {c.name for c in batch} for batch in call_rounds(t)):
        missing = need - {c.name for batch in call_rounds(t) for c in batch}
        why = f"never called {', '.join(sorted(missing))}" if missing else "the three were not called in one turn"
        return failed(f"three lookups in one turn expected: {why}")
    if not has(answer(t), r"\b247[.,]50?\b"):
        return failed(f"the answer does not give the combined total €{TOTAL_EUR}")
    return passed(f"three lookups in one turn, combined into €{TOTAL_EUR}")


T6 = SuiteTest(
    id="T6",
    category=Category.PARALLEL,
    title="three tools whose results must be combined",
    system=system("When lookups do not depend on each other, make them in the same turn."),
    user=(
        f"What will order {ORDER_ID} cost me in euros, shipping included? Fetch the subtotal, the shipping quote "
        "and the USD to EUR rate in one go."
    ),
    tools=_t6_tools,
    score=_t6_score,
)

# -- T7: two sources that disagree --------------------------------------------------------------------------------

SKU = "K-220"
ERP_UNITS, SCAN_UNITS = 14, 9


def _t7_tools() -> list[Tool]:
    def inventory_db(args: Mapping[str, Any]) -> str:
        return as_json({"sku": arg(args, "sku"), "on_hand": ERP_UNITS, "source": "ERP database, synced 06:00"})

    def warehouse_scan(args: Mapping[str, Any]) -> str:
        return as_json({"sku": arg(args, "sku"), "counted": SCAN_UNITS, "source": "shelf scan at 09:40"})

    return [
        tool("inventory_db", "Units on hand according to the ERP database.", inventory_db, strings=["sku"]),
        tool("warehouse_scan", "Units counted by the latest warehouse shelf scan.", warehouse_scan, strings=["sku"]),
    ]


def _t7_score(t: Transcript) -> Verdict:
    for name in ("inventory_db", "warehouse_scan"):
        if not any(c.arg("sku").upper() == SKU for c in calls_to(t, name)):
            return failed(f"{name} was not called for {SKU}")
    text = answer(t)
    if not (has(text, _number(str(ERP_UNITS))) and has(text, _number(str(SCAN_UNITS)))):
        return failed(f"the answer does not give both counts ({ERP_UNITS} and {SCAN_UNITS})")
    conflict = (
        r"discrepan|conflict|disagree|mismatch|differ|inconsisten|(?:do not|don't|doesn't|does not) (?:match|agree)"
    )
    if not has(text, conflict):
        return failed("both counts given but the disagreement is not flagged")
    return passed("both sources consulted, the conflict flagged")


T7 = SuiteTest(
    id="T7",
    category=Category.PARALLEL,
    title="two sources disagree: the conflict is flagged",
    system=system(),
    user=f"How many units of {SKU} do we have? Check both the ERP database and the latest warehouse scan.",
    tools=_t7_tools,
    score=_t7_score,
)

TESTS = [T5, T6, T7]
