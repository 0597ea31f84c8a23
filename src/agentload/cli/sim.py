"""``agentload sim``: the simulated vLLM-style server over HTTP, bound to 127.0.0.1 by default."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
from typing import Annotated

import typer
from aiohttp import web
from rich.markup import escape

from agentload.capacity.profile import load_profile
from agentload.cli.common import console, err_console, reports_errors
from agentload.errors import ConfigError
from agentload.inputs import check_seed
from agentload.sim.faults import KINDS, parse_fault
from agentload.sim.server import SimConfig, SimServer, with_max_model_len
from agentload.suite.app import make_behaviour


def loopback_only(host: str) -> bool:
    """Whether binding ``host`` keeps the simulator on this machine: ``localhost`` or a loopback address (all of
    127.0.0.0/8, ``::1``, and 127.x written as an IPv4-mapped IPv6 address). Any other name may resolve anywhere,
    and 0.0.0.0 / ``::`` listen on every interface, so those are not."""
    name = host.strip()
    if name.lower() == "localhost":
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # Python 3.11 does not count ::ffff:127.0.0.1 as loopback itself
    return address.is_loopback


async def serve(server: SimServer, host: str, port: int, ready_line: bool = True) -> None:
    runner = server.app_runner()
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048)
    try:
        await site.start()
    except (OSError, UnicodeError) as exc:  # UnicodeError: a host name IDNA cannot encode ("not..a..host")
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from exc
    bound = runner.addresses[0][1] if runner.addresses else port  # the real port when --port 0
    if ready_line:
        console.print(f"Serving {server.model_name} on http://{host}:{bound} (Ctrl-C to stop)", markup=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


@reports_errors
def sim(
    profile: Annotated[str, typer.Option("--profile", "-p", help="Built-in profile name or a profile TOML file.")] = (
        "laptop"
    ),
    host: Annotated[str, typer.Option(help="Address to bind. Keep the default unless you mean to expose it.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one).")] = 8000,
    max_model_len: Annotated[int | None, typer.Option(help="Override the profile's max-model-len.")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Model id to serve (default: the profile's).")] = None,
    cold_start: Annotated[
        float, typer.Option(min=0.0, help="Seconds of warm-up: /health not ready, requests get no bytes.")
    ] = 0.0,
    fault: Annotated[
        list[str] | None,
        typer.Option(help=f"Inject KIND:RATE[:SECONDS]; kinds {', '.join(KINDS)}."),
    ] = None,
    behaviour: Annotated[
        str,
        typer.Option(help="What the model says: agent (calls the offered tools), filler (load) or oracle (suite)."),
    ] = "agent",
    error_rate: Annotated[
        float,
        typer.Option(
            "--error-rate",
            "--oracle-error-rate",
            min=0.0,
            max=1.0,
            help="Agent or oracle: share of wrong replies (wrong tool, bad argument, invented fact).",
        ),
    ] = 0.0,
    known_bad: Annotated[str | None, typer.Option(help="Oracle: always play this known-bad behaviour.")] = None,
    prompt_tokens_details: Annotated[
        bool, typer.Option(help="Report usage.prompt_tokens_details.cached_tokens (vLLM needs a flag for it).")
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed for sampled output lengths and fault draws.")] = 0,
    stamp_chunks: Annotated[
        bool, typer.Option(help="Benchmarks: stream each token as the server's monotonic send time.", hidden=True)
    ] = False,
) -> None:
    """Serve a simulated vLLM-style, OpenAI-compatible server: continuous batching, paged KV, prefix cache."""
    check_seed(seed)
    prof = load_profile(profile)
    if max_model_len is not None:
        prof = with_max_model_len(prof, max_model_len)
    config = SimConfig(
        profile=prof,
        behaviour=make_behaviour(behaviour, error_rate, known_bad),
        served_model_name=served_model_name,
        cold_start_s=cold_start,
        faults=[parse_fault(f) for f in fault or []],
        seed=seed,
        prompt_tokens_details=prompt_tokens_details,
        stamp_chunks=stamp_chunks,
    )
    server = SimServer(config)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for line in prof.startup_lines():
        console.print(line, markup=False)
    about = escape(
        f"profile {prof.name}: {prof.model.name} on {prof.num_gpus}× {prof.gpu.name}; pool {prof.pool_source}"
    )
    err_console.print(f"[dim]{about}[/]")
    if not loopback_only(host):
        err_console.print(f"[yellow]warning:[/] binding {escape(host)}: the simulator is reachable beyond this machine")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(server, host, port))
