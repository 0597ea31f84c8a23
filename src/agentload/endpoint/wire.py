"""What a server sent, read at the boundary: SSE events out of the bytes, JSON out of the events and bodies, and
every field checked before anything uses it. One job — reading an untrusted server — so the client, the probe,
the monitor and the pool readers all read through here.

**Server-sent events, parsed by us** (``SSEParser``): bytes in, ``data:`` payloads out. Only what
OpenAI-compatible servers send is handled: events separated by a blank line, ``data:`` fields (several in one event
are joined with newlines, per the SSE spec), comments (``:``) and other fields ignored, ``\\r\\n`` accepted. The
parser is incremental: feed it whatever the socket delivered and it returns the complete events. An event that never
ends (a server streaming bytes without a blank line) is refused past ``max_event_bytes`` rather than buffered until
memory runs out.

**Fields read from a server's bodies, checked**. A server is untrusted input: one chunk with
``"choices": "oops"`` or ``"usage": [1, 2]`` used to escape the client as a TypeError and crash bench, run and probe.
Everything read from a body goes through here first:

* ``loads`` parses JSON with orjson, which refuses what Python's ``json`` lets through and later breaks a record
  or a result file: ``NaN`` / ``Infinity`` / numbers that overflow a double, lone surrogates (orjson could not
  write them back out), and nesting deeper than 1,024 (``json`` raises RecursionError there, outside every
  ``except ValueError``).
* ``Usage`` is the usage object as a pydantic model: strict non-negative integers, cached within the prompt.
* ``MalformedField`` is what a reader raises for a field of the wrong type or out of range; the client turns it
  into a failed record (per-request failures are data), the pool readers into an ``EndpointError``.

The other way, ``dumps`` writes the JSON the client sends (a request body, a whole conversation every turn).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# -- server-sent events ------------------------------------------------------------------------------------------------
# An OpenAI chunk is a few hundred bytes; even a whole tool call's arguments in one event stay far below this.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSETooLong(ValueError):
    """An event grew past the parser's limit without ending."""


class SSEParser:
    __slots__ = ("_buf", "_max", "comments")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._max = max_event_bytes
        self.comments = 0  # events with no data line: comments (``: ping``) and empty keep-alives

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return the ``data:`` payload of each event completed by it."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, self._buf = buf.split(b"\n\n")
        if len(self._buf) > self._max:
            raise SSETooLong(f"an event longer than {self._max} bytes without an end")
        out: list[bytes] = []
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                out.append(event[6:])  # the common case: one data line
                continue
            lines = [ln for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(ln[6:] if ln.startswith(b"data: ") else ln[5:] for ln in lines))
            else:
                self.comments += 1
        return out

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (a stream that ends here was cut short)."""
        return self._buf


# -- fields ------------------------------------------------------------------------------------------------------------
# No request, pool or context is anywhere near a billion tokens; a larger figure is a broken server, and taking it
# would size arrays and pools from it (the 74.5 GiB allocation came from such a number).
MAX_TOKENS = 1_000_000_000


class MalformedField(ValueError):
    """A field a server sent has the wrong type or an impossible value."""


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON for a request body. orjson: an agent's body is its whole conversation, encoded every
    turn (a 370 KB one: 0.11 ms, the standard library's ``json`` 0.84 ms). What orjson refuses (an integer past 64
    bits, a type it does not know) goes through ``json`` as before, which raises TypeError for what it cannot write.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(value).encode()


def loads(body: bytes | str) -> Any:
    """The JSON value of ``body``; MalformedField for anything that is not strict, finite, shallow JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedField(f"not JSON ({exc})") from exc


def wrong(what: str, value: Any, expected: str) -> MalformedField:
    """The error for a field of the wrong type (returned for the caller to raise)."""
    return MalformedField(f"{what} is a {type(value).__name__}, not {expected}")


def text(value: Any, what: str) -> str | None:
    """A string field that may be absent (None); anything else is malformed."""
    if value is None or isinstance(value, str):
        return value
    raise wrong(what, value, "a string")


def mapping(value: Any, what: str) -> dict[str, Any] | None:
    """An object field that may be absent (None); anything else is malformed."""
    if value is None or isinstance(value, dict):
        return value
    raise wrong(what, value, "an object")


def sequence(value: Any, what: str) -> list[Any] | None:
    """An array field that may be absent (None); anything else is malformed."""
    if value is None or isinstance(value, list):
        return value
    raise wrong(what, value, "an array")


def index(value: Any, what: str, limit: int) -> int:
    """A small non-negative integer (a tool call's ``index``); bool and integral floats are not integers here."""
    if type(value) is not int or not 0 <= value < limit:
        raise MalformedField(f"{what} is {value!r}, not an integer in [0, {limit})")
    return value


_Tokens = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKENS)]


class CachedDetails(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    cached_tokens: _Tokens | None = None


class Usage(BaseModel):
    """OpenAI's usage object, the fields agentload reads (others are ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    prompt_tokens: _Tokens | None = None
    completion_tokens: _Tokens | None = None
    prompt_tokens_details: CachedDetails | None = None

    @property
    def cached_tokens(self) -> int | None:
        return None if self.prompt_tokens_details is None else self.prompt_tokens_details.cached_tokens

    @model_validator(mode="after")
    def _cached_within_prompt(self) -> Usage:
        cached = self.cached_tokens
        if cached is not None and self.prompt_tokens is not None and cached > self.prompt_tokens:
            raise ValueError(f"{cached} cached tokens of a {self.prompt_tokens}-token prompt")
        return self

    @classmethod
    def read(cls, value: Any) -> Usage:
        """Validate a usage object; MalformedField naming the first bad field."""
        if not isinstance(value, dict):
            raise MalformedField(f"usage is a {type(value).__name__}, not an object")
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "usage"
            raise MalformedField(f"usage {where}: {first['msg']}") from exc
