"""Category 6, multi-hop escalation: a relay of up to 50 tool calls where each result names the next key.

Keys are derived from a hash of the hop number, so a model cannot guess hop n+1 without reading hop n's result,
and the scorer can recompute the whole chain from the transcript alone. The score is pass/fail (every hop, then
the final code) plus the hop where the chain broke: the first hop whose call was missing or wrong. A chain that
made all 50 calls but then answered without the code breaks at hop 51, "the answer after the last hop".
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.tools import Tool
from agentload.suite.cases.common import arg, as_json, system, tool
from agentload.suite.model import Category, SuiteTest, Verdict
from agentload.suite.scoring import answer, calls

HOPS = 50  # the seed suite caps the chain at 50 hops (docs/background.md §2)


def hop_key(n: int) -> str:
    return f"k{n:02d}-{hashlib.sha256(f'agentload-hop-{n}'.encode()).hexdigest()[:6]}"


FINAL_CODE = "RELAY-" + hashlib.sha256(b"agentload-hop-final").hexdigest()[:4].upper()
_HOP_OF = {hop_key(n): n for n in range(1, HOPS + 1)}


def _tools() -> list[Tool]:
    def next_hop(args: Mapping[str, Any]) -> str:
        n = _HOP_OF.get(arg(args, "key"))
        if n is None:
            return as_json({"error": f"unknown key {arg(args, 'key')!r}"})
        if n == HOPS:
            return as_json({"hop": n, "final_code": FINAL_CODE})
        return as_json({"hop": n, "next_key": hop_key(n + 1)})

    return [
        tool(
            "next_hop",
            "Hand a relay key to the next station; returns the next key or the final code.",
            next_hop,
            strings=["key"],
        )
    ]


_STOPPED = {
    "answer": "answered before the chain ended",
    "round_cap": "ran out of rounds",
    "failed": "a request failed",
}


def _score(t: Transcript) -> Verdict:
    hop = 1  # the hop the model should make next
    for c in calls(t):
        if hop > HOPS:
            return Verdict(False, f"called {c.name} again after hop {HOPS}", break_hop=HOPS + 1, hops_completed=HOPS)
        if c.name != "next_hop" or c.arg("key") != hop_key(hop):
            why = f"called {c.name} with {c.arguments} instead of next_hop with key {hop_key(hop)}"
            return Verdict(False, f"broke at hop {hop}: {why}", break_hop=hop, hops_completed=hop - 1)
        hop += 1
    if hop <= HOPS:
        reason = f"broke at hop {hop}: {_STOPPED[t.stop_reason]}"
        return Verdict(False, reason, break_hop=hop, hops_completed=hop - 1)
    if t.stop_reason != "answer" or FINAL_CODE not in answer(t):
        reason = f"all {HOPS} hops made, but the answer does not give the final code {FINAL_CODE}"
        return Verdict(False, reason, break_hop=HOPS + 1, hops_completed=HOPS)
    return Verdict(True, f"all {HOPS} hops, final code given", hops_completed=HOPS)


H1 = SuiteTest(
    id="H1",
    category=Category.MULTIHOP,
    title=f"multi-hop relay, capped at {HOPS} hops: where does the chain break?",
    system=system(
        "You are running a relay. Call next_hop with the key you have; each result gives the next key. Keep "
        "going, one call per turn, until a result carries a final_code, then reply with that code only."
    ),
    user=f"Start the relay with key {hop_key(1)}.",
    tools=_tools,
    score=_score,
    max_rounds=HOPS + 2,  # 50 calls and the answer, plus one round of slack that cannot rescue a broken chain
    answer_required=False,
)

TESTS = [H1]
