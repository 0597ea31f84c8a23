"""``AgentBehaviour``: a simulated model that acts like a plausible tool-calling model on any request.

Filler text is the right load but no use to someone rehearsing their own agent harness: under
``tool_choice="auto"`` it never calls a tool. This behaviour reads the conversation the way a small instruction-
tuned model would, with rules instead of weights:

* **which tools** — each offered tool is scored by the words its name, description and parameter names share with
  the request (light stemming and a few synonyms: "temperature" wants a weather tool, "3 * 7" a calculator). A tool
  is picked when the request names it whole, or two of its words; none picked means a plain answer.
* **which arguments** — every required parameter gets a value of its schema's type, taken from the prompt where
  one fits (a file name for ``path``, an e-mail for ``email``, an ID for ``*_id``, a place after "in"/"for",
  an arithmetic expression for ``expression``) or from an earlier tool result with the same key (a
  ``customer_id`` a lookup returned). Optional parameters are filled only when the prompt grounds them. A required
  value found nowhere defers the tool a round; if nothing can be called the model asks the user for it.
* **parallel and sequential** — several picked tools (or one tool and several values, "Paris and Tokyo") are
  called in one turn; tools that act (write, send, book…) wait until the reading tools' results are in, so a
  "search, then write it down" task takes three rounds.
* **the answer** — built from the tool results: fields and values of JSON results, errors and missing fields said
  as such, text excerpts otherwise; a plain answer's length is drawn from a lognormal distribution.
* **bounded** — after ``max_rounds`` rounds of calls, or when every picked tool has answered, it answers.
* **rehearsing failures** — with probability ``error_rate`` a turn goes wrong in one of three named ways: a wrong
  tool, a bad argument, an invented fact.

Everything is drawn from the turn's seeded random source, so a seed replays the same conversation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentload.errors import ConfigError
from agentload.sim.behaviour import PlannedCall, Reply, Turn
from agentload.sim.chat import Message, Tool

MISTAKES = ("wrong-tool", "bad-argument", "invented-fact")

_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "from",
        "by",
        "with",
        "about",
        "into",
        "is",
        "are",
        "was",
        "be",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "my",
        "me",
        "i",
        "you",
        "your",
        "we",
        "our",
        "us",
        "they",
        "them",
        "what",
        "which",
        "who",
        "when",
        "where",
        "how",
        "do",
        "does",
        "did",
        "can",
        "could",
        "would",
        "should",
        "will",
        "please",
        "tell",
        "give",
        "get",
        "set",
        "current",
        "some",
        "any",
        "all",
        "one",
        "two",
        "each",
        "then",
        "than",
        "also",
        "just",
        "use",
        "using",
        "given",
        "value",
        "values",
        "return",
        "returns",
        "tool",
        "function",
        "call",
        "data",
        "info",
        "information",
        "say",
        "so",
        "as",
        "if",
        "not",
        "no",
        "yes",
        "up",
        "out",
        "there",
        "here",
        "now",
    ]
)
# Request word -> the words a tool for it is named or described with.
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "temperature": ("weather",),
    "forecast": ("weather",),
    "rain": ("weather",),
    "raining": ("weather",),
    "sunny": ("weather",),
    "umbrella": ("weather",),
    "warm": ("weather",),
    "cold": ("weather",),
    "hot": ("weather",),
    "compute": ("calculate", "calculator", "evaluate"),
    "calculate": ("calculator", "evaluate", "arithmetic"),
    "sum": ("calculate", "calculator"),
    "multiply": ("calculate", "calculator"),
    "divide": ("calculate", "calculator"),
    "find": ("search", "lookup", "look"),
    "look": ("search", "lookup", "find"),
    "lookup": ("search", "find"),
    "e-mail": ("email", "mail", "send"),
    "email": ("mail", "send", "message"),
    "mail": ("email", "send"),
    "text": ("sms", "message", "send"),
    "sms": ("text", "message", "send"),
    "convert": ("conversion", "exchange", "rate"),
    "exchange": ("convert", "currency", "rate"),
    "meeting": ("calendar", "event", "schedule"),
    "schedule": ("calendar", "event", "meeting"),
    "remind": ("reminder",),
    "price": ("quote", "stock"),
    "shares": ("stock",),
    "folder": ("directory", "files"),
    "directory": ("folder", "files"),
    "save": ("write",),
    "store": ("write", "save"),
    "open": ("read",),
    "show": ("read", "list"),
    "translate": ("translation", "language"),
    "mention": ("search", "find"),
    "contain": ("search", "find"),
}
# Tools whose first name part is one of these change the world; they run once the reading tools have answered.
_ACTIONS = frozenset(
    [
        "write",
        "save",
        "send",
        "post",
        "create",
        "update",
        "delete",
        "remove",
        "add",
        "book",
        "schedule",
        "notify",
        "submit",
        "close",
        "cancel",
        "transfer",
        "email",
        "sms",
        "text",
        "publish",
        "upload",
        "set",
        "move",
        "rename",
    ]
)

_WORD = re.compile(r"[a-z][a-z0-9'-]*")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_URL = re.compile(r"https?://[^\s\"'<>]+")
_FILE = re.compile(r"(?<![\w@/.-])((?:[\w.-]+/)*[\w-]+\.(?:md|txt|py|json|csv|toml|yaml|yml|log|js|ts|html|rs|go))\b")
# "write it to report.md", "save into out/notes.md": a file the instruction asks to produce, not one to read.
_WRITE_TARGET = re.compile(r"\b(?:to|into)\s+(?:the\s+)?(?:file\s+)?" + _FILE.pattern)
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}\b")
_ID = re.compile(r"(?<![\w@.])(#?[A-Za-z]*\d[\w-]*|[A-Z]{2,}(?:-[A-Z0-9]+)+)(?![\w@])")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_QUOTED = re.compile(r"\"([^\"\n]{1,200})\"|'([^'\n]{2,200})'|“([^”\n]{1,200})”")
# Operands stand free: "-20261201-122006" in a path or "2025-03-14" (dates are taken out first) is no sum.
_ARITH = re.compile(r"(?<![\w/.-])[-(]*\d+(?:\.\d+)?\)*(?:\s*(?:\*\*|[-+*/x×÷^%])\s*[-(]*\d+(?:\.\d+)?\)*)+(?![\w/.-])")
_PLACE = re.compile(r"\b(?:in|for|at|to|from|of|near)\s+((?:[A-Z][\w'.-]*)(?:[ -](?:[A-Z][\w'.-]*|de|do|da|del))*)")
_CURRENCY = re.compile(r"\b(USD|EUR|GBP|JPY|CHF|CAD|AUD|CNY|INR|BRL|SEK|NOK|DKK|PLN|MXN)\b")
_LANGUAGES = ("english", "french", "german", "spanish", "portuguese", "italian", "dutch", "japanese", "chinese")
_PLACE_NOT = frozenset({"I", "The", "A", "My", "Celsius", "Fahrenheit", "JSON", "Monday", "Friday"})


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "ed", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _stems(text: str) -> set[str]:
    return {_stem(w.removesuffix("'s")) for w in _WORD.findall(text.lower()) if w not in _STOP}


def _name_parts(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [p for p in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if p]


@dataclass
class _Context:
    """What the model can take argument values from: the request and the tool results so far."""

    request: str
    results: list[Any]  # parsed JSON of each result where it parses, else the text

    def places(self) -> list[str]:
        out: list[str] = []
        for m in _PLACE.finditer(self.request):
            for part in re.split(r"\s+and\s+|,\s*", m.group(1)):
                part = part.strip(" .,?!")
                if part and part.split()[0] not in _PLACE_NOT and part not in out:
                    out.append(part)
        # "Paris and Tokyo": the second city has no preposition of its own.
        for m in re.finditer(r"\b(?:and|or)\s+([A-Z][\w'-]+)", self.request):
            prev = self.request[: m.start()].rstrip(" ,")
            if out and prev.endswith(out[-1]) and m.group(1) not in out and m.group(1) not in _PLACE_NOT:
                out.append(m.group(1))
        return out

    def ids(self) -> list[str]:
        skip = set(_DATE.findall(self.request)) | set(_CLOCK.findall(self.request))
        out = []
        for m in _ID.finditer(self.request):
            token = m.group(1).rstrip(".-")
            if token in skip or (_NUMBER.fullmatch(token) and len(token) < 3):
                continue
            if any(c.isdigit() for c in token) and token not in out:
                out.append(token)
        return out

    def numbers(self) -> list[float]:
        """Numbers the request states on their own (not inside an ID, a date, a time or an expression)."""
        text = _ARITH.sub(" ", _CLOCK.sub(" ", _DATE.sub(" ", self.request)))
        text = " ".join(t for t in text.split() if not (re.search(r"[A-Za-z]", t) and re.search(r"\d", t)))
        return [float(n) for n in _NUMBER.findall(text.replace(",", ""))]

    def from_results(self, key: str) -> Any:
        """The newest value an earlier tool result gave under ``key`` (searched one level deep)."""
        for value in reversed(self.results):
            found = _lookup(value, key)
            if found is not None:
                return found
        return None


def _lookup(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        if value.get(key) is not None:
            return value[key]
        for inner in value.values():
            if isinstance(inner, dict) and inner.get(key) is not None:
                return inner[key]
    return None


def _expression(text: str) -> str | None:
    found = _ARITH.search(_CLOCK.sub(" ", _DATE.sub(" ", text)))
    if found is None:
        return None
    expr = found.group(0).replace("×", "*").replace("÷", "/").replace("^", "**")
    return re.sub(r"(?<=\d)\s*x\s*(?=[\d(])", " * ", expr).strip()


def _topic(request: str, limit: int = 12) -> str:
    """The request's subject as a search query: the first sentence without its leading verb, a dozen words."""
    first = re.split(r"(?<=[.?!])\s+|\n", request.strip(), maxsplit=1)[0]
    first = re.sub(
        r"^(?:please\s+)?(?:can you\s+|could you\s+)?(?:search(?: for)?|find|look up|look for|tell me|what is|"
        r"what's|show me|get)\s+",
        "",
        first,
        flags=re.I,
    )
    return " ".join(first.strip(" ?.!").split()[:limit]) or request[:80]


