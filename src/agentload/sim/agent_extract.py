"""Reading values out of text the way a careful model does: IDs, names, places, numbers, dates, files, queries.

Every function here is pure: text in, candidate values out, best first. The agent model (``agentmodel``) decides
which parameter gets which candidate.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

_STOP_WORDS = (
    "a an the and or of to in on at for from by with about into is are was be it its this that these those my me i "
    "you your we our us they them what which who when where how do does did can could would should will please tell "
    "give get set current some any all one each then than also just use using given value values return returns "
    "tool function call data info information say so as if not no yes up out there here now i'm i'll i'd let"
)
STOP = frozenset(_STOP_WORDS.split())
WORD = re.compile(r"[a-z][a-z0-9'-]*")
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
URL = re.compile(r"https?://[^\s\"'<>)\]]+")
FILE = re.compile(
    r"(?<![\w@/.-])((?:[\w.-]+/)*[\w-]+\.(?:md|txt|py|json|csv|toml|yaml|yml|log|js|ts|html|rs|go|pdf|xlsx|docx|ini|"
    r"cfg|sql|xml|sh))(?![\w-])"
)
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
CLOCK = re.compile(r"\b\d{1,2}:\d{2}(?:\s?[ap]m)?\b", re.I)
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# An ID carries a digit: E-1093, ZX-4471-Q, K-220, TP1234, #5521, k07-3fa2b1, a UUID, or a bare number of 3+ digits.
_ID = re.compile(
    rf"(?<![\w@./+-])(#?(?:{_UUID}|[A-Za-z]{{1,6}}-?\d[A-Za-z0-9]*(?:-[A-Za-z0-9]+)*|"
    rf"[A-Za-z]{{1,6}}(?:-[A-Za-z0-9]+)+|\d{{3,}}(?:-[A-Za-z0-9]+)*))(?![\w@]|-\w)"
)
_PHONE = re.compile(r"\+\d[\d ()-]{6,}\d")
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)?(?![\w])")
QUOTED = re.compile(r"\"([^\"\n]{1,200})\"|(?<![\w])'([^'\n]{1,200})'(?![\w])|“([^”\n]{1,200})”|‘([^’\n]{1,200})’")
_ARITH = re.compile(r"(?<![\w/.-])[-(]*\d+(?:\.\d+)?\)*(?:\s*(?:\*\*|[-+*/x×÷^%])\s*[-(]*\d+(?:\.\d+)?\)*)+(?![\w/.-])")
CURRENCY = re.compile(r"\b(USD|EUR|GBP|JPY|CHF|CAD|AUD|CNY|INR|BRL|SEK|NOK|DKK|PLN|MXN)\b")
_CURRENCY_WORDS = {
    "euro": "EUR",
    "euros": "EUR",
    "dollar": "USD",
    "dollars": "USD",
    "pound": "GBP",
    "pounds": "GBP",
    "yen": "JPY",
    "franc": "CHF",
    "francs": "CHF",
}
# Capitalised words that begin no name: sentence openers, days, months, units, connectors.
_NOT_NAME_WORDS = (
    "I The A An My Our Your Please Then And Or But What Which Who Where When How Why Is Are Can Could Would Should "
    "Will Do Does Did Call Use Find Search Look Get Read Write Send Tell Give Show List Check Compute Calculate Add "
    "Remove Reply Return Summarise Summarize Start Record Book Move Text Fetch Include Compare Convert Translate "
    "Schedule Open Save Create Delete Update Make Let Also Thanks Thank Hi Hello If Now Today Tomorrow Yesterday "
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July August "
    "September October November December Celsius Fahrenheit JSON AND OR THEN NOT ID IDs No Yes It This That These "
    "Those There Here Each Every All Some Any Both Either First Next Last Only Just SYSTEM NOTE"
)
_NOT_NAME = frozenset(_NOT_NAME_WORDS.split())
_NAME_TOKEN = r"(?:[A-Z][\w'.&-]*|[A-Z]+\d[\w-]*|\d+[A-Z][\w-]*)"
_LINK = r"(?:de|do|da|del|la|le|van|von|of|y)"
_NAME_RUN = re.compile(rf"{_NAME_TOKEN}(?:[ ](?:{_LINK}[ ])?{_NAME_TOKEN})*")
LANGUAGES = ("english", "french", "german", "spanish", "portuguese", "italian", "dutch", "japanese", "chinese")
_UNITS = {
    "km": ("km", "kilometre", "kilometer", "kilometres", "kilometers"),
    "mi": ("mi", "mile", "miles"),
    "m": ("m", "metre", "meter", "metres", "meters"),
    "kg": ("kg", "kilo", "kilos", "kilogram", "kilograms"),
    "g": ("g", "gram", "grams"),
    "lb": ("lb", "lbs", "pound", "pounds"),
    "minutes": ("min", "mins", "minute", "minutes"),
    "hours": ("h", "hr", "hrs", "hour", "hours"),
    "days": ("day", "days"),
    "seconds": ("s", "sec", "secs", "second", "seconds"),
    "percent": ("%", "percent", "pct"),
    "c": ("°c", "c", "celsius"),
    "f": ("°f", "f", "fahrenheit"),
}


def stem(word: str) -> str:
    for suffix in ("ing", "ies", "es", "ed", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def stems(text: str) -> set[str]:
    return {stem(w.removesuffix("'s")) for w in WORD.findall(text.lower()) if w not in STOP}


def name_parts(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [p for p in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if p]


def quoted(text: str) -> list[str]:
    return [next(g for g in m.groups() if g).strip() for m in QUOTED.finditer(text)]


def files(text: str) -> list[str]:
    return list(dict.fromkeys(FILE.findall(text)))


def write_targets(text: str) -> list[str]:
    """Files the text says to write to ("save a summary to notes.md"): outputs, not files to read."""
    return list(dict.fromkeys(re.findall(r"\b(?:to|into|as)\s+(?:the\s+)?(?:file\s+)?" + FILE.pattern, text)))


def urls(text: str) -> list[str]:
    return list(dict.fromkeys(u.rstrip(".,;:!?") for u in URL.findall(text)))


def ids(text: str, anchors: tuple[str, ...] = (), foreign: frozenset[str] = frozenset()) -> list[str]:
    """ID-shaped tokens, those right after an anchor noun ("employee E-1093", "place ID 12345") first; none right
    after a ``foreign`` noun (an "order 3f2b…" is no tracking number)."""
    text = URL.sub(" ", EMAIL.sub(" ", _PHONE.sub(" ", text)))
    skip = set(DATE.findall(text))
    found: list[tuple[int, int, str]] = []
    for m in _ID.finditer(text):
        token = m.group(1).rstrip(".-")
        if token in skip or not any(c.isdigit() for c in token) or DATE.fullmatch(token):
            continue
        if re.fullmatch(r"\d+", token.lstrip("#")) and _unit_after(text, m.end()):
            continue  # "250 USD", "20 minutes": an amount, not an ID
        before = text[max(0, m.start() - 40) : m.start()].lower()
        named = re.search(r"([a-z]+)(?:\s+(?:id|number|no\.?|#))?[\s:#]*$", before)
        if named and named.group(1) in foreign:
            continue
        anchored = bool(anchors) and re.search(
            r"(?:\b(?:" + "|".join(re.escape(a) for a in anchors) + r")s?|\bids?|\bnumber|\bno\.?|#|\bcode|\bkey)"
            r"[\s:#]*(?:is\s+|of\s+|=\s*)?$",
            before,
        )
        letters = any(c.isalpha() for c in token)
        found.append((0 if anchored else 1 if letters else 2, m.start(), token))
    return list(dict.fromkeys(t for _, _, t in sorted(found)))


def _unit_after(text: str, end: int) -> bool:
    after = text[end : end + 14].lower()
    return bool(re.match(r"\s*(?:%|°|[a-z]+)", after)) and bool(
        re.match(r"\s*(?:%|°|usd|eur|gbp|jpy|chf|euros?|dollars?|" + "|".join(sum(_UNITS.values(), ())) + r")\b", after)
    )


def names(text: str, anchors: tuple[str, ...] = ()) -> list[str]:
    """Proper names: quoted ones, then capitalised runs next to an anchor noun ("the Aurora room", "our Porto
    branch"), then any capitalised run that does not open a sentence."""
    out: list[tuple[int, int, str]] = [(0, i, q) for i, q in enumerate(quoted(text)) if len(q) < 80]
    for m in _NAME_RUN.finditer(text):
        run = _trim_name(m.group(0))
        if not run:
            continue
        start = m.start() + m.group(0).find(run)
        before = text[:start].rstrip()
        after = text[start + len(run) :].lower()
        rank = 3
        if anchors and (
            re.match(r"\s+(?:" + "|".join(re.escape(a) for a in anchors) + r")s?\b", after)
            or re.search(
                r"\b(?:" + "|".join(re.escape(a) for a in anchors) + r")s?\s*(?:called|named)?$", before.lower()
            )
        ):
            rank = 1
        elif re.search(r"\b(?:in|for|at|near|from|to|of|our|my|the|called|named)$", before, re.I):
            rank = 2
        elif not before or before[-1] in ".?!:\n":
            continue  # a sentence's first word is capitalised because it comes first
        out.append((rank, start, run))
    return list(dict.fromkeys(v for _, _, v in sorted(out)))


def _trim_name(run: str) -> str:
    words = run.split()
    while words and (words[0] in _NOT_NAME or words[0].rstrip(".,") in _NOT_NAME):
        words.pop(0)
    kept: list[str] = []
    for w in words:
        if w in _NOT_NAME or (w.isupper() and len(w) > 3 and not any(c.isdigit() for c in w)):
            break
        kept.append(w)
    while kept and kept[-1].lower() in ("de", "do", "da", "del", "la", "le", "van", "von", "of", "y"):
        kept.pop()
    return " ".join(kept).strip(" .,'")


def places(text: str) -> list[str]:
    """Place names: after "in"/"for"/"at"/"near"/…, a trailing ", City" of a place, and "X and Y" pairs."""
    out: list[tuple[int, int, str]] = []
    for m in re.finditer(r"\b(in|for|at|near|to|from|of|around)\s+(" + _NAME_RUN.pattern + ")", text):
        first = _trim_name(m.group(2))
        if not first:
            continue
        rank = 0 if m.group(1) in ("in", "for", "at") else 1
        out.append((rank, m.start(2), first))
        tail = text[m.start(2) + len(first) :]
        more = re.match(r",\s*(" + _NAME_RUN.pattern + ")", tail)
        if more and _trim_name(more.group(1)):
            out.append((0, m.start(2) + len(first), _trim_name(more.group(1))))
        pair = re.match(r",?\s+(?:and|or|vs\.?|versus)\s+(" + _NAME_RUN.pattern + ")", tail)
        if pair and _trim_name(pair.group(1)):
            out.append((rank, m.start(2) + len(first) + 1, _trim_name(pair.group(1))))
    return list(dict.fromkeys(v for _, _, v in sorted(out, key=lambda r: (r[1], r[0]))))


def currencies(text: str) -> list[str]:
    """Currency codes in the order the text names them ("250 USD to EUR", "in euros")."""
    found = [(m.start(), m.group(1)) for m in CURRENCY.finditer(text)]
    for word, code in _CURRENCY_WORDS.items():
        found += [(m.start(), code) for m in re.finditer(rf"\b{word}\b", text, re.I)]
    found += [(m.start(), {"$": "USD", "€": "EUR", "£": "GBP"}[m.group(0)]) for m in re.finditer(r"[$€£]", text)]
    return list(dict.fromkeys(code for _, code in sorted(found)))


def numbers(text: str) -> list[float]:
    """Numbers the text states on their own (not inside an ID, a date, a time, a phone number or an expression)."""
    text = _ARITH.sub(" ", CLOCK.sub(" ", DATE.sub(" ", _PHONE.sub(" ", text))))
    text = " ".join(t for t in text.split() if not (re.search(r"[A-Za-z]", t) and re.search(r"\d", t)))
    return [float(n.replace(",", "")) for n in NUMBER.findall(text)]


def number_with_unit(text: str, unit_words: set[str]) -> float | None:
    """The number a unit the parameter names follows ("12 km" for ``distance_km``, "45 minutes" for
    ``duration_minutes``)."""
    for unit, spellings in _UNITS.items():
        if unit in unit_words or unit_words & set(spellings):
            m = re.search(r"(-?\d+(?:\.\d+)?)\s*(?:" + "|".join(re.escape(s) for s in spellings) + r")\b", text, re.I)
            if m:
                return float(m.group(1))
    return None


def unit_of(word: str) -> str | None:
    low = word.lower()
    return next((unit for unit, spellings in _UNITS.items() if low in spellings), None)


def conversion(text: str) -> tuple[str, str] | None:
    """The units of a conversion the text asks for: a quantity in one unit and another unit it should be given in
    ("42 km to miles" → ("km", "mi")); a lone "in 20 minutes" is a quantity, not a conversion."""
    for m in re.finditer(r"\d\s*(°?[a-z]+)\b[^.?!]*?\b(?:to|into|in)\s+(°?[a-z]+)\b", text, re.I):
        source, target = unit_of(m.group(1)), unit_of(m.group(2))
        if source and target and source != target:
            return source, target
    return None


def amount(text: str) -> float | None:
    m = re.search(r"[$€£]\s?(\d[\d,]*(?:\.\d+)?)|(\d[\d,]*(?:\.\d+)?)\s*(?:[A-Z]{3}\b|euros?|dollars?|pounds?)", text)
    if not m:
        return None
    return float((m.group(1) or m.group(2)).replace(",", ""))


_WORD_OPS = [
    (r"\s+(?:multiplied by|times)\s+", " * "),
    (r"\s+divided by\s+", " / "),
    (r"\s+plus\s+", " + "),
    (r"\s+minus\s+", " - "),
    (r"\s+to the power of\s+", " ** "),
]


def expression(text: str) -> str | None:
    """An arithmetic expression the text states, symbols or words ("1234 * 5678", "12 times 7")."""
    text = CLOCK.sub(" ", DATE.sub(" ", _PHONE.sub(" ", text)))
    for pattern, op in _WORD_OPS:
        text = re.sub(r"(?<=\d)" + pattern + r"(?=[-(\d])", op, text, flags=re.I)
    found = _ARITH.search(text.replace(",", ""))
    if found is None:
        return None
    expr = found.group(0).replace("×", "*").replace("÷", "/").replace("^", "**")
    return re.sub(r"(?<=\d)\s*x\s*(?=[\d(])", " * ", expr).strip()


_OPS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expr: str) -> float | None:
    """The value of an arithmetic expression, or None (no names, no calls, bounded powers)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("power too large")
            return float(_OPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.operand)))
        raise ValueError("not arithmetic")

    try:
        return walk(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def fmt_number(value: float) -> str:
    if not math.isfinite(value):  # a tool may return Infinity or NaN (JSON allows neither; Python's parser does)
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


_SEARCH_VERB = re.compile(
    r"\b(?:search(?:\s+(?:the\s+|our\s+|my\s+)?[\w-]+)?\s+for|search|find(?:\s+me)?|look\s+up|look\s+for|locate|"
    r"query(?:\s+for)?|research|google|browse\s+for)\s+(.+)",
    re.I,
)
_META = re.compile(
    r"\b(?:call|use|invoke)\s+(?:the\s+)?[\w.-]+(?:\s+tool)?(?:\s+(?:exactly\s+)?(?:once|twice|one time))?"
    r"(?:\s+(?:to|and))?\s+",
    re.I,
)


# Where the object of a search verb ends: the next step of the request.
_QUERY_END = r"\s+(?:and\s+)?then\b|;|\s+and\s+(?:tell|give|show|summari[sz]e|report|reply|save|write|send)\b"


def query(text: str) -> str | None:
    """What a search is for: the object of the request's search verb ("find Italian restaurants near Union Square,
    San Francisco" → "Italian restaurants near Union Square, San Francisco")."""
    for sentence in sentences(text):
        plain = _META.sub("", sentence)
        m = _SEARCH_VERB.search(plain)
        if not m:
            continue
        obj = m.group(1)
        obj = re.split(_QUERY_END, obj, maxsplit=1, flags=re.I)[0]
        obj = re.sub(
            r"^(?:me\s+|us\s+|the\s+|some\s+|any\s+|all\s+|information\s+(?:on|about)\s+)+", "", obj, flags=re.I
        )
        obj = re.sub(r"\s+(?:for me|please|for us|in one go|right now)$", "", obj.strip(" .?!"), flags=re.I)
        if obj:
            return obj.strip(" .?!,")
    return None


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.?!])\s+(?=[A-Z\"'(])|\n+", text) if s.strip()]


