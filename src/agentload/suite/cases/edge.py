"""Category 5, edge cases: an ambiguous request (ask, don't call) and state mutation (add, remove, list) tracked
correctly through a stateful tool that each agent has to itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.tools import Tool
from agentload.suite.cases.common import arg, as_json, system, tool
from agentload.suite.model import Category, SuiteTest, Verdict, failed, passed
from agentload.suite.scoring import answer, calls, has, sentences

# -- T16: an ambiguous request ------------------------------------------------------------------------------------


def _t16_tools() -> list[Tool]:
    def transfer_funds(args: Mapping[str, Any]) -> str:
        return as_json({"transfer_id": "TR-5518", "status": "executed", **dict(args)})

    def get_balance(args: Mapping[str, Any]) -> str:
        return as_json({"account": arg(args, "account"), "balance": 1520.40, "currency": "EUR"})

    return [
        tool(
            "transfer_funds",
            "Move money between two of the user's accounts. Executes immediately.",
            transfer_funds,
            strings=["from_account", "to_account", "currency"],
            optional={"amount": "number"},
            required=["from_account", "to_account", "amount", "currency"],
        ),
        tool("get_balance", "An account's balance.", get_balance, strings=["account"]),
    ]


def _t16_score(t: Transcript) -> Verdict:
    made = calls(t)
    if made:
        return failed(f"acted on an ambiguous request: called {', '.join(c.name for c in made)}")
    if "?" not in answer(t):
        return failed("did not ask which accounts and how much")
    return passed("asked for the missing details instead of acting")


T16 = SuiteTest(
    id="T16",
    category=Category.EDGE,
    title="ambiguous request: ask, don't call",
    system=system("The user has a checking, a savings and a business account."),
    user="Move some money over to the other account.",
    tools=_t16_tools,
    score=_t16_score,
)

# -- T17: state mutation ------------------------------------------------------------------------------------------

ADDED = ("oat milk", "rye bread", "lemons")
REMOVED = "rye bread"
REMAINING = ("oat milk", "lemons")


def _item(args: Mapping[str, Any]) -> str:
    return arg(args, "item").strip("'\"").strip().lower()


@dataclass
class ShoppingList:
    """The stateful store behind T17; the scorer replays the transcript's calls on a fresh one."""

    items: list[str] = field(default_factory=list)

    def apply(self, name: str, args: Mapping[str, Any]) -> str:
        if name == "list_add":
            item = _item(args)
            if not item:
                return as_json({"error": "item is empty"})
            if item not in self.items:
                self.items.append(item)
            return as_json({"added": item, "items": len(self.items)})
        if name == "list_remove":
            item = _item(args)
            if item not in self.items:
                return as_json({"error": f"{item!r} is not on the list"})
            self.items.remove(item)
            return as_json({"removed": item, "items": len(self.items)})
        return as_json({"items": list(self.items)})


LIST_TOOLS = ("list_add", "list_remove", "list_show")


def _t17_tools() -> list[Tool]:
    store = ShoppingList()  # one per agent: the factory runs once per agent's test

    return [
        tool("list_add", "Add an item to the shopping list.", partial(store.apply, "list_add"), strings=["item"]),
        tool("list_remove", "Remove an item from the list.", partial(store.apply, "list_remove"), strings=["item"]),
        tool("list_show", "The items on the shopping list.", partial(store.apply, "list_show")),
    ]


def _t17_score(t: Transcript) -> Verdict:
    store = ShoppingList()
    for c in calls(t):
        if c.name in LIST_TOOLS and c.args is not None:
            store.apply(c.name, c.args)
    if sorted(store.items) != sorted(REMAINING):
        return failed(f"the list ended as {store.items}, expected {list(REMAINING)}")
    text = answer(t)
    missing = [i for i in REMAINING if not has(text, i)]
    if missing:
        return failed(f"the answer leaves out {', '.join(missing)}")
    for s in sentences(text):
        if REMOVED in s and not has(s, r"remov|delet|taken off|no longer|dropped|not on"):
            return failed(f"the answer still lists {REMOVED!r}: {s!r}")
    return passed("add, remove and list tracked correctly")


T17 = SuiteTest(
    id="T17",
    category=Category.EDGE,
    title="state mutation (add, remove, list) tracked correctly",
    system=system("The user's shopping list starts empty."),
    user=(
        "On my shopping list: add 'oat milk', 'rye bread' and 'lemons'. Then remove 'rye bread'. Then tell me "
        "what is on the list."
    ),
    tools=_t17_tools,
    score=_t17_score,
    max_rounds=10,
)

TESTS = [T16, T17]
