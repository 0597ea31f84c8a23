"""``agentload record`` as an application: its settings checked, the proxy served until stopped.

``RecordSettings`` is the one model of the command's flags; ``check`` turns each bad value into one
``ConfigError`` before anything listens or is written; ``serve_record`` binds the listening address, serves the
proxy until ``stop`` is set, and writes the trace a last time on the way out.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from agentload.errors import ConfigError
from agentload.record.proxy import Counts, RecordingProxy
from agentload.record.tokens import APPROX, BlockHasher
from agentload.record.writer import TraceWriter

MAX_BLOCK_SIZE = 65_536  # the reader's limit (conversation_trace.MAX_BLOCK_SIZE)


@dataclass(frozen=True)
class RecordSettings:
    host: str
    port: int
    upstream: str
    out: Path
    block_size: int = 64
    keep_text: bool = False


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port); port 0 picks a free one."""
    host, sep, port = listen.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8100")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def check_upstream(url: str) -> str:
    """The upstream's base URL, checked: http(s), a host, no credentials, query or fragment; no trailing slash."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (reading it validates the port)
    except ValueError as exc:
        raise ConfigError(f"--upstream {url!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--upstream {url!r}: expected an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigError("--upstream: no credentials in the URL; the client's own Authorization header is passed on")
    if parts.query or parts.fragment:
        raise ConfigError(f"--upstream {url!r}: no query or fragment; give the server's base URL")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def check_out(out: Path) -> Path:
    """``out`` if a file can be written there (a probe file beside it is created and removed)."""
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; name a file, e.g. {out / 'trace.json'}")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=parent)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write there ({exc.strerror or exc})") from exc
    os.close(fd)
    os.unlink(probe)
    return out


def check(settings: RecordSettings) -> RecordSettings:
    if not 1 <= settings.block_size <= MAX_BLOCK_SIZE:
        raise ConfigError(f"--block-size must be from 1 to {MAX_BLOCK_SIZE}, got {settings.block_size}")
    return RecordSettings(
        settings.host, settings.port, check_upstream(settings.upstream), check_out(settings.out),
        settings.block_size, settings.keep_text,
    )  # fmt: skip


def make_proxy(
    settings: RecordSettings, progress: Callable[[int, int, int], None] = lambda _r, _s, _f: None
) -> RecordingProxy:
    writer = TraceWriter(settings.out, settings.block_size, lambda: APPROX)
    proxy = RecordingProxy(
        settings.upstream, writer, keep_text=settings.keep_text, progress=progress,
        hasher=BlockHasher(settings.block_size),
    )  # fmt: skip

    def method() -> str:  # the upstream endpoint that tokenized, once one answered; else the approximation
        return (proxy.tokenizer.method if proxy.tokenizer else None) or APPROX

    writer.tokenizer = method
    return proxy


async def serve_record(
    settings: RecordSettings,
    stop: asyncio.Event,
    *,
    ready: Callable[[str], None] = lambda _url: None,
    progress: Callable[[int, int, int], None] = lambda _r, _s, _f: None,
) -> Counts:
    """Serve the proxy on ``settings.host:port`` until ``stop`` is set; the trace is written as requests complete
    and once more at the end. ``ready`` gets the proxy's base URL once it listens."""
    settings = check(settings)
    proxy = make_proxy(settings, progress)
    runner = web.AppRunner(proxy.app(), access_log=None)  # no access log: nothing of a request is printed
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except (OSError, UnicodeError) as exc:
        await runner.cleanup()
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"--listen {settings.host}:{settings.port}: cannot listen there ({reason})") from exc
    try:
        port = runner.addresses[0][1] if runner.addresses else settings.port
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        ready(f"http://{host}:{port}")
        await stop.wait()
    finally:
        await runner.cleanup()
    return proxy.counts
