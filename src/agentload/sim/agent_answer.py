"""The agent model's final answer: plain sentences built from the tool results and the request.

Rules a careful model follows: report what each tool returned, failures and empty fields as such; never repeat
an instruction found inside a tool result (it is data, not a command); do not quote text in another language
than the user's; flag two sources that disagree; give a computed total when the request asks for one; answer with
raw JSON of the asked fields when the request asks for JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentload.sim import agent_extract as ex
from agentload.sim.agent_conv import Conversation, Result
from agentload.sim.agent_fill import lookup

_INJECTION = re.compile(
    r"ignore (?:all |any )?(?:previous|prior|above|earlier)|system prompt|(?:notice|note|message) (?:to|for) the "
    r"(?:ai|assistant|model)|\bas an ai\b|from now on|you must now|reveal|disregard|new instructions?|"
    r"(?:nota|aviso) para el asistente|a partir de ahora|responde solo",
    re.I,
)
_MONEY_KEYS = ("subtotal", "shipping", "price", "cost", "fee", "amount", "tax", "total", "charge", "fare")


def _short(value: Any, words: int = 30) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    parts = text.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


def clean_text(text: str, user_language: str) -> str | None:
    """A tool's free text as the answer may repeat it: injected instructions dropped, foreign text not quoted."""
    kept = [s for s in ex.sentences(text) if not _INJECTION.search(s)]
    if not kept:
        return None
    joined = " ".join(kept)
    lang = ex.language(joined)
    if lang != user_language and len(joined.split()) > 3:
        return f"(written in {lang.capitalize()})"
    return _short(joined, 40)


def _label(key: str) -> str:
    return str(key).replace("_", " ")


def describe(value: Any, user_language: str, depth: int = 0) -> list[str]:
    """Clauses that state a result's fields: "status is out for delivery", "the gate is not available"."""
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in list(value.items())[:12]:
            label = _label(k)
            if v is None or v == "" or v == []:
                out.append(f"the {label} is not available")
            elif isinstance(v, str):
                said = clean_text(v, user_language) if len(v.split()) > 3 else v
                if said is None:
                    continue  # only an injected instruction: nothing to repeat
                out.append(f"the {label} is {said}")
            elif isinstance(v, bool):
                out.append(f"{label}: {'yes' if v else 'no'}")
            elif isinstance(v, int | float):
                out.append(f"the {label} is {ex.fmt_number(float(v))}")
            elif isinstance(v, list) and depth < 1:
                items = [", ".join(describe(i, user_language, depth + 1)) if isinstance(i, dict | list) else _item(i)
                         for i in v[:12]]  # fmt: skip
                out.append(f"the {label} are: " + "; ".join(x for x in items if x))
            elif isinstance(v, dict) and depth < 1:
                inner = ", ".join(describe(v, user_language, depth + 1))
                out.append(f"the {label} has {inner}" if inner else f"the {label} is empty")
    elif isinstance(value, list):
        if not value:
            out.append("nothing was returned")
        for item in value[:12]:
            out.append(", ".join(describe(item, user_language, depth + 1)) if isinstance(item, dict) else _item(item))
    elif isinstance(value, str):
        said = clean_text(value, user_language)
        if said:
            out.append(said)
    elif value is not None:
        out.append(_item(value))
    return out


def _item(value: Any) -> str:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return ex.fmt_number(float(value))
    return _short(value, 20)


def _error_text(r: Result) -> str:
    v = r.value
    if isinstance(v, dict):
        err = v.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or json.dumps(err))
        if isinstance(err, str):
            return err
        return str(v.get("message") or v.get("detail") or json.dumps(v))
    return _short(v, 25)


# A value longer than this is named by its ends in an answer: a careful model does not repeat a 3,000-character
# path back to the user, and the error after it must still fit the reply.
QUOTED_VALUE_CHARS = 60


def _named(value: str) -> str:
    if len(value) <= QUOTED_VALUE_CHARS:
        return value
    return f"{value[:24]}…{value[-24:]} ({len(value):,} characters)"


def _subject(r: Result) -> str:
    vals = [_named(str(v)) for v in r.args.values() if isinstance(v, str | int | float) and not isinstance(v, bool)]
    return f" for {', '.join(vals[:2])}" if vals else ""


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".?!" else text + "."


def _failure(r: Result) -> str:
    detail = _error_text(r)
    if re.search(r"not found|404|no such|unknown|does not exist", detail, re.I):
        return _sentence(f"I could not find that{_subject(r)}: the {r.name} tool says {detail}")
    if re.search(r"time ?out|timed out|unavailable|503|504", detail, re.I):
        return _sentence(f"The {r.name} call failed{_subject(r)} ({detail}), so I have no results from it; "
                         "you may want to try again later")  # fmt: skip
    # The error first: it is what the user needs, and a reply cut at its token cap still carries it.
    return _sentence(f"The {r.name} call failed: {detail} (that was{_subject(r)})")


