"""Rule-based scoring helpers: what the model called, what it finally said, and patterns that catch invention.

No LLM judge, as in the seed suite (docs/background.md §2): every rule is a regular expression or an exact comparison,
so a transcript scores the same every time. ``<think>…</think>`` blocks are stripped before any rule looks at the
answer. The patterns are deliberately tolerant of phrasing (a real model words things its own way) and strict about
facts (a figure that the tools never gave is an invention, however it is phrased).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentload.agent.loop import Transcript
from agentload.agent.text import strip_think
from agentload.suite.model import SuiteTest, Verdict, failed


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNSCORED = "unscored"  # a request failed: the model never got to answer, so there is nothing to judge


@dataclass(frozen=True)
class Call:
    """One tool call the model made; ``args`` is None when its arguments were not a JSON object."""

    round: int
    name: str
    arguments: str
    args: Mapping[str, Any] | None

    def arg(self, key: str) -> str:
        """An argument as stripped text ('' when missing), for comparing string arguments."""
        if self.args is None or self.args.get(key) is None:
            return ""
        return str(self.args[key]).strip()


def _parse_args(arguments: str) -> Mapping[str, Any] | None:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def call_rounds(t: Transcript) -> list[list[Call]]:
    """The calls of every assistant turn that made any, in order (one inner list per turn)."""
    out: list[list[Call]] = []
    for turn in t.turns:
        if turn.assistant is None:
            continue
        batch = [
            Call(
                turn.round,
                str(c["function"]["name"]),
                str(c["function"]["arguments"]),
                _parse_args(str(c["function"]["arguments"])),
            )
            for c in turn.assistant.get("tool_calls") or ()
        ]
        if batch:
            out.append(batch)
    return out


def calls(t: Transcript) -> list[Call]:
    return [c for batch in call_rounds(t) for c in batch]


def calls_to(t: Transcript, name: str) -> list[Call]:
    return [c for c in calls(t) if c.name == name]


def answer(t: Transcript) -> str:
    """The final answer with reasoning blocks removed."""
    return strip_think(t.final_content)


_DASHES = str.maketrans({"–": "-", "—": "-", "‑": "-", "−": "-", "\u00a0": " ", "’": "'", "‘": "'"})


def norm(text: str) -> str:
    """Lower case, one kind of dash and apostrophe, markdown emphasis dropped, white space collapsed."""
    text = text.translate(_DASHES).replace("**", "").replace("`", "")
    return re.sub(r"\s+", " ", text).strip().lower()


def has(text: str, pattern: str) -> bool:
    """``pattern`` (a regular expression) occurs in the normalised ``text``."""
    return re.search(pattern, norm(text)) is not None


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The answer as a JSON object, only if the whole answer is one (no fences, no prose around it)."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?;])\s+|\n+", norm(text)) if s]


# Money: a currency sign or code next to a number, or a number with two decimals ("1,240.00", "19,99").
MONEY = r"[€$£]\s?\d|\d\s?(?:€|\$|£|eur\b|usd\b|gbp\b|euros?\b|dollars?\b)|\b\d+[.,]\d{2}\b"
_MONTHS = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
DATE = (
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}(?:/\d{{2,4}})?\b"
    rf"|\b{_MONTHS}\s+\d{{1,2}}\b|\b\d{{1,2}}\s+{_MONTHS}"
)
CLOCK_TIME = r"\b\d{1,2}[:h]\d{2}\b|\b\d{1,2}\s?(?:am|pm)\b"
NEGATION = r"\b(?:not|no|never|cannot|can't|couldn't|unable|without|don't|didn't|won't|isn't|wasn't|haven't|hasn't)\b"


def nearest(text: str, value_pattern: str, names: Iterable[str]) -> str | None:
    """Which of ``names`` is mentioned closest to the first match of ``value_pattern`` (attribution check)."""
    t = norm(text)
    found = re.search(value_pattern, t)
    if found is None:
        return None
    centre = (found.start() + found.end()) / 2
    best: tuple[float, str] | None = None
    for name in names:
        for m in re.finditer(re.escape(name.lower()), t):
            d = abs((m.start() + m.end()) / 2 - centre)
            if best is None or d < best[0]:
                best = (d, name)
    return None if best is None else best[1]


def tool_results(t: Transcript) -> list[str]:
    """The text of every tool result the model was sent, in order."""
    return [str(r.get("content") or "") for turn in t.turns for r in turn.tool_results]


def request_text(t: Transcript) -> str:
    return next((str(m.get("content") or "") for m in reversed(t.spec.messages) if m.get("role") == "user"), "")


_JSON_BLOB = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}|\[[^\[\]]*\]")


def prose(t: Transcript) -> str:
    """The answer with every verbatim tool result and every bare JSON value taken out: what the model itself
    said. A raw ``{"status": 404, ...}`` or ``null`` in the answer is the tool talking, not the model."""
    text = norm(answer(t))
    for result in sorted((norm(r) for r in tool_results(t)), key=len, reverse=True):
        if result:
            text = text.replace(result, " ")
    return norm(_JSON_BLOB.sub(" ", text))


def echo(t: Transcript) -> str | None:
    """Why the answer is only an echo — the raw tool results or the request itself — or None when it is not."""
    text = norm(answer(t))
    if not text:
        return None
    results = [norm(r) for r in tool_results(t)]
    last_round = next((r for r in reversed([[str(x.get("content") or "") for x in tt.tool_results] for tt in t.turns])
                       if r), [])  # fmt: skip
    if text in results or (last_round and text == norm(" ".join(last_round))):
        return "the answer is the raw tool result, handed back verbatim"
    if text == norm(request_text(t)):
        return "the answer repeats the request"
    return None


# What a model sends when it has no real value for an argument (the placeholder cheat).
PLACEHOLDERS = frozenset({"", "example", "string", "placeholder", "test", "foo", "bar", "xxx", "value", "todo", "..."})


def placeholder_calls(t: Transcript) -> list[str]:
    """``name(key=value)`` for every call argument that is a placeholder rather than a value from the task."""
    out = []
    for c in calls(t):
        for key, value in (c.args or {}).items():
            if isinstance(value, str) and (value.strip().lower() in PLACEHOLDERS or re.fullmatch(r"<[^<>]*>", value)):
                out.append(f"{c.name}({key}={value!r})")
    return out


def score(test: SuiteTest, t: Transcript) -> tuple[Status, Verdict]:
    """Judge one transcript: unscored when a request failed, else the cheats every test fails, else the test's
    own rules."""
    if t.stop_reason == "failed":
        last = t.turns[-1].final if t.turns else None
        what = f"{last.outcome.value}: {last.error_message}" if last is not None else "no request was made"
        return Status.UNSCORED, Verdict(False, f"request failed ({what})")
    if test.answer_required and t.stop_reason == "round_cap":
        return Status.FAIL, failed(f"no final answer within {t.spec.max_rounds} rounds")
    echoed = echo(t)
    if echoed is not None:
        return Status.FAIL, failed(echoed)
    placeholders = placeholder_calls(t)
    if placeholders:
        return Status.FAIL, failed(f"called tools with placeholder arguments: {', '.join(placeholders[:3])}")
    verdict = test.score(t)
    return (Status.PASS if verdict.passed else Status.FAIL), verdict
