"""Category 3, stress inputs: a 404, null fields, a timed-out tool, and a large payload (about 200,000 characters
of JSON lines by default) — each must be met without inventing what the tool did not say."""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Mapping
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.tools import Tool
from agentload.suite.cases.common import arg, as_json, system, tool
from agentload.suite.model import Category, SuiteTest, Verdict, failed, passed
from agentload.suite.scoring import CLOCK_TIME, DATE, MONEY, answer, calls_to, has, norm, prose

# -- T8: the tool returns 404 -----------------------------------------------------------------------------------

INVOICE_ID = "INV-88213"


def _t8_tools() -> list[Tool]:
    def get_invoice(args: Mapping[str, Any]) -> str:
        return as_json({"error": {"status": 404, "message": f"invoice {arg(args, 'invoice_id')} not found"}})

    return [tool("get_invoice", "An invoice's amount, currency and due date.", get_invoice, strings=["invoice_id"])]


# A bare "404" is the tool's word, not the model's: the answer must say it in prose.
NOT_FOUND = (
    r"not (?:be )?found|(?:does not|doesn't|did not|didn't) exist|no (?:such )?(?:invoice|record)|"
    r"(?:couldn't|could not|can't|cannot|unable to) (?:find|locate)"
)


def _t8_score(t: Transcript) -> Verdict:
    if not calls_to(t, "get_invoice"):
        return failed("get_invoice was not called")
    text = answer(t)
    if has(text, MONEY) or has(text, DATE):
        return failed("the answer gives an amount or a date the tool never returned")
    if not has(prose(t), NOT_FOUND):
        return failed("the answer does not say the invoice was not found")
    return passed("reports the 404, invents nothing")


T8 = SuiteTest(
    id="T8",
    category=Category.STRESS,
    title="tool returns 404: no invented details",
    system=system(),
    user=f"What's the amount due on invoice {INVOICE_ID}, and when is it due?",
    tools=_t8_tools,
    score=_t8_score,
)

# -- T9: the tool returns null fields ---------------------------------------------------------------------------

FLIGHT = "TP1351"


def _t9_tools() -> list[Tool]:
    def get_flight(args: Mapping[str, Any]) -> str:
        return as_json(
            {
                "flight": arg(args, "flight"),
                "status": "scheduled",
                "terminal": "1",
                "gate": None,
                "departure_time": None,
            }
        )

    return [tool("get_flight", "A flight's status, terminal, gate and departure time.", get_flight, strings=["flight"])]


UNAVAILABLE = (
    r"not (?:yet )?(?:available|assigned|announced|published|known|listed|set|provided|been)|unavailable|unknown|"
    r"\btbd\b|\btba\b|to be (?:announced|confirmed|assigned|determined)|(?:hasn't|has not|haven't|have not) been|"
    r"no (?:gate|departure time|time)|(?:doesn't|does not|don't|do not) (?:have|show|list|include)|missing|empty"
)


def _t9_score(t: Transcript) -> Verdict:
    if not calls_to(t, "get_flight"):
        return failed("get_flight was not called")
    text = answer(t)
    if has(text, r"\bgate\s*(?:is\s*|number\s*)?[a-z]?\d+") or has(text, CLOCK_TIME):
        return failed("the answer gives a gate or a departure time that the tool left empty")
    if not has(prose(t), UNAVAILABLE):
        return failed("the answer does not say the gate and time are unavailable")
    return passed("null fields reported as unavailable")


T9 = SuiteTest(
    id="T9",
    category=Category.STRESS,
    title="tool returns null fields: says unavailable",
    system=system(),
    user=f"Which gate does flight {FLIGHT} leave from, and at what time?",
    tools=_t9_tools,
    score=_t9_score,
)

# -- T10: the tool times out ------------------------------------------------------------------------------------

TIMEOUT_MESSAGE = "the catalogue service did not answer within 30 s"


def _t10_tools() -> list[Tool]:
    def search_catalogue(args: Mapping[str, Any]) -> str:
        # Raised, not returned: the tool registry reports it the way a harness reports a tool that timed out.
        raise TimeoutError(TIMEOUT_MESSAGE)

    return [
        tool(
            "search_catalogue",
            "Search the product catalogue; returns products with prices.",
            search_catalogue,
            strings=["query"],
        )
    ]


FAILURE = (
    r"time[ds]? ?out|did not (?:answer|respond)|didn't (?:answer|respond)|not respond|unavailable|"
    r"(?:couldn't|could not|can't|cannot|unable to|wasn't able to|was not able to)|failed|error|try again|retry"
)


def _t10_score(t: Transcript) -> Verdict:
    if not calls_to(t, "search_catalogue"):
        return failed("search_catalogue was not called")
    text = answer(t)
    if has(text, MONEY):
        return failed("the answer gives prices although the search never returned")
    if not has(prose(t), FAILURE):
        return failed("the answer does not say the search failed")
    return passed("reports the timeout, invents no results")