def _json_answer(conv: Conversation) -> str | None:
    """Raw JSON of the fields the request names, when it asks for JSON."""
    req = conv.request
    if not re.search(r"\bjson\b", req, re.I) or not re.search(
        r"\b(?:reply|respond|answer|return|output|give|format|only|raw|object)\b", req, re.I
    ):
        return None
    template = re.search(r"\{[^{}]*\}", req)
    keys = re.findall(r"[\"']([\w-]+)[\"']\s*:", template.group(0)) if template else []
    if not keys:
        after = req[re.search(r"\bjson\b", req, re.I).start() :]  # type: ignore[union-attr]
        keys = [q for q in ex.quoted(after) if re.fullmatch(r"[\w-]{1,40}", q)]
    out: dict[str, Any] = {}
    for key in keys:
        out[key] = _field(conv, key)
    if not keys:
        latest = conv.results[-1].value if conv.results else {}
        out = latest if isinstance(latest, dict) else {"answer": latest}
    return json.dumps(out, ensure_ascii=False)


def _field(conv: Conversation, key: str) -> Any:
    for r in reversed(conv.results):
        v = lookup(r.value, key.lower())
        if v is not None and not isinstance(v, dict | list):
            return v
    # "open_orders": how many of the listed orders are open
    words = key.lower().split("_")
    for r in reversed(conv.results):
        value = r.value
        for noun_i in range(len(words) - 1, -1, -1):
            noun = words[noun_i]
            items = value.get(noun) if isinstance(value, dict) else value if isinstance(value, list) else None
            if isinstance(items, list):
                wanted = [w for w in words if w not in (noun, "count", "number", "num", "of", "total")]
                if not wanted:
                    return len(items)
                return sum(
                    1
                    for i in items
                    if isinstance(i, dict) and any(str(v).lower() in wanted for v in i.values() if isinstance(v, str))
                )
    for r in reversed(conv.results):
        v = lookup(r.value, words[-1])
        if v is not None and not isinstance(v, dict | list):
            return v
    return None


def _total(conv: Conversation) -> str | None:
    """A combined figure when the request asks what something costs in all: amounts summed, a rate applied."""
    if not re.search(r"\b(?:total|cost|in all|altogether|combined|sum|overall|including|included)\b", conv.request,
                     re.I):  # fmt: skip
        return None
    amounts: list[float] = []
    rate: float | None = None
    base = ""
    quote = ""
    for r in conv.results:
        v = r.value
        if not isinstance(v, dict) or r.failed:
            continue
        if isinstance(v.get("rate"), int | float):
            rate = float(v["rate"])
            quote = str(v.get("quote") or v.get("to") or v.get("target") or "")
            continue
        for k, x in v.items():
            if isinstance(x, int | float) and not isinstance(x, bool) and any(m in str(k).lower() for m in _MONEY_KEYS):
                amounts.append(float(x))
                base = str(v.get("currency") or base)
    if len(amounts) < 2 and not (amounts and rate):
        return None
    total = sum(amounts)
    text = f"Together that is {total:.2f}{' ' + base if base else ''}"
    if rate is not None:
        text += f", which at a rate of {ex.fmt_number(rate)} comes to {total * rate:.2f}{' ' + quote if quote else ''}"
    return text + "."


def _conflict(conv: Conversation) -> str | None:
    """Two tools asked about the same thing that give different figures: said, not silently resolved."""
    by_args: dict[str, list[tuple[str, str, float]]] = {}
    for r in conv.results:
        v = r.value
        if not isinstance(v, dict) or r.failed:
            continue
        nums = [(str(k), float(x)) for k, x in v.items() if isinstance(x, int | float) and not isinstance(x, bool)]
        if len(nums) == 1:
            by_args.setdefault(json.dumps(r.args, sort_keys=True), []).append((r.name, nums[0][0], nums[0][1]))
    for found in by_args.values():
        if len({n for n, _, _ in found}) > 1 and len({x for _, _, x in found}) > 1:
            said = ", but ".join(f"{name} gives {_label(k)} {ex.fmt_number(x)}" for name, k, x in found)
            return f"The sources disagree: {said}. The figures do not match, so one of them needs checking."
    return None


