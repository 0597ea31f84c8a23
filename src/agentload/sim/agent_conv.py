"""What the agent model reads from a conversation: the request, the calls made so far and their results.

Harnesses send tool results in two shapes: OpenAI ``tool`` messages paired to their call by id, and (some agent
frameworks) a ``user`` message that carries the observation as text ("Observation: …") after an assistant turn
that called a tool. Both become ``Result`` here, so the rest of the model never sees the difference.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentload.sim.chat import Message

# A user message that only relays what a tool said is not a new request.
_OBSERVATION = re.compile(r"^\s*(?:call id:[^\n]*\n)?\s*(?:observation|tool (?:result|response|output))\s*:", re.I)
# A line that only opens a block of material: "Context:", "Results of the tasks this one depends on:".
_HEADING = re.compile(r"\n[^\n:]{1,80}:[ \t]*\n")
# Framework wrappers around the user's task ("New task:\n…").
_TASK_WRAPPER = re.compile(r"^\s*(?:new task|task)\s*:\s*\n?", re.I)


def parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def canonical(arguments: str | dict[str, Any]) -> str:
    parsed = parse(arguments) if isinstance(arguments, str) else arguments
    return json.dumps(parsed, sort_keys=True, ensure_ascii=False) if isinstance(parsed, dict) else str(arguments)


@dataclass(frozen=True)
class Result:
    name: str
    args: dict[str, Any]
    text: str
    round: int

    @property
    def value(self) -> Any:
        return parse(self.text)

    @property
    def failed(self) -> bool:
        v = self.value
        if isinstance(v, dict):
            return v.get("error") not in (None, "", False) or v.get("status") in ("error", "failed")
        return isinstance(v, str) and bool(
            re.match(r"\s*(?:error|exception|traceback|failed|timeout|timed out)\b", v, re.I)
        )


@dataclass
class Conversation:
    request: str = ""
    system: str = ""
    results: list[Result] = field(default_factory=list)
    made: set[tuple[str, str]] = field(default_factory=set)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    rounds: int = 0

    @classmethod
    def read(cls, messages: list[Message]) -> Conversation:
        conv = cls(system="\n".join(m.text() for m in messages if m.role in ("system", "developer")))
        start = 0
        for i, m in enumerate(messages):
            if m.role == "user" and not _is_observation(messages, i):
                start = i
        conv.request = _TASK_WRAPPER.sub("", messages[start].text()).strip() if messages else ""
        pending: dict[str, tuple[str, dict[str, Any]]] = {}
        order: list[tuple[str, dict[str, Any]]] = []
        answered = 0
        for i, m in enumerate(messages[start + 1 :], start + 1):
            written = _written_calls(m) if m.role == "assistant" and not m.tool_calls else []
            if written:
                conv.rounds += 1
                for name, args in written:
                    order.append((name, args))
                    conv.calls.append((name, args))
                    conv.made.add((name, canonical(args)))
            elif m.role == "assistant" and m.tool_calls:
                conv.rounds += 1
                for c in m.tool_calls:
                    args = parse(c.function.arguments or "{}")
                    args = args if isinstance(args, dict) else {}
                    pending[c.id] = (c.function.name, args)
                    order.append((c.function.name, args))
                    conv.calls.append((c.function.name, args))
                    conv.made.add((c.function.name, canonical(args)))
            elif m.role in ("tool", "function"):
                name, args = pending.get(m.tool_call_id or "", ("", {}))
                if not name:
                    name, args = order[answered] if answered < len(order) else (m.name or "tool", {})
                answered += 1
                conv.results.append(Result(name, args, m.text(), conv.rounds))
            elif m.role == "user" and _is_observation(messages, i):
                text = _OBSERVATION.sub("", m.text(), count=1).strip()
                for part in split_observation(text, len(order) - answered):
                    name, args = order[answered] if answered < len(order) else (m.name or "tool", {})
                    answered += 1
                    conv.results.append(Result(name, args, part, conv.rounds))
        return conv

    @property
    def instruction(self) -> str:
        """The request without the material it carries under a heading of its own ("Context:", "Results of the
        tasks this one depends on:"): that is data to use, not steps to plan, even where it names a tool."""
        m = _HEADING.search(self.request)
        return self.request[: m.start()].strip() if m else self.request

    def latest_round(self) -> list[Result]:
        return [r for r in self.results if r.round == self.rounds] if self.results else []


def split_observation(text: str, calls: int) -> list[str]:
    """One observation message that answers several calls at once, one result after another (one JSON value or
    one line each), cut into one text per call; kept whole when it does not divide that way."""
    if calls < 2:
        return [text]
    decoder = json.JSONDecoder()
    parts: list[str] = []
    at = 0
    while at < len(text):
        try:
            _, end = decoder.raw_decode(text, at)
        except ValueError:
            parts = []
            break
        parts.append(text[at:end])
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    if len(parts) == calls:
        return parts
    lines = [line for line in text.splitlines() if line.strip()]
    return lines if len(lines) == calls else [text]


def _is_observation(messages: list[Message], i: int) -> bool:
    m = messages[i]
    if m.role != "user" or not _OBSERVATION.match(m.text()):
        return False
    return any(p.role == "assistant" and (p.tool_calls or _written_calls(p)) for p in messages[:i])


def _written_calls(m: Message) -> list[tuple[str, dict[str, Any]]]:
    """Calls a framework replays as text ("Calling tools:\n[{'function': {'name': …, 'arguments': {…}}}]")."""
    text = m.text()
    if not text.lstrip().lower().startswith("calling tools:"):
        return []
    try:
        listed = ast.literal_eval(text.split(":", 1)[1].strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for item in listed if isinstance(listed, list) else []:
        fn = item.get("function") if isinstance(item, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            args = fn.get("arguments")
            args = parse(args) if isinstance(args, str) else args
            out.append((fn["name"], args if isinstance(args, dict) else {}))
    return out