class _Unfilled(Exception):
    """A required value the conversation does not contain (the tool waits, or the model asks for it)."""


@dataclass
class _Filler:
    """Fills one tool's arguments from the context; ``alt`` picks the n-th candidate of the tool's main value."""

    ctx: _Context
    request_stems: set[str]
    answer_text: str = ""  # for content/body parameters of acting tools
    alt: int = 0
    acting: bool = False  # a tool that writes may name a new file; one that reads needs a name it was given
    listing: bool = False  # a tool that lists takes a directory, not a file
    _numbers: int = 0  # request numbers handed out so far, in order, to parameters that name none
    _codes: int = 0  # the same for currency codes

    def arguments(self, tool: Tool) -> dict[str, Any]:
        self._numbers = self._codes = 0
        params = tool.function.parameters if isinstance(tool.function.parameters, dict) else {}
        value = self.value("", params, required=True)
        return value if isinstance(value, dict) else {}

    def value(self, key: str, schema: Any, *, required: bool) -> Any:
        if not isinstance(schema, dict):
            schema = {}
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            return self._enum(schema["enum"], required)
        if "const" in schema:
            return schema["const"]
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema)
        if kind == "array":
            return self._array(key, schema, required)
        if kind in ("integer", "number"):
            return self._number(key, schema, integer=kind == "integer", required=required)
        if kind == "boolean":
            return self._boolean(key, schema, required)
        if kind in (None, "string") or kind == "null":
            return self._string(key, schema, required)
        raise _Unfilled(key)

    def _object(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        props = _as_dict(schema.get("properties"))
        required = [k for k in _as_list(schema.get("required")) if isinstance(k, str)]
        out: dict[str, Any] = {}
        for k in required:
            out[k] = self.value(k, props.get(k, {}), required=True)
        for k, sub in props.items():
            if k in out:
                continue
            try:
                out[k] = self.value(k, sub, required=False)
            except _Unfilled:
                continue  # optional and not grounded in the conversation: a careful model leaves it out
        return out

    def _enum(self, options: list[Any], required: bool) -> Any:
        low = self.ctx.request.lower()
        for option in options:
            if isinstance(option, str) and re.search(rf"\b{re.escape(option.lower())}\b", low):
                return option
        if not required:
            raise _Unfilled("enum")
        return options[0]

    def _array(self, key: str, schema: Mapping[str, Any], required: bool) -> list[Any]:
        items = schema.get("items", {})
        try:
            first = self.value(key.rstrip("s"), items, required=required)
        except _Unfilled:
            if not required:
                raise
            first = None
        out = [] if first is None else [first]
        min_items = schema.get("minItems")
        if isinstance(min_items, int) and len(out) < min_items:
            out = out + [out[0] if out else ""] * (min_items - len(out))
        return out

    def _number(self, key: str, schema: Mapping[str, Any], *, integer: bool, required: bool) -> int | float:
        grounded = self.ctx.from_results(key) if key else None
        found: float | None = float(grounded) if isinstance(grounded, int | float) else None
        if found is None and key:
            near = re.search(rf"(-?\d+(?:\.\d+)?)\s+{re.escape(key.replace('_', ' ').rstrip('s'))}", self.ctx.request,
                             re.I)  # fmt: skip
            if near is not None:
                found = float(near.group(1))
        if found is None and required:
            loose = self.ctx.numbers()
            if self._numbers < len(loose):
                found = loose[self._numbers]
                self._numbers += 1
        if found is None:
            if not required:
                raise _Unfilled(key)
            default = schema.get("default")
            found = float(default) if isinstance(default, int | float) else 1.0
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(low, int | float):
            found = max(found, float(low))
        if isinstance(high, int | float):
            found = min(found, float(high))
        return int(found) if integer else found

    def _boolean(self, key: str, schema: Mapping[str, Any], required: bool) -> bool:
        if not required:
            raise _Unfilled(key)  # an optional flag the user never mentioned stays unset
        if isinstance(schema.get("default"), bool):
            return bool(schema["default"])
        return bool(key) and _stem(key.lower()) in self.request_stems

    def _string(self, key: str, schema: Mapping[str, Any], required: bool) -> str:
        value = self._grounded_string(key.lower())
        if value is None:
            raise _Unfilled(key)
        max_len = schema.get("maxLength")
        if isinstance(max_len, int) and max_len >= 0:
            value = value[:max_len]
        min_len = schema.get("minLength")
        if isinstance(min_len, int) and len(value) < min_len:
            value = value.ljust(min_len, ".")
        return value

    def _pick(self, options: list[str]) -> str | None:
        """The ``alt``-th candidate the instruction itself names ("Paris and Tokyo" → two calls); values found only
        in pasted material (another agent's answer, context) are used once, never fanned out."""
        if not options:
            return None
        head = self.ctx.request.strip().split("\n\n", 1)[0]
        # Named on its own: "notes.md" is not named by "from/plan/notes.md".
        named = [o for o in options if re.search(r"(?<![\w/.-])" + re.escape(o) + r"(?![\w-])", head)]
        if not named:
            return options[0]
        return named[min(self.alt, len(named) - 1)]

    def _grounded_string(self, key: str) -> str | None:
        ctx, request = self.ctx, self.ctx.request
        earlier = ctx.from_results(key) if key else None
        if isinstance(earlier, str | int) and not isinstance(earlier, bool) and key not in ("content", "text"):
            return str(earlier)
        words = set(re.split(r"[_\W]+", key))
        if words & {"path", "file", "filename", "filepath", "dir", "directory", "folder"}:
            files = _FILE.findall(request)
            # A writing tool writes the file the instruction asks for ("… to report.md"); a reading tool reads
            # what exists, not that file.
            targets = set(_WRITE_TARGET.findall(request.strip().split("\n\n", 1)[0]))  # the instruction's own
            if self.acting:
                files = [f for f in files if f in targets] or files
            else:
                files = [f for f in files if f not in targets] or files
            if self.listing:
                folders = [f.rsplit("/", 1)[0] for f in files if "/" in f]
                return self._pick(list(dict.fromkeys(folders))) if folders else "."
            if files:
                return self._pick(files)
            if words & {"dir", "directory", "folder"} or (key == "path" and "list" in self.request_stems):
                return "."
            return f"{_main_noun(self.request_stems)}.md" if self.acting else None
        if words & {"email", "recipient", "to"} and _EMAIL.search(request):
            return self._pick(_EMAIL.findall(request))
        if words & {"url", "link", "uri"}:
            return self._pick(_URL.findall(request))
        if words & {"expression", "formula", "equation", "expr"}:
            return _expression(request)
        if words & {"date", "day"}:
            dates = _DATE.findall(request)
            if dates:
                return self._pick(dates)
            for rel in ("today", "tomorrow", "yesterday"):
                if rel in request.lower():
                    return rel
            return None
        if words & {"time"} and _CLOCK.search(request):
            return self._pick(_CLOCK.findall(request))
        codes = _CURRENCY.findall(request)
        if words & {"currency", "base", "quote", "target", "source", "from", "to"} and codes:
            pick = 1 if words & {"to", "target", "quote"} and len(codes) > 1 else self._codes
            self._codes += 1
            return str(codes[min(pick, len(codes) - 1)])
        if words & {"symbol", "ticker"}:
            tickers = [t for t in re.findall(r"\b[A-Z]{1,5}\b", request) if t not in {"I", "A"}]
            if tickers:
                return str(tickers[0])
        if words & {"language", "lang"}:
            named = re.search(rf"\b(?:in|into|to)\s+({'|'.join(_LANGUAGES)})\b", request, re.I)
            return named.group(1).capitalize() if named else "English"
        if words & {"location", "city", "place", "destination", "origin", "country", "region", "branch", "town"}:
            return self._pick(ctx.places())
        if words & {"content", "body", "text", "message", "note", "summary"}:
            quoted = _quoted(request)
            if quoted and words & {"text", "message"}:
                return quoted[0]
            return self.answer_text or _document(request, _main_noun(self.request_stems))
        if words & {"query", "q", "search", "keyword", "keywords", "term", "topic", "question", "prompt", "input"}:
            return _topic(request)
        if (key.endswith("id") or words & {"number", "code", "sku", "flight", "ticket", "invoice", "order", "account",
                                            "reference", "ref", "tracking", "key"}):  # fmt: skip
            return self._pick(ctx.ids())
        if words & {"name", "product", "item", "title", "subject", "symbol", "ticker"}:
            quoted = _quoted(request)
            return quoted[0] if quoted else self._pick(ctx.places()) or _topic(request, 6)
        if words & {"unit", "units"}:
            return "fahrenheit" if "fahrenheit" in request.lower() else "celsius"
        quoted = _quoted(request)
        return quoted[0] if quoted else _topic(request)


def _document(request: str, noun: str) -> str:
    """What a model writes to a file with no tool results to go on: a heading, the task, and the material the
    request carries (another agent's results, pasted context), condensed."""
    first, _, rest = request.strip().partition("\n")
    lines = [f"# {noun.capitalize()}", "", f"Task: {_topic(first, 30)}"]
    material = [ln.strip() for ln in rest.splitlines() if ln.strip() and not ln.strip().endswith(":")]
    lines += [f"- {_short(ln, 24)}" for ln in material[:32]]
    return "\n".join(lines) + "\n"


def _as_dict(value: Any) -> dict[str, Any]:
    """A schema's mapping field, or nothing: clients send schemas of every shape, and none may crash a reply."""
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _quoted(text: str) -> list[str]:
    return [next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)]