@dataclass(frozen=True)
class Clause:
    """A piece of the request and its place in the order of work: clauses of one group may run together, a later
    group waits for the earlier ones ("… then …")."""

    text: str
    group: int


# How a sentence that asks for something opens: a question word, an imperative verb, a polite or ordering word.
_ASKING = re.compile(
    r"(?:please\s+|now\s+|also\s+|and\s+|so\s+)?(?:what|which|who|whom|whose|when|where|why|how|is|are|do|does|"
    r"did|can|could|would|will|should|tell|give|show|list|find|search|look|get|read|write|send|call|use|check|"
    r"compute|calculate|convert|add|remove|delete|save|create|make|book|schedule|reply|respond|answer|return|"
    r"summari[sz]e|compare|translate|open|fetch|start|record|move|text|email|update|set|include|combine|review|"
    r"report|say|keep|follow|put|append|copy|go|run|try|then|after|next|finally|i|we|let)\b",
    re.I,
)


def clauses(request: str) -> list[Clause]:
    out: list[Clause] = []
    group = 0
    for sentence in sentences(request):
        parts = re.split(r"(,?\s+(?:and\s+)?then\b,?\s*|;\s+|,\s+and\s+(?=(?:how|what|which|when|where|who|the|also)\b)"
                         r"|,?\s+after that\b,?\s*|,?\s+afterwards\b,?\s*)", sentence, flags=re.I)  # fmt: skip
        starts_later = bool(re.match(r"(?:then|after that|afterwards|next|finally)\b", sentence, re.I))
        if starts_later and out:
            group += 1
        # A statement that hands over files ("Files from the tasks this one depends on: from/draft/notes.md") is an
        # input to the whole request, not a later step: reading it comes first.
        at = 0 if out and not _ASKING.match(sentence) and (files(sentence) or urls(sentence)) else group
        for i, part in enumerate(parts):
            if i % 2 == 1:
                if re.search(r"then|after", part, re.I):
                    group += 1
                    at = group
                continue
            if part.strip(" ,."):
                out.append(Clause(part.strip(), at))
    return out or [Clause(request, 0)]