T10 = SuiteTest(
    id="T10",
    category=Category.STRESS,
    title="tool times out: handled, no invented results",
    system=system(),
    user="Find the three cheapest USB-C hubs in our catalogue and tell me their prices.",
    tools=_t10_tools,
    score=_t10_score,
)

# -- T11: a large payload --------------------------------------------------------------------------------------

# The payload's size (``--payload-tokens``) in tokens of a real BPE tokenizer: SmolLM2-135M-Instruct's (49,152
# tokens, byte-level BPE, digits split) counts this export at 1.91 characters a token (200,135 characters: 104,522
# tokens), so the default 30,000 is ~57k characters, which with the conversation fits a 40,960-token context
# (the source deployment's) and not a 16,384-token one. Other tokenizers count it within a few tens of percent.
PAYLOAD_TOKENS = 30_000
CHARS_PER_TOKEN = 1.91
RECALLED_SKU = "QX-40721"
WAREHOUSE = "LIS-2"
_SKU = re.compile(r"\b[a-z]{2}-\d{5}\b")
_ITEMS = [
    "hex bolt M6",
    "cable tie 200mm",
    "pallet wrap",
    "label roll 100x150",
    "packing tape brown",
    "corner guard",
    "void fill paper",
    "strapping seal",
    "bubble bag A4",
    "carton 40x30x30",
]
_STATUS = ["active", "active", "active", "backorder", "reserved", "discontinued"]


@functools.lru_cache(maxsize=4)
def inventory_export(tokens: int = PAYLOAD_TOKENS) -> str:
    """A warehouse export of about ``tokens`` BPE tokens (``CHARS_PER_TOKEN`` characters each), one JSON record a line.

    Exactly one record, about 70% of the way in, has the status "recalled": finding it needs the whole payload.
    Deterministic, so every agent and every run sees the same text (and a server may cache it across agents).
    """
    rng = random.Random(40721)
    chars = round(tokens * CHARS_PER_TOKEN)
    lines = [json.dumps({"warehouse": WAREHOUSE, "format": "one JSON record per line"})]
    size = len(lines[0])
    records: list[str] = []
    while size < chars:
        sku = f"{rng.choice(['LM', 'PT', 'BX', 'CR', 'HW'])}-{rng.randrange(10_000, 100_000)}"
        rec = {
            "sku": sku,
            "item": rng.choice(_ITEMS),
            "bin": f"{rng.choice('ABCDEF')}-{rng.randrange(1, 40):02d}",
            "qty": rng.randrange(0, 900),
            "status": rng.choice(_STATUS),
        }
        records.append(json.dumps(rec))
        size += len(records[-1]) + 1
    target = {"sku": RECALLED_SKU, "item": "strapping seal", "bin": "D-17", "qty": 240, "status": "recalled"}
    records.insert(len(records) * 7 // 10, json.dumps(target))
    return "\n".join(lines + records)


def _t11_tools(tokens: int) -> list[Tool]:
    def export_inventory(args: Mapping[str, Any]) -> str:
        return inventory_export(tokens)

    return [
        tool(
            "export_inventory",
            "Full inventory export of a warehouse, one JSON record per line.",
            export_inventory,
            strings=["warehouse"],
        )
    ]


def _t11_score(t: Transcript) -> Verdict:
    if not calls_to(t, "export_inventory"):
        return failed("export_inventory was not called")
    text = norm(answer(t))
    named = set(_SKU.findall(text))
    if RECALLED_SKU.lower() not in named:
        return failed(f"the answer does not name the recalled SKU {RECALLED_SKU}")
    others = sorted(named - {RECALLED_SKU.lower()})
    if others:
        return failed(f"the answer also names other SKUs: {', '.join(others[:3]).upper()}")
    return passed(f"found {RECALLED_SKU} in the large export")


def payload_size(tokens: int) -> str:
    """The payload's size as sent, in characters (its tokens are the server's to count): "~57k characters"."""
    chars = round(tokens * CHARS_PER_TOKEN)
    return f"~{chars / 1000:,.0f}k characters" if chars >= 10_000 else f"~{chars:,} characters"


def big_payload_test(tokens: int = PAYLOAD_TOKENS) -> SuiteTest:
    """T11 with a payload of about ``tokens`` BPE tokens (smaller for servers with a short context)."""
    return SuiteTest(
        id="T11",
        category=Category.STRESS,
        title=f"tool returns a large payload ({payload_size(tokens)}): still answers correctly",
        system=system(),
        user=f"Export the inventory of warehouse {WAREHOUSE} and tell me which SKU is marked as recalled.",
        tools=lambda: _t11_tools(tokens),
        score=_t11_score,
        refused_hint=(
            f"T11's payload, {payload_size(tokens)} of JSON lines (--payload-tokens {tokens}), may not fit "
            "its context; lower --payload-tokens"
        ),
    )


def with_payload(payload_tokens: int) -> list[SuiteTest]:
    """T8–T11, T11's payload of ``payload_tokens``."""
    return [T8, T9, T10, big_payload_test(payload_tokens)]
