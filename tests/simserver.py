"""Start a SimServer on a random loopback port inside the test's event loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress

from aiohttp.test_utils import TestServer

from agentload.capacity.profile import load_profile
from agentload.sim.server import SimConfig, SimServer


@asynccontextmanager
async def running_sim(profile: str = "qwen3-235b-gb300", **kwargs: object) -> AsyncIterator[tuple[SimServer, str]]:
    """Yield the server and its base URL (``http://127.0.0.1:PORT``)."""
    server = SimServer(SimConfig(profile=load_profile(profile), **kwargs))  # type: ignore[arg-type]  # test kwargs
    ts = TestServer(server.app(), host="127.0.0.1")
    await ts.start_server()
    try:
        yield server, f"http://127.0.0.1:{ts.port}"
    finally:
        await ts.close()


@contextmanager
def sim_process(profile: str, *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``agentload sim`` in its own process on a free loopback port: (the process, its base URL).

    Stopped with SIGKILL at the end (after a SIGCONT, so a test may have frozen it with SIGSTOP, or killed it).
    """
    sim = subprocess.Popen(
        [sys.executable, "-m", "agentload", "sim", "--port", "0", "--profile", profile, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        assert sim.stdout is not None
        line = sim.stdout.readline()
        while line and not line.startswith("Serving "):
            line = sim.stdout.readline()
        assert line.startswith("Serving "), "the simulator did not start"
        yield sim, "http://" + line.split("http://", 1)[1].split()[0]
    finally:
        with suppress(ProcessLookupError):  # a killed simulator is gone already
            os.kill(sim.pid, signal.SIGCONT)
        sim.kill()
        sim.communicate(timeout=30)  # also closes its stdout pipe
