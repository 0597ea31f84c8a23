"""Server-sent events, parsed by us: bytes in, ``data:`` payloads out.

Only what OpenAI-compatible servers send is handled: events separated by a blank line, ``data:`` fields (several
in one event are joined with newlines, per the SSE spec), comments (``:``) and other fields ignored, ``\\r\\n``
accepted. The parser is incremental: feed it whatever the socket delivered and it returns the complete events.
An event that never ends (a server streaming bytes without a blank line) is refused past ``max_event_bytes``
rather than buffered until memory runs out.
"""

from __future__ import annotations

# An OpenAI chunk is a few hundred bytes; even a whole tool call's arguments in one event stay far below this.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSETooLong(ValueError):
    """An event grew past the parser's limit without ending."""


class SSEParser:
    __slots__ = ("_buf", "_max")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._max = max_event_bytes

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
        return out

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (a stream that ends here was cut short)."""
        return self._buf