def _main_noun(stems: set[str]) -> str:
    for word in ("report", "plan", "summary", "findings", "review", "notes", "result"):
        if _stem(word) in stems:
            return word
    return "notes"


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class _Result:
    name: str
    arguments: str
    text: str


def _since_user(messages: list[Message]) -> list[Message]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return messages[i + 1 :]
    return list(messages)


def _results(messages: list[Message]) -> tuple[list[_Result], set[tuple[str, str]], int]:
    """Tool results since the request (paired with their calls), the calls made, and the rounds of calls."""
    calls: dict[str, tuple[str, str]] = {}
    order: list[tuple[str, str]] = []
    rounds = 0
    results: list[_Result] = []
    for m in _since_user(messages):
        if m.role == "assistant" and m.tool_calls:
            rounds += 1
            for c in m.tool_calls:
                calls[c.id] = (c.function.name, c.function.arguments)
                order.append((c.function.name, c.function.arguments))
        elif m.role in ("tool", "function"):
            name, args = calls.get(m.tool_call_id or "", ("", ""))
            if not name:
                # No id to pair by: the n-th result answers the n-th call, else the message's own name.
                name, args = order[len(results)] if len(results) < len(order) else (m.name or "tool", "")
            results.append(_Result(name, args, m.text()))
    return results, {(n, _canonical(a)) for n, a in order}, rounds


