"""``agentload record``: a recording proxy between your own agents and your server (agentload.record)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from agentload.cli.common import err_console, reports_errors
from agentload.cli.sim import loopback_only
from agentload.errors import ConfigError
from agentload.record.app import RecordSettings, parse_listen, serve_record

PROGRESS_EVERY_S = 2.0  # at most one progress line this often (and one at the end)


class _Progress:
    """Progress lines on stderr: requests recorded, sessions, requests forwarded but not recorded."""

    def __init__(self) -> None:
        self.last = 0.0
        self.state = (0, 0, 0)

    def __call__(self, recorded: int, sessions: int, failed: int) -> None:
        self.state = (recorded, sessions, failed)
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.print()

    def print(self) -> None:
        recorded, sessions, failed = self.state
        line = f"recorded {recorded} requests in {sessions} sessions"
        err_console.print(
            line + (f" ({failed} forwarded but not recorded)" if failed else ""), markup=False, soft_wrap=True
        )


async def _serve(settings: RecordSettings, progress: _Progress) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    def ready(url: str) -> None:
        err_console.print(
            f"Recording on {url} → {settings.upstream} into {settings.out} (Ctrl-C to stop)",
            markup=False,
            soft_wrap=True,
        )

    await serve_record(settings, stop, ready=ready, progress=progress)


@reports_errors
def record(
    upstream: Annotated[
        str, typer.Option(help="The server to forward to, e.g. http://127.0.0.1:8000 (paths are appended to it).")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The trace file to write (JSON, conversation trace format).")
    ],
    listen: Annotated[
        str, typer.Option(help="HOST:PORT to listen on; point your orchestrator's base URL here.")
    ] = "127.0.0.1:8100",
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Allow a --listen address other than loopback (the proxy forwards your server to whoever reaches it).",
        ),
    ] = False,
    block_size: Annotated[int, typer.Option(help="Tokens per hash block of the recorded prompts.")] = 64,
    keep_text: Annotated[
        bool, typer.Option("--keep-text", help="Also write each request's new messages and the reply's text.")
    ] = False,
) -> None:
    """Proxy to --upstream unchanged and record your agents' requests as a trace (replay: bench --workload trace:FILE).

    Sessions are told apart by their messages' common prefix; header X-Agentload-Session: NAME names one outright.

    Header X-Agentload-Parent: NAME on a session's first request makes it a subagent of session NAME.

    Written: token counts, timings, salted block hashes; no text unless --keep-text; never Authorization.

    More in docs/record.md.
    """
    host, port = parse_listen(listen)
    if not loopback_only(host) and not allow_remote:
        raise ConfigError(
            f"--listen {listen}: not a loopback address; the proxy would forward your server to anyone who "
            "reaches it. Add --allow-remote if that is what you mean"
        )
    progress = _Progress()
    settings = RecordSettings(host, port, upstream, out, block_size, keep_text)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(settings, progress))
    progress.print()
