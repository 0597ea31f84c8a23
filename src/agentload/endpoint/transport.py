"""The transport seam: how the client moves bytes, behind one small interface (httpx's transport is the model).

``AiohttpTransport`` talks HTTP (its connection pool lifted from aiohttp's default of 100, which would otherwise
silently serialise a 256-agent fleet). ``MockTransport`` answers in process from a handler function, so tests
script a server — status, headers, chunks and the silences between them — without patching anything.
``BearerTransport`` wraps either and signs every request with an API key; ``SignedTransport`` also carries the
credentials of ``--url`` (userinfo, ``?api_key=``), so nothing else needs to hold them.

A response's body is read through ``chunks()``; an aiohttp response also has ``stream_to(on_data)``, which hands
each read to the client in the event loop's callback for it, stamped with when its bytes reached the socket (the
kernel's receive stamp on Linux), so a streamed chunk costs no task wake-up (the client takes it when a response
has it) and its timing does not depend on how many reads the loop handled before it.

Where a read's stamp comes from is decided once, at import (``stamp_path()`` says which and why): ``kernel``, the
kernel's receive stamp, read by standing in for asyncio's socket read (Linux x86-64/arm64); ``select``, when the
loop's select found the bytes, by wrapping the loop's selector; ``read``, the loop's clock when the read is handed
over, through public asyncio only. Each is taken only where asyncio's internals are what it expects; a connection
or loop that is not (uvloop, a proactor, another Python's transport) falls to the next. ``AGENTLOAD_STAMPS``, read
once at import, caps the choice: ``read`` forces the public path (no private attribute of asyncio replaced, wrapped
or called on a connection or loop), ``select`` rules out the kernel's, ``kernel`` or ``auto`` (or unset) takes the
best there is; any other value is ignored (``stamp_path()``'s reason says so).

A transport raises only ``TransportError`` subclasses; the client turns them into data on the record.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import platform
import selectors
import socket
import struct
import sys
import time
from asyncio import selector_events
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
from aiohttp.client_proto import ResponseHandler

try:  # POSIX only: elsewhere a read is stamped when it happens
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

from agentload.endpoint.redact import SECRETS, ServerUrl, UrlCredentials, split_url


class TransportError(Exception):
    """Raised by a transport; never leaves the endpoint package."""


class ConnectFailed(TransportError):
    """No response began: refused, unreachable, or reset before the status line."""


class ConnectTimedOut(ConnectFailed):
    """No connection in the time allowed: a host that drops what it is sent (a frozen server's full backlog), not
    one that refuses."""


class StreamBroken(TransportError):
    """The connection broke after the response began."""


class MalformedResponse(TransportError):
    """The server's bytes are not valid HTTP: a bad status line, header or chunk framing."""


def _malformed(exc: aiohttp.ClientResponseError) -> MalformedResponse:
    # aiohttp's parser messages span several lines (the offending bytes and a caret under them): keep the first.
    lines = [ln.strip() for ln in str(exc.message).splitlines() if ln.strip()]
    return MalformedResponse(" ".join(lines[:2]) if lines else type(exc).__name__)


def refused(exc: BaseException) -> bool:
    """True when a chain of causes ends in a refused connection (for a plainer message than aiohttp's)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or isinstance(getattr(seen, "os_error", None),
                                                                  ConnectionRefusedError):  # fmt: skip
            return True
        seen = seen.__cause__
    return False


class Response(Protocol):
    status: int
    headers: Mapping[str, str]

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises StreamBroken if the connection breaks."""
        ...

    async def read(self) -> bytes: ...

    def close(self) -> None: ...


class Transport(Protocol):
    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        """Send a request; return once the status line and headers have arrived."""
        ...

    async def aclose(self) -> None: ...


# Passed marks are dropped once this many floats of them pile up (amortised: one list shift per 256 reads).
MARKS_KEPT = 512


# FIONREAD's answer: a C int, the bytes a socket holds unread.
_FIONREAD_INT = struct.Struct("i")
_FIONREAD_BUF = bytes(_FIONREAD_INT.size)


# The kernel's receive stamp (Linux SO_TIMESTAMPNS: a recvmsg gets the CLOCK_REALTIME time the last packet it
# reads arrived, as a struct timespec). The option's number is 35 on the architectures below; others (alpha, mips,
# parisc, sparc) number it differently, and get the select stamp.
_SO_TIMESTAMPNS = 35
_KERNEL_STAMPS = sys.platform == "linux" and platform.machine() in {"x86_64", "aarch64"}
_TIMESPEC = struct.Struct("@qq")
_ANC_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if _KERNEL_STAMPS else 0
# The one read of asyncio's socket transport that _StampingHandler may stand in for (it mirrors that method), and
# the transport's parts the mirror uses.
_ASYNCIO_READ = getattr(getattr(selector_events, "_SelectorSocketTransport", None), "_read_ready__data_received", None)
_MIRRORED = ("_conn_lost", "max_size", "_fatal_error", "_read_ready__on_eof")


def _kernel_read(transport: asyncio.BaseTransport) -> bool:
    """Whether ``transport`` is asyncio's plain socket transport reading with its stock method, and its socket now
    stamps what it receives: then ``_StampingHandler`` can read it with ``recvmsg``."""
    if not _KERNEL_STAMPS or _ASYNCIO_READ is None:
        return False
    read = getattr(transport, "_read_ready_cb", None)
    sock = getattr(transport, "_sock", None)
    if getattr(read, "__func__", None) is not _ASYNCIO_READ or not isinstance(sock, socket.socket):
        return False
    if not all(hasattr(transport, name) for name in _MIRRORED):  # another Python's transport: keep its own read
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


# Where a read's arrival stamp comes from (the module docstring): the setting, and the choice made with it at import.
STAMPS_ENV = "AGENTLOAD_STAMPS"
_SETTINGS = ("auto", "kernel", "select", "read")
StampPath = Literal["kernel", "select", "read"]


class StampChoice(NamedTuple):
    path: StampPath
    reason: str


def _choose(setting: str | None) -> StampChoice:
    """The best stamping this platform and asyncio allow, at most ``setting`` (``AGENTLOAD_STAMPS``'s value)."""
    want = (setting or "auto").strip().lower() or "auto"
    if want not in _SETTINGS:
        # Read at import, where no command can turn an error into its one line: an unknown value is set aside, and
        # the choice's reason says so.
        best = _choose("auto")
        return StampChoice(best.path, f"{STAMPS_ENV}={setting!r} is not one of {', '.join(_SETTINGS)}: ignored; "
                                      f"{best.reason}")  # fmt: skip
    if want == "read":
        return StampChoice("read", f"{STAMPS_ENV}=read: stamped at the read, no private part of asyncio touched")
    if want == "select":
        why = f"{STAMPS_ENV}=select"
    elif not _KERNEL_STAMPS:
        why = "no SO_TIMESTAMPNS read here (Linux x86-64 and arm64 only)"
    elif _ASYNCIO_READ is None:
        why = "this asyncio has no _SelectorSocketTransport._read_ready__data_received to stand in for"
    else:
        return StampChoice("kernel", "the kernel's receive stamp (SO_TIMESTAMPNS), read with recvmsg")
    if fcntl is None or termios is None:
        return StampChoice("read", f"{why}; no FIONREAD to count a select's bytes: stamped at the read")
    return StampChoice("select", f"{why}: stamped when the loop's select found the bytes")


_STAMPS = _choose(os.environ.get(STAMPS_ENV))


def _loop_selector(loop: asyncio.AbstractEventLoop) -> selectors.BaseSelector | _SelectStamp | None:
    """The selector an asyncio selector event loop reads on every iteration; None for another loop (uvloop, a
    proactor). asyncio has no public hook on it: ``_selector`` is BaseSelectorEventLoop's own."""
    selector = getattr(loop, "_selector", None)
    if not isinstance(loop, asyncio.BaseEventLoop) or not isinstance(selector, selectors.BaseSelector | _SelectStamp):
        return None
    return selector


def stamp_path(loop: asyncio.AbstractEventLoop | None = None) -> StampChoice:
    """Where the arrival stamps of this process's responses come from, and why (decided once, at import); given a
    ``loop``, those of connections made on it: stamped at the read on a loop without asyncio's selector. (A socket
    that refuses the kernel's stamps still falls to ``select``, connection by connection.)"""
    choice = _STAMPS
    if loop is None or choice.path == "read" or _loop_selector(loop) is not None:
        return choice
    kind = f"{type(loop).__module__}.{type(loop).__qualname__}"
    return StampChoice("read", f"{kind} is not asyncio's selector event loop: stamped at the read")


class _SelectStamp:
    """An asyncio selector event loop's selector that notes when each ``select`` found the client's bytes.

    Every socket read of one loop iteration follows one ``select``. Right after it returns, the bytes readable on
    each watched client socket are counted (``FIONREAD``) and the loop time is taken (``t``): every byte counted
    had arrived by ``t``. A read of no more than those bytes is stamped ``t`` — free of the order the loop reads the
    sockets in and of the callbacks queued ahead of the reads (a burst over 256 streams, read and parsed one socket
    after another, spreads over milliseconds). A read that got more (bytes that came after the count) is stamped
    at the read, as before: a stamp is never earlier than its bytes. Anything else is the selector's.
    """

    def __init__(self, inner: selectors.BaseSelector, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._time = loop.time
        self.t = loop.time()
        self.watched: set[int] = set()  # the stamping handlers' sockets
        self.ready: dict[int, int] = {}  # watched socket → bytes readable at the last select, less those read since

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._inner.select(timeout)
        ready = self.ready
        ready.clear()
        if self.watched:
            for key, mask in events:
                if mask & selectors.EVENT_READ and key.fd in self.watched:
                    try:  # noqa: SIM105  (per ready socket per loop iteration: no context manager)
                        ready[key.fd] = _FIONREAD_INT.unpack(fcntl.ioctl(key.fd, termios.FIONREAD, _FIONREAD_BUF))[0]
                    except OSError:  # not countable: its reads are stamped when they happen
                        pass
        self.t = self._time()
        return events

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def _select_stamp(loop: asyncio.AbstractEventLoop) -> _SelectStamp | None:
    """The loop's stamping selector, installed on first use; None for a loop without one (uvloop, a proactor) or
    a platform without ``FIONREAD``."""
    if fcntl is None or termios is None:
        return None
    selector = _loop_selector(loop)
    if selector is None or isinstance(selector, _SelectStamp):
        return selector
    stamp = _SelectStamp(selector, loop)
    loop._selector = stamp  # type: ignore[attr-defined]
    return stamp


class _StampingHandler(ResponseHandler):
    """aiohttp's connection protocol, also noting when each read of a response body came off the socket.

    A vLLM engine step writes one chunk to every running stream at once; the event loop then runs every
    socket's ``data_received`` (a recv and aiohttp's C parser, a few µs each) before it wakes any of the tasks
    that parse the chunks (tens of µs each, JSON included). A stamp taken by the task would include every parse
    queued ahead of it — 10 ms at 256 streams — so the stamp is taken here, where the bytes arrive: when the loop's
    select found them (``_SelectStamp``), shared by every read of that iteration, so the reads' own order and cost
    are not in it either; a read with bytes that came after that select, or on a loop without a selector to wrap,
    is stamped with the clock at the read. On Linux the kernel's own stamp serves instead (``_read_stamped``): when
    the last packet a read takes reached the socket, so a burst read over milliseconds (a thousand streams, each
    read parsed as it is read) is stamped as it arrived, and a read that took bytes which came after the select is
    not stamped late either.
    ``marks`` holds, per read, the body bytes received so far and the loop time, flat (no tuple per read: a
    thousand streams' worth of small tuples is work for the garbage collector), a fresh list per response, so a
    pooled connection that moves on to the next request never rewrites a list a slow reader still holds.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.marks: list[float] = []
        self.marked: aiohttp.StreamReader | None = None
        self.push: _Push | None = None  # the body being handed to its reader as it arrives (``stream_to``)
        self._stamp: _SelectStamp | None = None
        self._fd = -1
        self._raw: Any = None  # asyncio's socket transport, when this reads it (``_read_stamped``)
        self._kernel_t: float | None = None  # the kernel's stamp of the read being handed to data_received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        path = _STAMPS.path  # decided at import (stamp_path): read per connection, never per read
        if path == "read":  # the public path: data_received stamps each read with the loop's clock
            return
        if path == "kernel" and _kernel_read(transport):
            # asyncio calls the transport's _read_ready_cb when the socket is readable; its stock read is replaced
            # by the same steps with recvmsg (the reader is registered only after connection_made, so no read
            # has happened yet).
            self._raw = transport
            transport._read_ready_cb = self._read_stamped  # type: ignore[attr-defined]
            return
        self._stamp = _select_stamp(self._loop)
        sock = transport.get_extra_info("socket")
        if self._stamp is not None and sock is not None:
            self._fd = sock.fileno()
            self._stamp.watched.add(self._fd)

    def _read_stamped(self) -> None:
        """asyncio's ``_SelectorSocketTransport._read_ready__data_received``, step for step, reading with
        ``recvmsg`` to get the kernel's stamp of the read (its age is taken off the loop's clock: the kernel's
        clock is the wall clock, the loop's the monotonic one)."""
        tr = self._raw
        if tr._conn_lost:
            return
        try:
            data, anc, _flags, _addr = tr._sock.recvmsg(tr.max_size, _ANC_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            tr._fatal_error(exc, "Fatal read error on socket transport")
            return
        if not data:
            tr._read_ready__on_eof()
            return
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) == _TIMESPEC.size:
                sec, ns = _TIMESPEC.unpack(raw)
                age_ns = time.time_ns() - (sec * 1_000_000_000 + ns)
                now = self._loop.time()
                # A wall clock stepped back between the packet and now would make the age negative: now, then.
                self._kernel_t = now - age_ns * 1e-9 if age_ns > 0 else now
        try:
            self.data_received(data)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            tr._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._stamp is not None and self._fd >= 0:  # before asyncio closes the socket (its number is reused)
            self._stamp.watched.discard(self._fd)
            self._fd = -1
        super().connection_lost(exc)
        if self.push is not None and self.push.take(self._loop.time()):  # what aiohttp made of the loss: end or error
            self.push = None

    def resume_reading(self, *args: Any, **kwargs: Any) -> None:
        # aiohttp's StreamReader calls this after every read that leaves its buffer low, paused or not, and each call
        # feeds the parser an empty read to go on with bytes it held at a pause: one more data_received a chunk
        # (~10 % of the client's CPU at 256 streams). Nothing was paused, so nothing is held and there is nothing to
        # resume. Without aiohttp's flags (another version) it is always passed on.
        if getattr(self, "_reading_paused", True) or getattr(self, "_buffer_paused", False):
            super().resume_reading(*args, **kwargs)

    def data_received(self, data: bytes) -> None:
        # The kernel's stamp of this read; else when the loop's select found these bytes (every read of this
        # iteration shares it); else the clock now.
        t = self._kernel_t
        self._kernel_t = None
        stamp = self._stamp
        if t is None and stamp is not None:
            left = stamp.ready.get(self._fd)
            if left is not None and len(data) <= left:
                stamp.ready[self._fd] = left - len(data)
                t = stamp.t
        if t is None:
            t = self._loop.time()
        super().data_received(data)
        push = self.push
        if push is not None:  # handed over now, in this read: no marks needed
            if push.take(t):
                self.push = None
            return
        payload = self._payload
        if payload is not None:
            if payload is not self.marked:
                self.marked = payload
                self.marks = []
            self.marks += (payload.total_bytes, t)


class _StampingConnector(aiohttp.TCPConnector):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        # aiohttp has no public hook for its connection protocol; _factory is what its own connect paths call.
        self._factory = functools.partial(_StampingHandler, loop=self._loop)  # type: ignore[assignment]


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        proto = resp.connection.protocol if resp.connection is not None else None
        # The marks of this response's body, when the connection is ours and already parsing this body.
        self._marks: list[float] | None = None
        if isinstance(proto, _StampingHandler) and proto.marked is resp.content:
            self._marks = proto.marks
        self._push: _Push | None = None  # while stream_to hands the body over from the connection

    async def chunks(self) -> AsyncIterator[bytes]:
        async for _, data in self.timed_chunks():
            yield data

    async def timed_chunks(self) -> AsyncIterator[tuple[float, bytes]]:
        """The body as it arrives, each piece with the loop time its bytes came off the socket.

        One piece per read in the common case; a read that gathered several socket reads (the reader fell
        behind) is cut at their boundaries, so each piece keeps its own arrival time.
        """
        loop = asyncio.get_running_loop()
        marks = self._marks
        pos = i = 0
        try:
            async for data in self._resp.content.iter_any():
                if marks is None:
                    yield loop.time(), data
                else:
                    pieces, i = _cut(data, pos, marks, i, loop.time)
                    for piece in pieces:
                        yield piece
                    if i >= MARKS_KEPT:
                        # Drop the marks already passed (the handler appends to this same list), so a long stream
                        # holds only the marks not yet read, not two floats per socket read since its start.
                        del marks[:i]
                        i = 0
                pos += len(data)
        except _BODY_ERRORS as exc:
            raise _body_error(exc) from exc

    async def stream_to(self, on_data: Callable[[float, bytes], bool]) -> None:
        """Hand the body to ``on_data(arrival time, bytes)`` read by read, until it ends or ``on_data`` returns
        False; raises as ``chunks`` does (StreamBroken, MalformedResponse).

        On our own connections each read is handed over in the event loop's callback for it, where its bytes came
        off the socket: the reading task is not woken per chunk (a future, a task step and the await chain up to
        the caller each time — a third of the client's CPU a chunk at 256 streams), only once, at the end. Use
        either this or ``chunks``/``timed_chunks`` on one response, not both.
        """
        proto = self._resp.connection.protocol if self._resp.connection is not None else None
        if not isinstance(proto, _StampingHandler) or self._marks is None or proto.marks is not self._marks:
            async for t, data in self.timed_chunks():  # not ours (or the body is not this connection's now)
                if not on_data(t, data):
                    return
            return
        loop = asyncio.get_running_loop()
        push = _Push(self._resp.content, on_data, loop.create_future())
        # What arrived before this call (with the headers, or while the caller was busy) is handed over now, cut at
        # its reads' marks; what comes later goes from the connection's callback.
        if not push.take(loop.time(), self._marks):
            self._push = proto.push = push
        await push.done

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except _BODY_ERRORS as exc:
            raise _body_error(exc) from exc

    def close(self) -> None:
        push, self._push = self._push, None
        if push is not None:  # a reader that gave up (its task cancelled): nothing more is handed to it
            proto = self._resp.connection.protocol if self._resp.connection is not None else None
            if isinstance(proto, _StampingHandler) and proto.push is push:
                proto.push = None
        self._resp.close()


# What reading a body can raise from aiohttp or the socket (``_body_error`` says each the seam's way): a broken
# stream, else a malformed response.
_BROKEN = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError)
_BODY_ERRORS = (*_BROKEN, aiohttp.ClientResponseError)


def _body_error(exc: BaseException) -> TransportError:
    """One of ``_BODY_ERRORS`` as the transport seam says it: a broken stream or a malformed response."""
    err: TransportError
    if isinstance(exc, aiohttp.ClientResponseError) and not isinstance(exc, _BROKEN):
        err = _malformed(exc)
    else:
        err = StreamBroken(str(exc) or type(exc).__name__)
    err.__cause__ = exc
    return err


def _cut(
    data: bytes, pos: int, marks: list[float], i: int, now: Callable[[], float]
) -> tuple[list[tuple[float, bytes]], int]:
    """One read of a body (``data``, starting ``pos`` bytes in) cut at the socket reads its marks name, each piece
    with its read's time; and the first mark not passed (from ``i``: ``marks[i]`` is a byte count, ``marks[i + 1]``
    its time)."""
    end = pos + len(data)
    n = len(marks)
    while i < n and marks[i] <= pos:
        i += 2
    pieces = []
    start = pos
    while i < n and marks[i] < end:
        cut = int(marks[i])
        pieces.append((marks[i + 1], data[start - pos : cut - pos]))
        start = cut
        i += 2
    # Every byte read was counted by a mark; the clock only if aiohttp fed bytes some other way.
    pieces.append((marks[i + 1] if i < n else now(), data[start - pos :] if start > pos else data))
    return pieces, i


class _Push:
    """A body handed to its reader as it arrives (``_AiohttpResponse.stream_to``): ``take`` runs in the connection's
    callback after each read and hands over what aiohttp's parser put in the body's buffer; ``done`` ends with the
    body, with the reader's refusal, or with the body's error."""

    __slots__ = ("busy", "content", "done", "on_data", "taken")

    def __init__(
        self, content: aiohttp.StreamReader, on_data: Callable[[float, bytes], bool], done: asyncio.Future[None]
    ) -> None:
        self.content = content
        self.on_data = on_data
        self.done = done
        self.busy = False
        self.taken = 0  # body bytes handed over so far (aiohttp's total_bytes counts those fed)

    def take(self, t: float, marks: list[float] | None = None) -> bool:
        """Hand over the buffered bytes (read at ``t``; cut at ``marks`` when they gathered several reads), in order;
        True once finished (``done`` settled: nothing more is wanted)."""
        if self.busy:
            # Called again from inside the hand-over: draining a buffer past aiohttp's high-water mark resumes the
            # paused connection, which parses any bytes it held and lands here. Those came after the ones being
            # handed over; the loop below takes them next, in order (aiohttp 3.14's parser holds none, but a
            # parser that does would otherwise have them overtake).
            return False
        done = self.done
        if done.done():  # the reader gave up (cancelled)
            return True
        content = self.content
        self.busy = True
        try:
            data = content.read_nowait()  # raises the body's error, if it has one
            while data:
                pieces = _cut(data, self.taken, marks, 0, lambda: t)[0] if marks else ((t, data),)
                self.taken += len(data)
                marks = None  # what a resume parsed during this call arrived by now
                for when, piece in pieces:
                    if not self.on_data(when, piece):
                        done.set_result(None)
                        return True
                # Bytes fed since the read above (by a resume inside it), else done: no second read to find none.
                data = content.read_nowait() if content.total_bytes > self.taken else b""
        except _BODY_ERRORS as exc:
            done.set_exception(_body_error(exc))
            return True
        except Exception as exc:  # the reader's own failure: its task gets it
            done.set_exception(exc)
            return True
        finally:
            self.busy = False
        if content.is_eof():
            done.set_result(None)
            return True
        return False


async def get(
    transport: Transport, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
) -> tuple[int, Mapping[str, str], bytes]:
    """Status, headers and whole body of ``GET url`` within ``timeout_s`` (TimeoutError past it).

    The one way the pollers, the probe and the calibration probe read a small endpoint, so each has a deadline
    (a frozen server accepts the connection and answers nothing) and closes its response.
    """
    async with asyncio.timeout(timeout_s):
        resp = await transport.send("GET", url, None, headers or {"Accept": "*/*"})
        try:
            return resp.status, resp.headers, await resp.read()
        finally:
            resp.close()


_STALE_TRIES = 5  # sends of a request whose pooled connection turns out closed, in all (AiohttpTransport.send)


class AiohttpTransport:
    """HTTP over aiohttp with an unbounded connection pool (one connection per live stream)."""

    def __init__(self, *, connect_timeout_s: float = 10.0) -> None:
        self._connect_timeout = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # Idle connections are dropped after 4 s, before the 5 s after which llama-server (cpp-httplib)
                # closes them itself: aiohttp's 15 s default reused connections the server had already closed.
                connector=_StampingConnector(limit=0, limit_per_host=0, force_close=False, keepalive_timeout=4.0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                auto_decompress=False,
            )
        return self._session

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        session = self._get_session()
        try:
            for attempt in range(_STALE_TRIES):
                try:
                    resp = await session.request(method, url, data=body, headers=dict(headers))
                    break
                except aiohttp.ClientConnectorError:
                    raise  # no connection at all (refused, unreachable): nothing to resend
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    # A pooled keep-alive connection the server had already closed (its idle timeout, or a close
                    # after a reply): the request fails before any byte of a response ("Server disconnected", "Can
                    # not write request body"). Nothing was processed, so it is sent again; each failure discards
                    # that connection, and the pool may hold a few such, hence a few tries.
                    if attempt == _STALE_TRIES - 1:
                        raise
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError, OSError) as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        except TimeoutError as exc:
            raise ConnectTimedOut("connect timed out") from exc
        except aiohttp.ClientResponseError as exc:  # a status line or header aiohttp's parser refuses
            raise _malformed(exc) from exc
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class BearerTransport:
    """Another transport with ``Authorization: Bearer KEY`` on every request it sends.

    One wrapper rather than a key handed to each caller, so the chat load, token sizing and /metrics scrapes of a
    run all carry the key named by ``--api-key-env`` (a gateway in front of vLLM may guard every path, not only
    /v1). The key lives in this object only: never in a record, a log line, a result or this repr.
    """

    def __init__(self, inner: Transport, key: str) -> None:
        self._inner = inner
        self._auth = f"Bearer {key}"
        SECRETS.add(key)  # so a server that echoes it back cannot get it recorded (endpoint.redact)

    def __repr__(self) -> str:
        return f"BearerTransport({self._inner!r}, key=<hidden>)"

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        return await self._inner.send(method, url, body, {**headers, "Authorization": self._auth})

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class MockRequest:
    method: str
    url: str
    body: bytes | None
    headers: Mapping[str, str]