def _canonical(arguments: str) -> str:
    parsed = _parse(arguments or "{}")
    return json.dumps(parsed, sort_keys=True) if isinstance(parsed, dict) else str(arguments)


@dataclass
class AgentBehaviour:
    """A rule-based tool-calling model; see the module docstring."""

    median_tokens: int = 48  # plain answers: lognormal word counts around this
    sigma: float = 0.6
    max_rounds: int = 4
    error_rate: float = 0.0
    name: str = "agent"

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"agent error rate must be in [0, 1], got {self.error_rate}")
        if self.max_rounds < 1:
            raise ConfigError("the agent behaviour needs at least one round")

    def reply(self, turn: Turn) -> Reply:
        mistake = turn.rng.choice(MISTAKES) if self.error_rate and turn.rng.random() < self.error_rate else None
        request = turn.last_user_text()
        results, made, rounds = _results(turn.messages)
        ctx = _Context(request, [_parse(r.text) for r in results])
        stems = _stems(request)
        tools = [t for t in turn.tools if isinstance(t.function.name, str) and t.function.name]
        forced = turn.forced_tool()
        if forced is not None:
            tool = next((t for t in tools if t.function.name == forced), None)
            args = _fill_or_placeholder(tool, ctx, stems, _summary(results, request) if results else "")
            return Reply(tool_calls=[PlannedCall(forced, json.dumps(args, ensure_ascii=False))])
        if tools and turn.tool_choice != "none" and rounds < self.max_rounds:
            planned, missing = self._plan(tools, ctx, stems, results, made, turn)
            if planned:
                return Reply(tool_calls=_mistaken(planned, tools, mistake, turn))
            if missing and not results:
                return Reply(content=f"I can do that, but I need the {missing.replace('_', ' ')} first. What is it? ")
        if results:
            text = _summary(results, request)
            if mistake == "invented-fact":
                text += f" The total comes to {turn.rng.randint(11, 99)}.{turn.rng.randint(10, 99)} EUR. "
            return Reply(content=text)
        return Reply(content=self._plain(turn, request))

    def _plan(
        self,
        tools: list[Tool],
        ctx: _Context,
        stems: set[str],
        results: list[_Result],
        made: set[tuple[str, str]],
        turn: Turn,
    ) -> tuple[list[PlannedCall], str | None]:
        picked = [t for t in tools if _fits(t, stems, ctx.request)]
        called = {name for name, _ in made}
        pending = [t for t in picked if t.function.name not in called]
        readers = [t for t in pending if not _is_action(t)]
        # Acting tools wait for the readers' results: their content is what the readers found.
        wave = readers or [t for t in pending if _is_action(t)]
        answer = _summary(results, ctx.request) if results else ""
        out: list[PlannedCall] = []
        missing: str | None = None
        for tool in wave:
            values: list[dict[str, Any]] = []
            for alt in range(4):
                try:
                    args = _Filler(ctx, stems, answer, alt, _is_action(tool), _is_listing(tool)).arguments(tool)
                except _Unfilled as exc:
                    missing = missing or str(exc)
                    break
                if args in values:
                    break
                values.append(args)
            for args in values:
                text = json.dumps(args, ensure_ascii=False)
                if (tool.function.name, _canonical(text)) not in made:
                    out.append(PlannedCall(tool.function.name, text))
        return out[:8], missing

    def _plain(self, turn: Turn, request: str) -> str:
        topic = _topic(request, 10)
        lead = f"Here is my answer about {topic}: " if topic else "Here is my answer: "
        words = max(1, int(turn.rng.lognormvariate(0.0, self.sigma) * self.median_tokens))
        if turn.max_tokens is not None:
            words = min(words, max(1, turn.max_tokens - len(lead.split())))
        body = " ".join(turn.rng.choices(_PROSE, k=min(words, max(1, turn.max_output))))
        return f"{lead}{body}. "


