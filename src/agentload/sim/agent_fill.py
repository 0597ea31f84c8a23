"""Argument values for one tool call: each parameter's value taken from the clause that asked for the tool, the
whole request, or the tool results so far, by the parameter's name, type and schema — never invented.

A required value found nowhere raises ``Unfilled`` (the model waits for a result, or asks the user); an optional
parameter the conversation does not ground is left out, as a careful model does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentload.sim import agent_extract as ex
from agentload.sim.agent_conv import Conversation
from agentload.sim.chat import Tool

_GENERIC = frozenset({"id", "ids", "name", "number", "no", "num", "code", "value", "key", "the", "a", "of", "get",
                      "fetch", "find", "lookup", "look", "search", "list", "show", "read", "query", "by"})  # fmt: skip
_ID_WORDS = frozenset({"id", "ids", "number", "code", "sku", "flight", "ticket", "invoice", "order", "account",
                       "reference", "ref", "tracking", "key", "uuid", "identifier", "hop", "token", "pnr", "booking",
                       "employee", "customer", "user", "item", "product", "parcel", "shipment", "case",
                       "issue"})  # fmt: skip
# Nouns that say what kind of thing an ID identifies (generic ones such as "id", "key", "code" say nothing).
ID_NOUNS = _ID_WORDS - _GENERIC - {"number", "reference", "ref", "uuid", "identifier", "token"}
_PLACE_WORDS = frozenset({"location", "city", "place", "destination", "origin", "country", "region", "branch", "town",
                          "address", "near", "area", "state", "site", "store", "office", "airport"})  # fmt: skip
_TEXT_WORDS = frozenset({"content", "body", "text", "message", "note", "notes", "summary", "description", "comment",
                         "answer", "response", "reply", "details", "event", "entry", "log"})  # fmt: skip
_QUERY_WORDS = frozenset({"query", "q", "search", "keyword", "keywords", "term", "terms", "topic", "question",
                          "prompt", "input", "criteria", "filter", "phrase"})  # fmt: skip
_NAME_WORDS = frozenset({"name", "product", "item", "title", "subject", "person", "user", "customer", "room", "team",
                         "company", "contact", "recipient", "owner", "label", "tag", "category", "project", "model",
                         "brand", "author", "employee", "station", "restaurant", "hotel"})  # fmt: skip
_FILE_WORDS = frozenset({"path", "file", "filename", "filepath", "dir", "directory", "folder", "fname"})


class Unfilled(Exception):
    """A required value the conversation does not contain."""


def schema_props(tool: Tool) -> tuple[dict[str, Any], list[str]]:
    params = tool.function.parameters if isinstance(tool.function.parameters, dict) else {}
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    req = params.get("required")
    required = [k for k in req if isinstance(k, str) and k in props] if isinstance(req, list) else []
    return props, required


def _words(key: str) -> set[str]:
    return set(ex.name_parts(key))


@dataclass
class Filler:
    """Fills one tool's arguments; ``alt`` picks the n-th candidate of a fanned-out value ("Paris and Tokyo")."""

    tool: Tool
    conv: Conversation
    clause: str
    alt: int = 0
    acting: bool = False
    answer_text: str = ""
    results_first: bool = False  # values from the newest results before the request's (following a pointer)
    fanned: str | None = None  # the parameter whose candidates were fanned out, once known

    def arguments(self) -> dict[str, Any]:
        props, required = schema_props(self.tool)
        out: dict[str, Any] = {}
        self._numbers_used = 0
        self._codes_used = 0
        for key in required:
            out[key] = self.value(key, props.get(key), required=True)
        for key, sub in props.items():
            if key in out:
                continue
            try:
                out[key] = self.value(key, sub, required=False)
            except Unfilled:
                continue
        return out

    # -- by type -------------------------------------------------------------------------------------------------

    def value(self, key: str, schema: Any, *, required: bool) -> Any:
        schema = schema if isinstance(schema, dict) else {}
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if kind is None and isinstance(schema.get("anyOf"), list):
            kinds = [s.get("type") for s in schema["anyOf"] if isinstance(s, dict) and s.get("type") != "null"]
            kind = kinds[0] if kinds else None
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._enum(key, schema["enum"], required)
        if "const" in schema:
            return schema["const"]
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, required)
        if kind == "array":
            return self._array(key, schema, required)
        if kind in ("integer", "number"):
            return self._number(key, schema, integer=kind == "integer", required=required)
        if kind == "boolean":
            return self._boolean(key, schema, required)
        return self._string(key, schema, required)

    def _object(self, schema: Mapping[str, Any], required: bool) -> dict[str, Any]:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        assert isinstance(props, dict)
        req = schema.get("required") if isinstance(schema.get("required"), list) else []
        assert isinstance(req, list)
        out: dict[str, Any] = {}
        for k in req:
            if isinstance(k, str):
                out[k] = self.value(k, props.get(k), required=True)
        for k, sub in props.items():
            if k not in out:
                try:
                    out[k] = self.value(k, sub, required=False)
                except Unfilled:
                    continue
        if not out and not required:
            raise Unfilled("object")
        return out

    def _enum(self, key: str, options: list[Any], required: bool) -> Any:
        converting = self._conversion_unit(key)
        for option in options if converting else []:
            if isinstance(option, str) and (option.lower() == converting or ex.unit_of(option) == converting):
                return option
        for text in (self.clause, self.conv.request):
            low = text.lower()
            for option in options:
                if isinstance(option, str) and option and re.search(rf"\b{re.escape(option.lower())}\b", low):
                    return option
            # "in Fahrenheit" for an enum of "c"/"f"
            for option in options:
                word = {"c": "celsius", "f": "fahrenheit"}.get(option.lower()) if isinstance(option, str) else None
                if word and re.search(rf"\b{word}\b", low):
                    return option
        if not required:
            raise Unfilled(key)
        return options[0]

    def _array(self, key: str, schema: Mapping[str, Any], required: bool) -> list[Any]:
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        assert isinstance(items, dict)
        singular = key[:-1] if key.endswith("s") else key
        kind = items.get("type", "string")
        if kind == "string" and not items.get("enum"):
            many = self._candidates(singular, items)
            if many:
                return many
        try:
            first = self.value(singular, items, required=required)
        except Unfilled:
            if not required:
                raise
            return []
        return [first]

    def _number(self, key: str, schema: Mapping[str, Any], *, integer: bool, required: bool) -> int | float:
        found: float | None = None
        earlier = self._from_results(key)
        if isinstance(earlier, int | float) and not isinstance(earlier, bool):
            found = float(earlier)
        words = _words(key)
        for text in (self.clause, self.conv.request):
            if found is not None:
                break
            found = ex.number_with_unit(text, words)
            if found is None and words & {"amount", "price", "cost", "total", "sum", "budget", "salary"}:
                found = ex.amount(text)
            if found is None:
                phrase = key.replace("_", " ").rstrip("s")
                near = re.search(rf"(-?\d+(?:\.\d+)?)\s+(?:\w+\s)?{re.escape(phrase)}", text, re.I) or re.search(
                    rf"{re.escape(phrase)}s?\s*(?:of|is|=|:)?\s*(-?\d+(?:\.\d+)?)", text, re.I
                )
                if near is not None:
                    found = float(near.group(1))
        if found is None and required:
            loose = ex.numbers(self.clause) or ex.numbers(self.conv.request)
            if self._numbers_used < len(loose):
                found = loose[self._numbers_used]
                self._numbers_used += 1
        if found is None:
            if not required:
                raise Unfilled(key)
            default = schema.get("default")
            if isinstance(default, int | float) and not isinstance(default, bool):
                found = float(default)
            else:
                raise Unfilled(key)
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(low, int | float) and not isinstance(low, bool):
            found = max(found, float(low))
        if isinstance(high, int | float) and not isinstance(high, bool):
            found = min(found, float(high))
        return int(found) if integer else found

    def _boolean(self, key: str, schema: Mapping[str, Any], required: bool) -> bool:
        words = _words(key)
        low = self.conv.request.lower()
        said = any(re.search(rf"\b{re.escape(w)}", low) for w in words if w not in _GENERIC)
        if not required and not said:
            raise Unfilled(key)  # an optional flag the user never mentioned stays unset
        if said:
            return not re.search(r"\b(?:no|without|don't|do not|not)\s+(?:\w+\s+){0,2}" + "|".join(words), low)
        default = schema.get("default")
        return bool(default) if isinstance(default, bool) else False

    def _string(self, key: str, schema: Mapping[str, Any], required: bool) -> str:
        value = self._grounded(key, required)
        if value is None:
            raise Unfilled(key)
        max_len = schema.get("maxLength")
        if isinstance(max_len, int) and max_len >= 0:
            value = value[:max_len]
        return value

    # -- by meaning ----------------------------------------------------------------------------------------------

    def _anchors(self, key: str) -> tuple[str, ...]:
        parts = [p for p in ex.name_parts(key) + ex.name_parts(self.tool.function.name) if p not in _GENERIC]
        return tuple(dict.fromkeys(parts + [ex.stem(p) for p in parts if len(ex.stem(p)) > 2]))

    def _ids(self, text: str, key: str) -> list[str]:
        """IDs for ``key``: not one the text names as another kind of thing ("order …" for a tracking number)."""
        anchors = self._anchors(key)
        return ex.ids(text, anchors, ID_NOUNS - set(anchors))

    def _pick(self, options: list[str], key: str) -> str | None:
        if not options:
            return None
        if self.fanned in (None, key) and self.alt < len(options):
            self.fanned = key
            return options[self.alt]
        return options[0] if self.alt == 0 or self.fanned != key else None

    def _candidates(self, key: str, schema: Mapping[str, Any]) -> list[str]:
        """Every candidate value of ``key`` the clause names, for a parameter that takes several."""
        words = _words(key)
        if words & _FILE_WORDS:
            return ex.files(self.clause)
        if words & _PLACE_WORDS:
            return ex.places(self.clause)
        if key.endswith("id") or words & _ID_WORDS:
            return self._ids(self.clause, key)
        return ex.quoted(self.clause)

    def _from_results(self, key: str) -> Any:
        """The newest value a tool result gave under ``key`` (or a key ending in it: ``next_key`` for ``key``)."""
        for r in reversed(self.conv.results):
            found = lookup(r.value, key)
            if found is not None and not (self.results_first and _echoed(found, r.args)):
                return found
        if key.endswith("id") and self.results_first:
            # "the manager of employee E-1093": a manager_id the record gives is the next employee_id to look up
            asked = ex.stems(self.conv.request)
            for r in reversed(self.conv.results):
                if isinstance(r.value, dict):
                    for k, v in r.value.items():
                        if isinstance(v, str) and str(k).endswith("_id") and ex.stem(str(k)[:-3]) in asked:
                            return v
        return None

    def _grounded(self, key: str, required: bool) -> str | None:
        """A string parameter's value, by what its name means: what a tool result gave, else what the request
        names for that kind of value (a file, an address, a date, a currency, an ID, a place, a text …)."""
        low_key = key.lower()
        words = _words(low_key)
        clause, request = self.clause, self.conv.request
        texts = (clause, request)
        earlier = self._from_results(low_key)
        if (
            isinstance(earlier, str | int | float)
            and not isinstance(earlier, bool)
            and not words & _TEXT_WORDS
            and (self.results_first or not (words & _ID_WORDS and any(self._ids(t, key) for t in texts)))
        ):
            return str(earlier)
        tool_words = set(ex.name_parts(self.tool.function.name)) | ex.stems(self.tool.function.description or "")
        if words & _FILE_WORDS or (words & {"name"} and tool_words & {"file", "files", "document", "doc"}):
            # "List the files under a directory" takes a folder even when its parameter is called "path".
            folder = bool(tool_words & {"directory", "folder", "dir"}) and not words & {"file", "filename"}
            return self._file(key, words, texts, required, folder=folder)
        if words & {"email", "recipient", "to", "address"} and any(ex.EMAIL.search(t) for t in texts):
            return self._pick(_first_nonempty([ex.EMAIL.findall(t) for t in texts]), key)
        if words & {"url", "link", "uri", "website", "site", "page", "href"}:
            found = _first_nonempty([ex.urls(t) for t in texts] + [self._result_shapes(ex.urls)])
            return self._pick(found, key)
        if words & {"expression", "formula", "equation", "expr", "math", "calculation"}:
            return ex.expression(clause) or ex.expression(request) or self._expression_from_results()
        if words & {"date", "day", "when", "deadline"}:
            return self._date(key, texts)
        if words & {"time", "hour", "at"} and not words & {"zone"} and any(ex.CLOCK.search(t) for t in texts):
            return self._pick(_first_nonempty([ex.CLOCK.findall(t) for t in texts]), key)
        codes = ex.currencies(clause) or ex.currencies(request)
        if words & {"currency", "base", "quote", "target", "source", "from", "to", "symbol"} and codes:
            return self._currency(words, codes)
        if words & {"symbol", "ticker"}:
            tickers = [t for t in re.findall(r"\b[A-Z]{1,5}\b", request) if t not in {"I", "A", "AND", "OR", "ID"}]
            return tickers[0] if tickers else None
        if words & {"language", "lang", "locale"}:
            named = re.search(rf"\b(?:in|into|to)\s+({'|'.join(ex.LANGUAGES)})\b", request, re.I)
            return named.group(1).capitalize() if named else ("English" if required else None)
        if low_key.endswith("id") or (words & _ID_WORDS and not words & _NAME_WORDS - _ID_WORDS):
            return self._identifier(key, texts)
        if words & _PLACE_WORDS:
            return self._place(key, words)
        if words & _QUERY_WORDS:
            return ex.query(clause) or ex.query(request) or _topic(clause if len(clause) > 12 else request)
        if words & _TEXT_WORDS:
            return self._text(words, required)
        if words & _NAME_WORDS or words & _ID_WORDS:
            return self._name(key, texts, required)
        if words & {"unit", "units"}:
            unit = self._conversion_unit(key)
            if unit:
                return unit
            return "fahrenheit" if "fahrenheit" in request.lower() else ("celsius" if required else None)
        if not required:
            return None
        return self._anything_named(key)

    def _date(self, key: str, texts: tuple[str, str]) -> str | None:
        """A date the clause or request writes out, else a relative day the request says."""
        dates = _first_nonempty([ex.DATE.findall(t) for t in texts])
        if dates:
            return self._pick(dates, key)
        for rel in ("today", "tomorrow", "yesterday"):
            if rel in self.conv.request.lower():
                return rel
        return None

    def _currency(self, words: set[str], codes: list[str]) -> str:
        """One of the currency codes named: the second for a target, the first for a source, else each in turn."""
        second = bool(words & {"to", "target", "quote"})
        first = bool(words & {"from", "source", "base"})
        if second and len(codes) > 1:
            return codes[1]
        if first or second:
            return codes[0]
        pick = min(self._codes_used, len(codes) - 1)
        self._codes_used += 1
        return codes[pick]

    def _identifier(self, key: str, texts: tuple[str, str]) -> str | None:
        """An ID the texts name, else a quoted value, else one shaped like an ID in a tool result."""
        found = _first_nonempty([self._ids(t, key) for t in texts])
        if not found:
            found = _first_nonempty([ex.quoted(t) for t in texts])
        if not found:
            found = self._result_shapes(lambda t: self._ids(t, key))
        return self._pick(found, key)

    def _place(self, key: str, words: set[str]) -> str | None:
        """A place the clause names (else the request), cities first for a city, else one a tool result gave."""
        clause, request = self.clause, self.conv.request
        found = ex.places(clause) + ex.names(clause, self._anchors(key))
        found = list(dict.fromkeys(found)) or ex.places(request) + ex.names(request, self._anchors(key))
        found = _prefer_anchored(found, clause, self._anchors(key))
        if words & {"city", "town"}:
            found = _cities_first(found, clause + " " + request)
        found = [v for v in found if not any(c.isdigit() for c in v)]
        return self._pick(found, key) or self._result_place()

    def _text(self, words: set[str], required: bool) -> str | None:
        """A free text: what is quoted, else the answer being written, else what follows "that"."""
        clause, request = self.clause, self.conv.request
        q = ex.quoted(clause) or ex.quoted(request)
        if q and not (self.acting and self.answer_text and words & {"content", "body", "summary"}):
            return q[0]
        if not required and not any(w in request.lower() for w in words):
            return None  # an optional note nobody asked for stays out
        if self.answer_text:
            return self.answer_text
        return _after_that(clause) or (_topic(request) if required else None)

    def _name(self, key: str, texts: tuple[str, str], required: bool) -> str | None:
        """A name the texts give (else an ID), or the clause's topic when the parameter is required."""
        anchors = self._anchors(key)
        found = _first_nonempty([ex.names(t, anchors) for t in texts])
        if not found:
            found = _first_nonempty([self._ids(t, key) for t in texts])
        return self._pick(found, key) or (_topic(self.clause, 6) if required else None)

    def _anything_named(self, key: str) -> str:
        """A required parameter of no known kind: what is quoted, else an ID or name, else the topic."""
        clause, request = self.clause, self.conv.request
        q = ex.quoted(clause) or ex.quoted(request)
        if q:
            return q[0]
        found = self._ids(clause, key) or ex.names(clause, self._anchors(key))
        return found[0] if found else _topic(clause if len(clause) > 12 else request)

    def _conversion_unit(self, key: str) -> str | None:
        """``from_unit`` and ``to_unit`` of a conversion the request asks for ("42 km to miles": km, then mi)."""
        words = _words(key)
        found = ex.conversion(self.clause) or ex.conversion(self.conv.request)
        if found is None:
            return None
        if words & {"to", "target", "into", "output", "dest", "destination"}:
            return found[1]
        if words & {"from", "source", "input", "src", "origin"}:
            return found[0]
        return None

    def _file(self, key: str, words: set[str], texts: tuple[str, ...], required: bool, *, folder: bool) -> str | None:
        if folder or (words & {"dir", "directory", "folder"} and not words & {"path", "file"}):
            named = _first_nonempty([re.findall(r"(?<![\w.])((?:[\w.-]+/)+)(?!\S*\.\w)", t) for t in texts])
            # the folders of the files the request names ("from/module.0/defects.md" → "from/module.0")
            homes = _first_nonempty([[f.rsplit("/", 1)[0] for f in ex.files(t) if "/" in f] for t in texts])
            folders = list(dict.fromkeys([f.rstrip("/") for f in named] + homes))
            return self._pick(folders, key) if folders else ("." if required else None)
        found = _first_nonempty([ex.files(t) for t in texts])
        targets = set(ex.write_targets(self.conv.request))
        if self.acting:
            found = [f for f in found if f in targets] or found
        else:
            found = [f for f in found if f not in targets] or found
            if self.results_first or not found:
                newer = [f for f in self._result_shapes(ex.files) if f not in found]
                found = newer + found if self.results_first else found or newer
        if found:
            return self._pick(found, key)
        return "notes.md" if self.acting and required else None

    def _result_shapes(self, extract: Any) -> list[str]:
        out: list[str] = []
        for r in reversed(self.conv.results):
            out += [v for v in extract(r.text) if v not in out]
        return out

    def _result_place(self) -> str | None:
        for r in reversed(self.conv.results):
            for k in ("city", "office", "location", "town", "place", "branch", "country"):
                v = lookup(r.value, k)
                if isinstance(v, str) and v:
                    return v
        return None

    def _result_text_value(self, key: str) -> str | None:
        for r in reversed(self.conv.results):
            v = lookup(r.value, key)
            if isinstance(v, str):
                return v
        return None

    def _expression_from_results(self) -> str | None:
        """The sum or product the request asks for, over the numbers the tool results gave."""
        low = self.conv.request.lower()
        nums: list[float] = []
        for r in self.conv.results:
            nums += _numbers_in(r.value)
        if len(nums) < 2:
            return None
        nums += ex.numbers(self.conv.request)
        shown = [ex.fmt_number(n) for n in nums[:20]]
        if re.search(r"\b(?:multiply|product|times)\b", low):
            return " * ".join(shown)
        if re.search(r"\b(?:average|mean)\b", low):
            return f"({' + '.join(shown)}) / {len(shown)}"
        if re.search(r"\b(?:difference|subtract|minus)\b", low):
            return " - ".join(shown[:2])
        return " + ".join(shown)


