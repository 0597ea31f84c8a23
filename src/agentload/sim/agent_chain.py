"""Where the agent model goes after a result: one retry of a call whose error lists the valid values, the record of
a relative the request asks about ("their manager" → ``manager_id``), and whatever a result points to next (a
``next_key``, a file it says to see, a URL).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from agentload.sim import agent_extract as ex
from agentload.sim.agent_conv import Conversation, Result, canonical
from agentload.sim.agent_fill import ID_NOUNS, Filler, Unfilled, schema_props
from agentload.sim.agent_tools import AgentTool, fits
from agentload.sim.behaviour import PlannedCall

_POINTER = re.compile(r"\b(?:see|next|continue[sd]?|refer to|go to|moved to|points? to|redirect|follow|open)\b", re.I)
_VALID = re.compile(
    r"\b(?:valid|allowed|supported|available|accepted|expected)(?: \w+){0,3}(?: are| is)?\s*[:=]?\s*(.+)|"
    r"(?:one of|must be|choose from|options are|try)\s*[:=]?\s*(.+)",
    re.I,
)


def follow(conv: Conversation, tools: list[AgentTool]) -> PlannedCall | None:
    """The next call a result points at: a value one tool's required parameter needs, named by the newest result."""
    latest = conv.latest_round()
    if not latest or all(r.failed for r in latest):
        return None
    used = {t.name for t in tools if any(n == t.name for n, _ in conv.calls)}
    for tool in sorted(tools, key=lambda t: (t.name not in used, -t.score(conv.request)[0])):
        if tool.final or tool.acting:
            continue
        relevant = tool.name in used or tool.score(conv.request)[0] > 0
        _, required = schema_props(tool.tool)
        if not relevant or not required:
            continue
        try:
            args = Filler(tool.tool, _newest_only(conv), conv.request, results_first=True).arguments()
        except Unfilled:
            continue
        new = [k for k in required if _from_latest(latest, args.get(k)) and not _in_request(conv, args.get(k))]
        new = [k for k in new if not _filed_elsewhere(latest, k, args[k])]
        keyed = [k for k in new if any(_keyed(r.value, k) for r in latest)]
        pointed = any(_POINTER.search(r.text) for r in latest)
        if not (keyed or (new and (pointed or fits(*tool.score(conv.request))))):
            continue
        if (tool.name, canonical(args)) not in conv.made:
            return PlannedCall(tool.name, json.dumps(args, ensure_ascii=False))
    return None


def relation(conv: Conversation, tools: list[AgentTool]) -> PlannedCall | None:
    """A record that names a relative the request asks about ("manager_id": "E-0088" for "their manager") is
    looked up with the same tool before anything that depends on it (the manager's office, not the employee's)."""
    asked = ex.stems(conv.request)
    by_name = {t.name: t for t in tools}
    for r in conv.latest_round():
        tool = by_name.get(r.name)
        if tool is None or tool.acting or r.failed or not isinstance(r.value, dict):
            continue
        sent = [k for k, v in r.args.items() if k.lower().endswith("id") and isinstance(v, str)]
        for key, value in r.value.items():
            relative = str(key).lower().removesuffix("_id")
            if not sent or relative == str(key).lower() or ex.stem(relative) not in asked:
                continue
            if not isinstance(value, str) or not value or value in conv.request:
                continue
            args = {**r.args, sent[0]: value}
            if (r.name, canonical(args)) not in conv.made:
                return PlannedCall(r.name, json.dumps(args, ensure_ascii=False))
    return None


def retry(conv: Conversation) -> PlannedCall | None:
    """One retry of a call whose error lists the valid values, with the value closest to what was sent."""
    for r in conv.latest_round():
        if not r.failed:
            continue
        m = _VALID.search(r.text)
        if not m:
            continue
        raw = re.split(r"[\"}\n]", m.group(1) or m.group(2) or "")[0]
        listed = [v.strip(" .'\"[]{}") for v in re.split(r",|\bor\b|\|", raw)]
        listed = [v for v in listed if v and len(v) < 60 and len(v.split()) <= 4]
        if not listed or sum(1 for n, _ in conv.calls if n == r.name) >= 2:
            continue
        args = dict(r.args)
        for key, sent in r.args.items():
            if isinstance(sent, str) and sent not in listed:
                mentioned = [v for v in listed if v.lower() in conv.request.lower()]
                close = difflib.get_close_matches(sent, listed, n=1, cutoff=0.0)
                args[key] = (mentioned or close or listed)[0]
                break
        else:
            continue
        if (r.name, canonical(args)) not in conv.made:
            return PlannedCall(r.name, json.dumps(args, ensure_ascii=False))
    return None


def _keyed(value: Any, key: str) -> bool:
    """Whether a result names ``key`` itself (or ``next_key``, ``customer_id`` for ``id``…) as a field."""
    if isinstance(value, dict):
        return any(isinstance(k, str) and (k.lower() == key.lower() or k.lower().endswith("_" + key.lower()))
                   for k in value)  # fmt: skip
    return False


def _filed_elsewhere(latest: list[Result], key: str, value: Any) -> bool:
    """Whether a result files ``value`` under another kind of thing than ``key`` wants ("orders": ["O-551"] holds
    no customer_id)."""
    wanted = {ex.stem(p) for p in ex.name_parts(key)}
    for r in latest:
        for field in _fields_holding(r.value, value):
            kinds = {ex.stem(p) for p in ex.name_parts(field)} & {ex.stem(n) for n in ID_NOUNS}
            if kinds and not kinds & wanted:
                return True
    return False


def _fields_holding(value: Any, wanted: Any, field: str = "") -> list[str]:
    """The names of the fields (a list's items go by the list's name) that hold ``wanted``, two levels deep."""
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _fields_holding(v, wanted, str(k))]
    if isinstance(value, list):
        return [f for v in value[:50] for f in _fields_holding(v, wanted, field)]
    return [field] if field and value == wanted else []


def _newest_only(conv: Conversation) -> Conversation:
    return Conversation(conv.request, conv.system, conv.latest_round(), conv.made, conv.calls, conv.rounds)


def _from_latest(latest: list[Result], value: Any) -> bool:
    if value is None or value == "":
        return False
    return any(str(value) in r.text for r in latest)


def _in_request(conv: Conversation, value: Any) -> bool:
    return isinstance(value, str) and value in conv.request