def _actions(conv: Conversation, acting: set[str]) -> str | None:
    """What was done, in one sentence, in order: "I added a, b and c, then removed b"."""
    done: list[tuple[str, list[str]]] = []
    for r in conv.results:
        if r.name not in acting or r.failed:
            continue
        verb = ex.name_parts(r.name)
        word = next((p for p in verb if p in _PAST), None)
        if word is None:
            continue
        vals = [str(v) for v in r.args.values() if isinstance(v, str) and len(v) < 60]
        if done and done[-1][0] == word:
            done[-1][1].extend(vals)
        else:
            done.append((word, vals))
    if not done:
        return None
    parts = [f"{_PAST[w]} {_join(vals)}".strip() for w, vals in done]
    return _sentence("I " + ", then ".join(parts))


_PAST = {"add": "added", "remove": "removed", "delete": "deleted", "create": "created", "update": "updated",
         "send": "sent", "write": "wrote", "save": "saved", "book": "booked", "log": "logged", "set": "set",
         "cancel": "cancelled", "move": "moved", "rename": "renamed", "post": "posted", "schedule": "scheduled",
         "record": "recorded", "close": "closed", "submit": "submitted", "upload": "uploaded", "transfer":
         "transferred", "insert": "inserted", "append": "appended", "register": "registered"}  # fmt: skip


def _records(value: Any) -> list[dict[str, Any]]:
    """A result that is a list of records: a JSON array of objects, or JSON lines (one object a line)."""
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict)]
    if not isinstance(value, str) or value.count("\n") < 2:
        return []
    out: list[dict[str, Any]] = []
    for line in value.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


# A request word found as a field's value in at most this many of a long list's records picks them out.
PICKED_RECORDS = 3


def _picked(request: str, r: Result) -> str | None:
    """The records of a long list the request singles out by a value ("which SKU is marked as recalled"): a
    careful model reads the whole list for them instead of repeating its first lines."""
    records = _records(r.value)
    if len(records) <= PICKED_RECORDS * 2:
        return None
    words = {w for w in re.findall(r"[a-z][a-z-]{3,}", request.lower())}
    for word in sorted(words):
        hits = [(k, rec) for rec in records for k, v in rec.items() if isinstance(v, str) and v.lower() == word]
        if 0 < len(hits) <= PICKED_RECORDS:
            shown = "; ".join(", ".join(f"{_label(k)} {_item(v)}" for k, v in rec.items()) for _, rec in hits)
            field = _label(hits[0][0])
            return _sentence(f"Of the {len(records):,} records from {r.name}, the {field} is {word} for: {shown}")
    return None


def _join(vals: list[str]) -> str:
    vals = list(dict.fromkeys(vals))
    if len(vals) <= 1:
        return "".join(vals)
    return ", ".join(vals[:-1]) + " and " + vals[-1]


def compose(conv: Conversation, acting: set[str]) -> str:
    """The final answer from the conversation's results."""
    as_json = _json_answer(conv)
    if as_json is not None:
        return as_json
    lang = ex.language(conv.request)
    lines: list[str] = []
    done = _actions(conv, acting)
    if done:
        lines.append(done)
    # A call retried after an error: only its later result counts.
    latest: dict[str, Result] = {}
    for r in conv.results:
        latest[r.name + json.dumps(r.args, sort_keys=True)] = r
    retried = {r.name for r in conv.results if not r.failed}
    for r in latest.values():
        if r.failed and r.name in retried:
            continue
        if r.failed:
            lines.append(_failure(r))
            continue
        if r.name in acting and done:
            continue
        if r.name in acting:
            lines.append(_sentence(f"Done: {r.name} succeeded{_subject(r)}"))
            continue
        picked = _picked(conv.request, r)
        if picked:
            lines.append(picked)
            continue
        said = describe(r.value, lang)
        if isinstance(r.value, dict) and "result" in r.value and len(r.value) <= 2:
            expr = r.args.get("expression")
            res = r.value["result"]
            if isinstance(res, int | float) and not isinstance(res, bool):
                lines.append(
                    _sentence(f"The result{' of ' + str(expr) if expr else ''} is {ex.fmt_number(float(res))}")
                )
                continue
        # "From read_file: for a.md, …": the tool that said it, then what it was asked about.
        subject = _subject(r).strip()
        lines.append(_sentence(f"From {r.name}: " + (f"{subject}, " if subject else "") + "; ".join(said)) if said else
                     _sentence(f"The {r.name} tool returned nothing{_subject(r)}"))  # fmt: skip
    total = _total(conv)
    for extra in (total or _conflict(conv),):
        if extra:
            lines.append(extra)
    return " ".join(x for x in lines if x)


def arithmetic(request: str) -> str | None:
    expr = ex.expression(request)
    if expr is None:
        return None
    value = ex.evaluate(expr)
    return None if value is None else f"{expr} = {ex.fmt_number(value)}."