_PROSE = [
    "it",
    "depends",
    "on",
    "the",
    "details",
    "but",
    "in",
    "most",
    "cases",
    "the",
    "simplest",
    "approach",
    "works",
    "well",
    "and",
    "is",
    "easy",
    "to",
    "check",
    "so",
    "start",
    "small",
    "measure",
    "the",
    "result",
    "and",
    "adjust",
    "the",
    "plan",
    "step",
    "by",
    "step",
    "until",
    "the",
    "outcome",
    "is",
    "clear",
]


def _fits(tool: Tool, stems: set[str], request: str) -> bool:
    """Whether the request points at ``tool``: its whole name, or two of its name and description words."""
    fn = tool.function
    expanded = set(stems)
    for s in stems:
        expanded.update(_stem(w) for w in _SYNONYMS.get(s, ()))
    if _expression(request):
        expanded.update({"calculat", "calculator", "arithmetic", "math", "evaluate", "expression", "comput"})
    if _FILE.search(request):
        # One piece of evidence, one word: a file name says "a file tool", not also "a tool taking a path".
        expanded.add("file")
    if _EMAIL.search(request):
        expanded.add("email")
    if _CURRENCY.search(request):
        expanded.update({"currency", "currenci"})
    name = {_stem(p) for p in _name_parts(fn.name) if p not in _STOP}
    params = fn.parameters.get("properties") if isinstance(fn.parameters, dict) else None
    keys = {_stem(p) for k in (params if isinstance(params, dict) else {}) for p in _name_parts(str(k))}
    described = (_stems(fn.description if isinstance(fn.description, str) else "") | keys) - name
    on_name, on_description = len(name & expanded), len(described & expanded)
    # One word of a longer name ("write" of write_file in "write a haiku") is not enough on its own.
    return (bool(name) and on_name == len(name)) or on_name + on_description >= 2