@dataclass
class MockResponse:
    """A scripted response: ``chunks`` are (seconds to wait first, bytes); ``break_after`` cuts the stream."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks_script: Sequence[tuple[float, bytes]] = ()
    break_after: int | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        for i, (delay, data) in enumerate(self.chunks_script):
            if self.break_after is not None and i >= self.break_after:
                raise StreamBroken("connection reset by the mock")
            if delay > 0:
                await asyncio.sleep(delay)
            yield data

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        return None


class MockTransport:
    """An in-process server: ``handler(request)`` returns the response (or raises ConnectFailed)."""

    def __init__(self, handler: Callable[[MockRequest], Awaitable[MockResponse]]) -> None:
        self._handler = handler
        self.requests: list[MockRequest] = []

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        req = MockRequest(method, url, body, headers)
        self.requests.append(req)
        return await self._handler(req)

    async def aclose(self) -> None:
        return None


class SignedTransport:
    """Another transport with the run's credentials on every request: the API key as ``Authorization: Bearer``,
    ``--url``'s userinfo as Basic auth, and ``--url``'s query parameters (``?api_key=``) on every URL.

    The credentials come from ``endpoint.redact.split_url``, which also gives every other component a base URL
    without them; so the chat load, the probe, the /metrics and /health polls all carry the same credentials and
    none of them can record one. A key and a userinfo cannot both be sent (each is an Authorization header):
    the key wins, as the more specific of the two.
    """

    def __init__(self, inner: Transport, *, key: str | None = None, credentials: UrlCredentials | None = None) -> None:
        self._inner = inner
        creds = credentials or UrlCredentials()
        self._auth: str | None = None
        if key:
            self._auth = f"Bearer {key}"
        elif creds.user is not None:
            token = base64.b64encode(f"{creds.user}:{creds.password or ''}".encode()).decode("ascii")
            self._auth = f"Basic {token}"
        self._params = creds.params

    def __repr__(self) -> str:
        return f"SignedTransport({self._inner!r}, credentials=<hidden>)"

    def _url(self, url: str) -> str:
        if not self._params:
            return url
        parts = urlsplit(url)
        have = {k for k, _ in parse_qsl(parts.query, keep_blank_values=True)}
        extra = urlencode([(k, v) for k, v in self._params if k not in have])
        query = f"{parts.query}&{extra}" if parts.query and extra else parts.query or extra
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        signed = dict(headers)
        if self._auth is not None:
            signed["Authorization"] = self._auth
        return await self._inner.send(method, self._url(url), body, signed)

    async def aclose(self) -> None:
        await self._inner.aclose()


class Endpoint:
    """The server's ``--url`` and key, as an actor opens its own connection with them; the key never printed.

    ``transport``: an in-process one to send through instead (tests run actors in one process, on virtual time,
    against the in-process simulator); never given to a Ray actor, which gets a copy of this object.
    """

    def __init__(self, url: str, key: str | None, transport: Transport | None = None) -> None:
        self.url = url
        self.key = key
        self.transport = transport

    def __repr__(self) -> str:
        return "Endpoint(<url and key not shown>)"


def signed_transport(url: str, key: str | None, inner: Transport | None = None) -> tuple[ServerUrl, Transport]:
    """``--url`` taken apart (``redact.split_url``) and a transport that sends its credentials and ``key``."""
    server = split_url(url)
    SECRETS.add(key)
    transport: Transport = inner or AiohttpTransport()
    if key or server.credentials:
        transport = SignedTransport(transport, key=key, credentials=server.credentials)
    return server, transport
