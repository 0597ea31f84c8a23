"""What the test definitions share: the operator persona and a compact way to declare a mock tool."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentload.agent.tools import Tool

# One fictional company for every scenario, so the prompts read like one deployment's agents.
PERSONA = (
    "You are the operations assistant of Tidewater Logistics, a parcel and warehousing company in Portugal. "
    "Use the tools you are given when they help. Never state a fact that neither the user nor a tool gave you."
)


def system(*extra: str) -> str:
    return " ".join((PERSONA, *extra))


def tool(
    name: str,
    description: str,
    fn: Callable[[Mapping[str, Any]], str],
    *,
    strings: Sequence[str] = (),
    optional: Mapping[str, str] | None = None,
    required: Sequence[str] | None = None,
) -> Tool:
    """A tool whose parameters are string properties ``strings`` (required) plus ``optional`` (name → JSON type)."""
    props: dict[str, Any] = {s: {"type": "string"} for s in strings}
    for key, kind in (optional or {}).items():
        props[key] = {"type": kind}
    params = {"type": "object", "properties": props, "required": list(strings if required is None else required)}
    return Tool(name, description, params, fn)


def as_json(value: object) -> str:
    """A tool's JSON result, the way a typical API prints it."""
    return json.dumps(value, ensure_ascii=False)


def arg(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    return "" if value is None else str(value).strip()