def _is_action(tool: Tool) -> bool:
    parts = _name_parts(tool.function.name)
    return bool(parts) and parts[0] in _ACTIONS


def _is_listing(tool: Tool) -> bool:
    parts = _name_parts(tool.function.name)
    return bool(parts) and parts[0] in ("list", "ls")


def _fill_or_placeholder(tool: Tool | None, ctx: _Context, stems: set[str], answer: str) -> dict[str, Any]:
    if tool is None:
        return {}
    try:
        return _Filler(ctx, stems, answer, acting=_is_action(tool), listing=_is_listing(tool)).arguments(tool)
    except _Unfilled:
        # Forced and nothing fits: a type-correct value per required field, as a constrained decoder would emit.
        params = _as_dict(tool.function.parameters)
        props = _as_dict(params.get("properties"))
        required = _as_list(params.get("required")) if "required" in params else list(props)
        defaults = {"integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}
        out: dict[str, Any] = {}
        for k in required:
            if isinstance(k, str):
                sub = props.get(k)
                kind = sub.get("type") if isinstance(sub, dict) else "string"
                out[k] = defaults.get(kind, "") if isinstance(kind, str) else ""
        return out


def _mistaken(planned: list[PlannedCall], tools: list[Tool], mistake: str | None, turn: Turn) -> list[PlannedCall]:
    if mistake == "wrong-tool":
        others = [t.function.name for t in tools if t.function.name not in {p.name for p in planned}]
        if others:
            return [PlannedCall(turn.rng.choice(others), planned[0].arguments), *planned[1:]]
        mistake = "bad-argument"
    if mistake == "bad-argument":
        args = _parse(planned[0].arguments)
        if isinstance(args, dict) and args:
            key = sorted(args)[0]
            args[key] = None if isinstance(args[key], str) else "not-a-value"
            return [PlannedCall(planned[0].name, json.dumps(args)), *planned[1:]]
    return planned


def _describe(value: Any, depth: int = 0) -> Iterable[str]:
    if isinstance(value, dict):
        error = value.get("error")
        if error is not None:
            detail = error.get("message") or json.dumps(error) if isinstance(error, dict) else str(error)
            yield f"it failed: {detail}"
            return
        for k, v in list(value.items())[:8]:
            label = str(k).replace("_", " ")
            if v is None or v == "" or v == []:
                yield f"the {label} is not available"
            elif isinstance(v, dict | list) and depth < 1:
                inner = "; ".join(_describe(v, depth + 1))
                yield f"{label}: {inner}" if inner else f"{label}: none"
            else:
                yield f"{label} {_short(v)}"
    elif isinstance(value, list):
        if not value:
            yield "nothing was returned"
        for item in value[:6]:
            yield ", ".join(_describe(item, depth + 1)) if isinstance(item, dict | list) else _short(item)
    else:
        yield _short(value)


def _short(value: Any, words: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    parts = text.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


def _summary(results: list[_Result], request: str) -> str:
    """The answer a model would write from the tool results (what each tool said, failures as failures)."""
    if not results:
        return f"I looked into {_topic(request, 10)}."
    lines = []
    for r in results[-8:]:
        value = _parse(r.text)
        if isinstance(value, str) and re.match(r"\s*(?:error|exception|traceback)\b", value, re.I):
            lines.append(f"The {r.name} call failed ({_short(value, 20)}), so I could not get that result.")
            continue
        said = "; ".join(_describe(value))
        lines.append(f"From {r.name}: {said}." if said else f"{r.name} returned nothing.")
        written = _parse(r.arguments)
        if isinstance(written, dict) and isinstance(written.get("content"), str):
            # Say what was written: a dependent agent gets this answer in its prompt beside a copy of the file.
            lines.append(f"It reads: {_short(written['content'], 60)}")
    return "Here is what I found. " + " ".join(lines) + " "