_LANG_WORDS = {
    "english": {"the", "is", "and", "of", "to", "what", "with", "my", "please", "for", "how", "in", "this", "me"},
    "spanish": {"el", "la", "los", "las", "es", "y", "que", "de", "por", "para", "una", "un", "con", "qué", "mi",
                "cuál", "cómo", "está", "del", "muy", "pero"},
    "portuguese": {"o", "os", "as", "é", "e", "que", "de", "do", "da", "para", "uma", "um", "com", "qual", "meu",
                   "minha", "não", "está", "em", "no", "na"},
    "french": {"le", "la", "les", "est", "et", "que", "de", "du", "pour", "une", "un", "avec", "quel", "mon", "ma",
               "pas", "dans", "sur", "des"},
    "german": {"der", "die", "das", "ist", "und", "zu", "von", "für", "ein", "eine", "mit", "wie", "mein", "nicht",
               "auf", "den", "dem"},
}  # fmt: skip


# A foreign language is named only on evidence: this many different function words of it, in a text this long.
_LANG_DISTINCT = 3
_LANG_MIN_WORDS = 5


def language(text: str) -> str:
    """The language most of the text's function words belong to; English unless another shows several different
    function words of its own in a text of some length (a UUID's lone "e" or "a" is no Portuguese)."""
    words = re.findall(r"(?<![\w-])[^\W\d_]+(?![\w-])", text.lower())
    if len(words) < _LANG_MIN_WORDS:
        return "english"
    counts = {lang: sum(w in vocab for w in words) for lang, vocab in _LANG_WORDS.items()}
    distinct = {lang: len(set(words) & vocab) for lang, vocab in _LANG_WORDS.items()}
    best = max((lang for lang in counts if lang != "english"), key=lambda lang: (counts[lang], distinct[lang]))
    return best if distinct[best] >= _LANG_DISTINCT and counts[best] > counts["english"] else "english"
