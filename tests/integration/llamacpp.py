"""The llama.cpp tier: llama.cpp's ``llama-server`` built from source and a random-weight GGUF made here.

``scripts/llamacpp-tier/setup.sh`` builds ``llama-server`` (CPU) from the llama.cpp sources vendored in the
``llama-cpp-python`` sdist on PyPI, once per machine (cached under ``~/.cache/agentload-llamacpp-tier`` by version,
under a lock), and writes the model with ``build_model.py``: a 4-layer llama whose vocabulary has one token per
agentload word and whose replies never stop early. The session fixture ``llamacpp`` starts one server on a free
loopback port with ``-np SLOTS`` slots of ``SLOT_CONTEXT`` tokens each, ``--metrics`` and ``--slots``, and stops it
by its PID (its own process group) at the end. The tier skips only when the build is impossible (no compiler, no
PyPI); a server that does not start is a failure, with its log in the message.

The host-memory prompt cache that recent llama-server builds keep (``--cache-ram``, 8 GiB by default) is turned
off (``--cache-ram 0``): with it, a prompt evicted from its slot can be restored from RAM, which is a second cache
layer the simulator's slot mode does not model; the tier measures the plain per-slot cache.
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
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "llamacpp-tier"
TIER_DIR = Path(os.environ.get("AGENTLOAD_LLAMACPP_TIER_DIR", Path.home() / ".cache" / "agentload-llamacpp-tier"))

ALIAS = "agentload-llamacpp"  # the model id the server answers to (-a)
SLOTS = 3
SLOT_CONTEXT = 4096  # per slot: -c is SLOTS × this
THREADS = 2

SETUP_TIMEOUT_S = 2700.0  # a cold build on two busy cores (the first build here: see the summary)
START_TIMEOUT_S = 120.0

# How long each part took and what was measured, printed at the end of the run (conftest's terminal summary).
TIMINGS: dict[str, float] = {}
FIGURES: dict[str, str] = {}

_IMPOSSIBLE = 3  # setup.sh: the download, install or build cannot be done here


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


@dataclass(frozen=True)
class Tier:
    binary: Path
    model: Path


@dataclass
class LlamaServer:
    """One running llama-server: where it listens, its PID (= its process group), its log and its shape."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    slots: int
    slot_context: int
    model: str = ALIAS
    started_s: float = 0.0
    stopped: bool = field(default=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self) -> int | None:
        """/health's status: 200 ready, 503 loading, None no answer (not listening yet)."""
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

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            self.proc.wait()
            return
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait()


def launch(tier: Tier, name: str, *, slots: int = SLOTS, slot_context: int = SLOT_CONTEXT,
           extra: tuple[str, ...] = ()) -> LlamaServer:  # fmt: skip
    """Start llama-server in its own session (so its PID is its process group); does not wait for /health."""
    port = free_port()
    log = TIER_DIR / f"{name}-{port}.log"
    args = [str(tier.binary), "-m", str(tier.model), "-a", ALIAS, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * slot_context), "--metrics", "--slots", "--cache-ram", "0",
            "-t", str(THREADS), "--no-webui", *extra]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    return LlamaServer(port=port, proc=proc, log=log, slots=slots, slot_context=slot_context)


def wait_healthy(server: LlamaServer, timeout_s: float = START_TIMEOUT_S) -> None:
    began = time.monotonic()
    while server.health() != 200:
        if not server.alive():
            pytest.fail(f"llama-server exited during startup:\n{tail(server.log)}")
        if time.monotonic() - began > timeout_s:
            server.stop()
            pytest.fail(f"llama-server not healthy after {timeout_s:g} s:\n{tail(server.log)}")
        time.sleep(0.2)
    server.started_s = time.monotonic() - began


@pytest.fixture(scope="session")
def llamacpp_tier() -> Tier:
    """Build llama-server and the model (once per machine; later runs find them cached)."""
    began = time.monotonic()
    env = {**os.environ, "AGENTLOAD_LLAMACPP_TIER_DIR": str(TIER_DIR)}
    try:
        done = subprocess.run([str(SCRIPTS / "setup.sh")], capture_output=True, text=True, env=env,
                              timeout=SETUP_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip(f"cannot build llama-server: setup.sh took over {SETUP_TIMEOUT_S:g} s")
    TIMINGS["setup (build if needed, model if needed)"] = time.monotonic() - began
    if done.returncode == _IMPOSSIBLE:
        pytest.skip(f"cannot build the llama.cpp tier:\n{done.stderr[-2000:]}")
    assert done.returncode == 0, f"setup.sh failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    binary, model = done.stdout.strip().splitlines()[-2:]
    build_seconds = Path(binary).parents[2] / "build-seconds"
    if build_seconds.exists():
        FIGURES["llama-server build (cached after the first run)"] = f"{build_seconds.read_text().strip()} s"
    return Tier(Path(binary), Path(model))


@pytest.fixture(scope="session")
def llamacpp(llamacpp_tier: Tier) -> Iterator[LlamaServer]:
    """The session's llama-server: SLOTS slots of SLOT_CONTEXT tokens; stopped by its PID when the session ends."""
    server = launch(llamacpp_tier, "llamacpp")
    try:
        wait_healthy(server)
        TIMINGS["server start (launch to /health 200)"] = server.started_s
        yield server
    finally:
        server.stop()
