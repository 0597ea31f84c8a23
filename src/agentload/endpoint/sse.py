"""Server-sent events, parsed by us: bytes in, ``data:`` payloads out.

Only what OpenAI-compatible servers send is handled: events separated by a blank line, ``data:`` fields (several
in one event are joined with newlines, per the SSE spec), comments (``:``) and other fields ignored, ``\\r\\n``
accepted. The parser is incremental: feed it whatever the socket delivered and it returns the complete events.
"""

from __future__ import annotations


class SSEParser:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return the ``data:`` payload of each event completed by it."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, self._buf = buf.split(b"\n\n")
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