def _echoed(value: Any, args: dict[str, Any]) -> bool:
    """A result field that repeats what the call sent ("path": "start.md") is no pointer to anything new."""
    return any(value == v for v in args.values())


def _numbers_in(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for k, v in value.items() if not str(k).lower().endswith("id") for n in _numbers_in(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers_in(v)]
    if isinstance(value, str):
        return ex.numbers(re.sub(r"[,;\n]", " ", value))
    return []


def lookup(value: Any, key: str, depth: int = 0) -> Any:
    """``key``'s value in a result (or a key that ends with it: ``next_key`` for ``key``), searched two deep."""
    if isinstance(value, dict):
        for k, v in value.items():
            if v is not None and isinstance(k, str) and k.lower() == key:
                return v
        for k, v in value.items():
            ends = isinstance(k, str) and (k.lower().endswith("_" + key) or key.endswith("_" + k.lower()))
            if ends and v is not None and not isinstance(v, dict | list):
                return v
        if depth < 2:
            for v in value.values():
                if isinstance(v, dict):
                    found = lookup(v, key, depth + 1)
                    if found is not None:
                        return found
    return None


def _first_nonempty(lists: list[list[str]]) -> list[str]:
    return next((x for x in lists if x), [])


def _prefer_anchored(found: list[str], clause: str, anchors: tuple[str, ...]) -> list[str]:
    named = ex.names(clause, anchors)
    return sorted(found, key=lambda v: 0 if named and v == named[0] else 1)


def _cities_first(found: list[str], text: str) -> list[str]:
    """A city parameter takes the town of "near Union Square, San Francisco", not the square."""
    after_comma = [v for v in found if re.search(r",\s*" + re.escape(v), text)]
    return after_comma + [v for v in found if v not in after_comma]


def _topic(text: str, limit: int = 12) -> str:
    first = ex.sentences(text.strip())[0] if text.strip() else text
    first = re.sub(
        r"^(?:please\s+)?(?:can you\s+|could you\s+)?(?:search(?: for)?|find|look up|look for|tell me|what is|"
        r"what's|show me|get)\s+",
        "",
        first,
        flags=re.I,
    )
    return " ".join(first.strip(" ?.!").split()[:limit]) or text[:80]


def _after_that(clause: str) -> str | None:
    """The message of "tell Bob that the build is fixed": what follows "that"/"saying"."""
    m = re.search(r"\b(?:saying|that says|that|to say)\s+(.+)", clause, re.I)
    return m.group(1).strip(" .") if m else None
