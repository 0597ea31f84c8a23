"""A real engine's server process: a free loopback port, a log file, /health until 200, and a stop by PID.

Every server runs in its own session, so its PID is also its process group's id: stopping that group also ends
the processes the engine forks (vLLM's engine core) and touches nothing else on the machine. A server is either
our child (``proc``, started here) or was started by a script that returns its PID at once (vLLM's serve.sh), in
which case it is nobody's child here and the group's disappearance is what says it stopped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from tests.integration.harness.machine import SERVER_GROUPS
from tests.integration.harness.summary import Summary

STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL after this (vLLM's shutdown takes a few seconds)

_IMPOSSIBLE = 3  # both setup.sh scripts: the install or build cannot be done here (not a failure)


@dataclass(frozen=True)
class Engine:
    """One tier's engine: where its scripts and cache live, how long it may take, and its summary."""

    name: str  # in messages: "vLLM", "llama-server"
    scripts: Path  # the tier's setup.sh (and serve.sh) live here
    tier_dir: Path  # the per-machine cache: the install or build, models, server logs
    tier_dir_env: str  # the variable setup.sh reads the cache's path from
    setup_timeout_s: float
    start_timeout_s: float
    poll_s: float  # how often wait_ready asks /health
    summary: Summary

    def log(self, name: str, port: int) -> Path:
        return self.tier_dir / f"{name}-{port}.log"

    def setup(self, cannot: str, *args: str) -> str:
        """Run setup.sh with ``args`` (once per machine it builds; later runs find it cached); what it printed.

        Skips, saying ``cannot`` and why, only when setup.sh says the install or build is impossible here or it
        runs out of time; any other failure fails the test with setup.sh's output.
        """
        began = time.monotonic()
        env = {**os.environ, self.tier_dir_env: str(self.tier_dir)}
        try:
            done = subprocess.run([str(self.scripts / "setup.sh"), *args], capture_output=True, text=True, env=env,
                                  timeout=self.setup_timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip(f"{cannot}: setup.sh took over {self.setup_timeout_s:g} s")
        which = f" {' '.join(args)}" if args else ""
        self.summary.timings[f"setup{which} (install or build if needed, model if needed)"] = time.monotonic() - began
        if done.returncode == _IMPOSSIBLE:
            pytest.skip(f"{cannot}:\n{done.stderr[-2000:]}")
        assert done.returncode == 0, f"setup.sh failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own session (its PID is its process group), stdout and stderr into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip


@dataclass(kw_only=True)
class Server:
    """One running server: its engine, where it listens, its PID (= its process group) and its log."""

    engine: Engine
    port: int
    pid: int
    log: Path
    model: str  # the served name to put in request bodies
    proc: subprocess.Popen[bytes] | None = None  # set when the server is our child
    launched: float = field(default_factory=time.monotonic)
    started_s: float = 0.0  # launch to /health 200
    stopped: bool = False

    def __post_init__(self) -> None:
        SERVER_GROUPS.add(self.pid)  # its own process group (setsid / start_new_session): the tier's CPU

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # Not our child (its launching shell is gone), so no zombie of it lingers here. A PID reused by another
        # process would look alive; the log file's growth is not worth checking for that.
        return True

    def health(self) -> int | None:
        """/health's status: 200 ready, 503 loading (llama-server), None no answer (not listening yet)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            return None

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as resp:
            body: bytes = resp.read()
            return body

    def _group_gone(self) -> bool:
        if self.proc is not None:
            self.proc.poll()  # reap the leader, or its zombie keeps the group alive
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after STOP_GRACE_S; idempotent."""
        if self.stopped:
            return
        self.stopped = True
        with suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while not self._group_gone():
            if time.monotonic() > deadline:
                with suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        if self.proc is not None:
            self.proc.wait()


def wait_ready(server: Server, timeout_s: float | None = None) -> None:
    """Until /health answers 200; fails (with the log's tail) if the server exits or the timeout passes."""
    limit = server.engine.start_timeout_s if timeout_s is None else timeout_s
    name = server.engine.name
    began = time.monotonic()
    while server.health() != 200:
        if not server.alive():
            pytest.fail(f"{name} exited during startup:\n{tail(server.log)}")
        if time.monotonic() - began > limit:
            server.stop()
            pytest.fail(f"{name} not healthy after {limit:g} s:\n{tail(server.log)}")
        time.sleep(server.engine.poll_s)
    server.started_s = time.monotonic() - began


ServerT = TypeVar("ServerT", bound=Server)


@contextmanager
def serving(server: ServerT, timing: str) -> Iterator[ServerT]:
    """``server`` healthy while the block runs (its start time recorded as ``timing``), stopped after it."""
    try:
        wait_ready(server)
        server.engine.summary.timings[timing] = server.started_s
        yield server
    finally:
        server.stop()


@contextmanager
def timed(tier: Summary, name: str) -> Iterator[None]:
    """Record how long the block took under ``name`` in the tier's summary (also when it fails)."""
    began = time.monotonic()
    try:
        yield
    finally:
        tier.timings[name] = time.monotonic() - began
