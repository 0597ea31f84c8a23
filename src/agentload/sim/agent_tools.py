"""How the agent model reads an offered tool: its verb, whether it changes the world, and how strongly a piece of
the request points at it — the words its name (its verb most), description and parameters share with the request,
plus evidence: an ID for a tool that takes one, "3 * 7" for a calculator, "42 km to miles" for a converter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentload.sim import agent_extract as ex
from agentload.sim.agent_fill import schema_props
from agentload.sim.chat import Tool

# Request word -> the words a tool for it is named or described with.
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "temperature": ("weather",), "forecast": ("weather",), "rain": ("weather",), "raining": ("weather",),
    "sunny": ("weather",), "umbrella": ("weather",), "warm": ("weather",), "cold": ("weather",), "hot": ("weather",),
    "compute": ("calculate", "calculator", "evaluate"), "calculate": ("calculator", "evaluate", "arithmetic"),
    "sum": ("calculate", "calculator"), "multiply": ("calculate", "calculator"), "divide": ("calculate", "calculator"),
    "total": ("calculate", "calculator", "sum"), "average": ("calculate", "calculator"),
    "find": ("search", "lookup", "look"), "look": ("search", "lookup", "find", "get"), "lookup": ("search", "find"),
    "e-mail": ("email", "mail", "send"), "email": ("mail", "send", "message"), "mail": ("email", "send"),
    "text": ("sms", "message", "send"), "sms": ("text", "message", "send"),
    "convert": ("conversion", "exchange", "rate"), "exchange": ("convert", "currency", "rate"),
    "meeting": ("calendar", "event", "schedule"), "schedule": ("calendar", "event", "meeting", "create"),
    "remind": ("reminder",), "price": ("quote", "stock"), "shares": ("stock",), "folder": ("directory", "files"),
    "directory": ("folder", "files"), "save": ("write",), "store": ("write", "save"), "open": ("read",),
    "show": ("read", "list", "get", "view"), "translate": ("translation", "language"),
    "mention": ("search", "find"), "contain": ("search", "find"), "summarise": ("read", "fetch", "get"),
    "summarize": ("read", "fetch", "get"), "record": ("log", "add", "write"), "note": ("log", "add"),
    "where": ("track", "location", "status", "locate"), "status": ("track", "get"), "review": ("get",),
    "read": ("get", "fetch", "open"), "fetch": ("get", "read"), "restaurant": ("place", "places"),
    "restaurants": ("place", "places"), "hotel": ("place", "places"), "address": ("place", "location"),
    "lives": ("address", "location"), "delete": ("remove",), "remove": ("delete",),
    "cost": ("price", "quote", "subtotal", "total"), "orders": ("order",), "stock": ("inventory",),
    "units": ("inventory", "stock"), "many": ("count",), "times": ("calculate", "calculator"),
    "add": ("calculate", "calculator", "insert", "append"), "amounts": ("calculate", "calculator"),
}  # fmt: skip
# Verbs that change the world: a tool named with one runs only when the request asks for that act.
ACT_VERBS: dict[str, tuple[str, ...]] = {
    "write": ("write", "save", "store", "record", "put", "create"), "save": ("save", "store", "write", "keep"),
    "send": ("send", "email", "mail", "text", "message", "notify", "tell", "sms", "reply"),
    "post": ("post", "publish", "share", "send"), "create": ("create", "make", "add", "new", "schedule", "book", "set",
    "open", "register", "start"), "update": ("update", "change", "set", "edit", "modify", "rename"),
    "delete": ("delete", "remove", "erase", "drop", "clear"), "remove": ("remove", "delete", "drop", "take"),
    "add": ("add", "put", "insert", "append", "include", "record"), "book": ("book", "reserve", "schedule"),
    "schedule": ("schedule", "book", "plan", "arrange", "set"), "notify": ("notify", "tell", "alert", "send"),
    "submit": ("submit", "send", "file"), "close": ("close", "resolve", "shut"), "cancel": ("cancel", "abort"),
    "transfer": ("transfer", "move", "send", "pay", "wire"), "email": ("email", "mail", "send"),
    "sms": ("sms", "text", "send"), "text": ("text", "sms", "send"), "publish": ("publish", "post", "release"),
    "upload": ("upload", "put"), "set": ("set", "change", "configure", "turn"), "move": ("move", "transfer"),
    "rename": ("rename",), "log": ("log", "record", "note"), "insert": ("insert", "add"), "pay": ("pay",),
    "buy": ("buy", "purchase", "order"), "append": ("append", "add"),
}  # fmt: skip
_READ_VERBS = (
    "get read fetch list show find search lookup look track query check calculate compute convert translate count "
    "view open describe summarise summarize evaluate"
)
_VERBS = frozenset(ACT_VERBS) | frozenset(_READ_VERBS.split())
# Reading verbs that are also nouns: "list_remove" names the list, then the act.
_ALSO_NOUNS = frozenset({"list", "view"})
# Request phrases that ask to see something: they point at a tool that shows or lists it.
_SEE = re.compile(r"\b(?:what(?:'s| is| are)? (?:on|in)|show me|tell me what|list (?:the|my|all)|what do i have)\b",
                  re.I)  # fmt: skip
_SILENT = frozenset({"get", "fetch", "retrieve", "lookup", "query", "current"})
_FINAL = re.compile(r"^(?:final_?answer|answer|respond|reply|finish|submit_?answer|final_result|done)$", re.I)


def _verb(parts: list[str]) -> str | None:
    """A tool name's verb: its first word ("send_email"), or an act after the object it works on ("list_remove",
    "cart_add")."""
    if len(parts) > 1 and parts[-1] in ACT_VERBS and (parts[0] not in _VERBS or parts[0] in _ALSO_NOUNS):
        return parts[-1]
    return parts[0] if parts and parts[0] in _VERBS else None


def _evidence(text: str) -> set[str]:
    """Words a tool for ``text`` is named or described with: synonyms of its words, and what its values imply."""
    words = ex.stems(text)
    expanded = set(words)
    # Synonyms are keyed by the word as written ("times", "amounts") and by its stem ("compute" for "computing").
    for w in words | set(ex.WORD.findall(text.lower())):
        expanded.update(ex.stem(s) for s in _SYNONYMS.get(w, ()))
    if ex.expression(text):
        expanded.update({"calculat", "calculator", "arithmetic", "math", "evaluate", "expression", "comput"})
    if ex.conversion(text):
        expanded.update({"unit", "convert", "conversion"})  # "42 km to miles": a conversion between units
    named = ex.files(text)
    if named:
        # A file the text says to write to is an output: evidence of a file tool, not of reading it.
        reads = set(named) - set(ex.write_targets(text))
        expanded.update({"file", "read", "path"} if reads else {"file"})
    if ex.urls(text):
        expanded.update({"url", "fetch", "web", "page", "browse"})
    if ex.EMAIL.search(text):
        expanded.update({"email", "mail"})
    if ex.CURRENCY.search(text) or len(ex.currencies(text)) > 1:
        expanded.update({"currency", "currenci", "exchange", "rate"})
    if _SEE.search(text):
        expanded.update({"show", "list", "view", "get", "read"})
    return expanded


@dataclass
class AgentTool:
    """An offered tool as the model weighs it."""

    tool: Tool
    name: str
    parts: list[str]
    verb: str | None
    described: set[str]
    acting: bool
    final: bool
    takes_id: bool
    takes_place: bool

    @classmethod
    def of(cls, tool: Tool) -> AgentTool:
        fn = tool.function
        parts = [p for p in ex.name_parts(fn.name) if p not in ex.STOP or p in _VERBS]
        verb = _verb(parts)
        props, required = schema_props(tool)
        keys = {ex.stem(p) for k in props for p in ex.name_parts(str(k))}
        desc = fn.description if isinstance(fn.description, str) else ""
        described = (ex.stems(desc) | keys) - {ex.stem(p) for p in parts}
        acting = verb in ACT_VERBS
        takes_id = any(k.lower().endswith("id") or k.lower() in ("key", "sku", "code") for k in required)
        takes_place = any(
            set(ex.name_parts(k)) & {"location", "city", "place", "town", "destination"} for k in required
        )
        return cls(tool, fn.name, parts, verb, described, acting, bool(_FINAL.match(fn.name)), takes_id, takes_place)

    def score(self, text: str, *, capped: bool = True) -> tuple[int, bool]:
        """How strongly ``text`` points at this tool, and whether it names the whole tool."""
        if self.name.lower() in text.lower():
            return 20, True
        expanded = _evidence(text)
        # "get_current_weather" is named by "weather": a bare reading verb says nothing about the tool.
        parts = [p for p in self.parts if p not in _SILENT] or self.parts
        score = 0
        hit = 0
        for part in parts:
            if ex.stem(part) in expanded or part in expanded:
                hit += 1
                score += 3 if part == self.verb else 2
        whole = bool(parts) and hit == len(parts)
        described = len(self.described & expanded)
        score += described + (3 if whole else 0)
        if self.takes_id and ex.ids(text):
            score += 1
            described += 1
        if self.takes_place and ex.places(text):
            score += 1
            described += 1
        if self.acting and not self.asked(text):
            return 0, False
        if capped and not whole and hit + described < 2:
            return min(score, 2), False  # one word of a longer name ("write" of write_file) is not enough
        return score, whole

    def asked(self, text: str) -> bool:
        """Whether ``text`` asks for this tool's act (an acting tool is never used on a guess)."""
        if self.name.lower() in text.lower():
            return True
        words = {w.lower() for w in re.findall(r"[A-Za-z-]+", text)} | ex.stems(text)
        return bool(self.verb and set(ACT_VERBS.get(self.verb, (self.verb,))) & words)


def fits(score: int, whole: bool) -> bool:
    """Whether a score is enough to use a tool: its whole name, or its verb and another word."""
    return whole or score >= 3
