"""DeepSeek-V4's vLLM KV layout and accounting, checked against published log lines and hand arithmetic.

Independent figures used here (docs/deepseek-v4.md):
* the source article's vLLM log: 76,220 blocks (74.66 GiB) at max-model-len 40,960 → "GPU KV cache size: 997,753
  tokens", 24.36x; 74,697 blocks (73.17 GiB) at 1,048,576 → 11,086,409 tokens, 10.57x;
* a third-party vLLM 0.22.1rc1 log: 37.93 GiB, L = 256,000 → 38,724 blocks, 2,497,693 tokens, 9.76x.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentload.bench.results import RunResult
from agentload.capacity.catalog import get_model
from agentload.capacity.hfconfig import load_hf_config
from agentload.capacity.hybrid_kv import ConcurrencyFormula, deepseek_v4_layout
from agentload.capacity.kv import KVDtype, kv_layout
from agentload.capacity.planner import parse_spec, plan
from agentload.capacity.profile import load_profile
from agentload.cli.main import app
from agentload.errors import ConfigError
from agentload.sim.kvcache import KVCacheManager

GIB = 2**30
FLASH = get_model("deepseek-v4-flash")


def _layout(max_model_len: int) -> Any:
    return kv_layout(FLASH, KVDtype.FP8, max_model_len=max_model_len, max_num_batched_tokens=8192)


def test_page_sizes_are_vllms_fp8_ds_mla_pages() -> None:
    v4 = deepseek_v4_layout(FLASH, 8192)
    pages = {g.name: g.page_bytes for g in v4.groups}
    # Hand arithmetic: a main entry is 448 fp8 + 64 × 2 bf16 + 8 scale bytes = 584 B; 64 of them (C4A, 256 / 4)
    # = 37,376 B, padded to 576-B alignment = 65 × 576 = 37,440; indexer 64 × 132 = 8,448 → 15 × 576 = 8,640;
    # C128A 2 × 584 = 1,168 → 3 × 576 = 1,728. Full group: 21 × (37,440 + 8,640) + 20 × 1,728 = 1,002,240.
    assert pages["full (compressed MLA + indexer)"] == 1_002_240
    assert pages["sliding window a"] == 22 * 37_440 == 823_680
    assert pages["sliding window b"] == 21 * 37_440 == 786_240
    assert pages["C4 compressor state"] == 21 * (37_440 + 8_640) == 967_680
    assert pages["C128 compressor state"] == 20 * 37_440 == 748_800
    assert v4.slab_bytes == 22 * 47_808 == 1_051_776
    # The constant part of one request's reservation (vLLM's kv_cache_planning.py, docs/deepseek-v4.md).
    assert v4.constant_reservation_bytes(40_960) == 2_975_112_000


@pytest.mark.parametrize(
    ("max_model_len", "num_blocks", "tokens", "concurrency", "bpr"),
    [
        (40_960, 76_220, 997_753, "24.36", 3_129),  # the article, first run
        (1_048_576, 74_697, 11_086_409, "10.57", 7_065),  # the article, 1M context
        (256_000, 38_724, 2_497_693, "9.76", 3_969),  # third-party vLLM 0.22.1rc1 log
    ],
)
def test_logged_lines_match_published_vllm_logs(
    max_model_len: int, num_blocks: int, tokens: int, concurrency: str, bpr: int
) -> None:
    layout = _layout(max_model_len)
    assert layout.v4.blocks_per_request(max_model_len) == bpr
    assert layout.logged_pool_tokens(num_blocks) == tokens
    assert f"{layout.max_concurrency(num_blocks, max_model_len):.2f}" == concurrency
    # The log line's inverse finds the pool again.
    assert layout.num_blocks_for_logged_tokens(tokens) == num_blocks


@pytest.mark.parametrize(("gib", "num_blocks"), [(74.66, 76_220), (73.17, 74_697), (37.93, 38_724)])
def test_num_blocks_from_the_logged_gib_within_a_hundredth_of_a_percent(gib: float, num_blocks: int) -> None:
    got = _layout(40_960).num_blocks_for_bytes(gib * GIB)
    assert abs(got - num_blocks) / num_blocks < 1e-4


def test_the_later_per_group_formula_counts_pages_as_block_ids() -> None:
    v4 = deepseek_v4_layout(FLASH, 8192)
    # Pages at L = 40,960, T = 8,192: full 40,960 / 256 = 160; SWA ⌈(127 + 8,192) / 64⌉ + 1 = 131 (twice);
    # C4 state ⌈(7 + 8,192) / 4⌉ + 1 = 2,051; C128 state ⌈(127 + 8,192) / 8⌉ + 1 = 1,041.
    assert v4.reserved_pages(40_960) == {
        "full (compressed MLA + indexer)": 160,
        "sliding window a": 131,
        "sliding window b": 131,
        "C4 compressor state": 2_051,
        "C128 compressor state": 1_041,
    }
    assert v4.blocks_per_request(40_960, ConcurrencyFormula.PER_GROUP) == 160 + 131 + 131 + 2_051 + 1_041


def test_decoding_sessions_hold_far_fewer_blocks_than_vllm_reserves() -> None:
    v4 = deepseek_v4_layout(FLASH, 8192)
    # Decoding (one token in flight): SWA ⌈128 / 64⌉ + 1 = 3 (twice), C4 state ⌈8 / 4⌉ + 1 = 3, C128 state
    # ⌈128 / 8⌉ + 1 = 17: 26 block ids besides the full group's ⌈context / 256⌉.
    assert v4.decode_blocks(40_960) == 160 + 26
    assert v4.decode_blocks(1_048_576) == 4_096 + 26
    # A session prefilling a whole chunk holds (131 − 3) × 2 + (2,051 − 3) + (1,041 − 17) more.
    assert v4.prefill_extra_blocks(40_960) == 128 * 2 + 2_048 + 1_024


def test_plan_gives_vllms_lines_and_the_agents_that_fit_while_decoding() -> None:
    p = plan(parse_spec({"model": "deepseek-v4-flash", "gpu": "dgx-station-gb300", "kv_cache_dtype": "fp8",
                         "max_model_len": 40_960, "num_gpu_blocks": 76_220}))  # fmt: skip
    assert p.pool.startup_lines == (
        "GPU KV cache size: 997,753 tokens",
        "Maximum concurrency for 40,960 tokens per request: 24.36x",
    )
    assert p.hybrid is not None
    assert p.hybrid.sessions_while_decoding == pytest.approx(76_220 / 186)  # 409.8
    assert p.hybrid.worst_case_sessions == pytest.approx(24.36, abs=0.005)
    assert p.agents.naive_sessions == pytest.approx(997_753 / 40_960)  # the article's "24.4"
    assert p.logged_pool_is_accounting
    big = plan(parse_spec({"model": "deepseek-v4-flash", "gpu": "dgx-station-gb300", "kv_cache_dtype": "fp8",
                           "max_model_len": 1_048_576, "num_gpu_blocks": 74_697}))  # fmt: skip
    assert big.pool.tokens == 11_086_409
    assert big.hybrid is not None
    assert big.hybrid.sessions_while_decoding == pytest.approx(74_697 / 4_122)  # 18.1 million-token agents
    assert 10 < big.hybrid.sessions_while_decoding < 19
    # The round trip the CLI's --json relies on.
    assert type(p).model_validate_json(p.model_dump_json()) == p


def test_dense_pool_is_capacity_not_accounting() -> None:
    # The benchmark's published Qwen3 pool: 64,671 blocks of 16 = 1,034,736 tokens; 64,671 / ⌈40,960 / 16⌉ =
    # 64,671 / 2,560 = 25.26x.
    p = plan(parse_spec({"model": "qwen3-235b-a22b", "gpu": "dgx-station-gb300", "kv_cache_dtype": "fp8",
                         "weight_dtype": "fp4", "max_model_len": 40_960, "num_gpu_blocks": 64_671}))  # fmt: skip
    assert p.pool.startup_lines == (
        "GPU KV cache size: 1,034,736 tokens",
        "Maximum concurrency for 40,960 tokens per request: 25.26x",
    )
    assert not p.logged_pool_is_accounting
    assert p.hybrid is None


def test_profiles_reproduce_the_articles_and_the_benchmarks_pools() -> None:
    assert load_profile("deepseek-v4-flash-gb300").startup_lines()[0] == "GPU KV cache size: 997,753 tokens"
    assert load_profile("deepseek-v4-flash-gb300-1m").startup_lines()[0] == "GPU KV cache size: 11,086,409 tokens"
    article = load_profile("qwen3-235b-gb300")  # the article's stated 997,753
    # A dense model's pool is whole blocks of 16 tokens: 997,753 is not (62,359.56 blocks), which is why it is
    # taken for the DeepSeek-V4 figure repeated; as a profile it becomes 62,359 × 16 = 997,744.
    assert article.num_blocks == 62_359
    assert article.pool_tokens == 997_744
    assert load_profile("qwen3-235b-gb300-published").pool_tokens == 1_034_736


def test_sim_pool_accounts_each_group_on_its_own_scale() -> None:
    layout = _layout(40_960)
    kv = KVCacheManager(layout, 1_000)
    short = kv.new_table()
    assert kv.allocate(short, 100)
    # 100 tokens: full ⌈100 / 256⌉ = 1; SWA ⌈100 / 64⌉ = 2 (twice); C4 state min(⌈100 / 4⌉, 3) = 3;
    # C128 state min(⌈100 / 8⌉, 17) = 13.
    assert [len(b) for b in short] == [1, 2, 2, 3, 13]
    long = kv.new_table()
    assert kv.allocate(long, 40_960)
    assert [len(b) for b in long] == [160, 3, 3, 3, 17]
    assert kv.num_free == 1_000 - 21 - 186
    assert kv.allocate(short, 40_000)  # grows on the full group only once windows are full
    assert [len(b) for b in short] == [157, 3, 3, 3, 17]
    kv.check_invariants()
    kv.free(short)
    kv.free(long)
    assert kv.num_free == 1_000
    kv.check_invariants()


def test_fp16_kv_for_deepseek_v4_is_refused_with_one_line() -> None:
    with pytest.raises(ConfigError, match="--kv-cache-dtype fp8"):
        kv_layout(FLASH, KVDtype.BF16, max_model_len=40_960)


def _flash_config() -> dict[str, Any]:
    """DeepSeek-V4-Flash's config.json fields as its config.json lists them (44 compress ratios: 43 + 1 MTP)."""
    return {
        "_name_or_path": "deepseek-ai/DeepSeek-V4-Flash",
        "model_type": "deepseek_v4",
        "num_hidden_layers": 43,
        "num_nextn_predict_layers": 1,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "o_lora_rank": 1024,
        "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
        "sliding_window": 128,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 512,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048,
        "intermediate_size": 2048,
        "vocab_size": 129_280,
        "max_position_embeddings": 1_048_576,
        "torch_dtype": "bfloat16",
    }


def test_config_json_gives_the_catalogue_layout(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_flash_config()))
    spec = load_hf_config(path).spec
    assert spec.compress_ratios == FLASH.compress_ratios  # the MTP layer's entry is dropped
    layout = kv_layout(spec, KVDtype.FP8, max_model_len=40_960)
    assert layout.logged_pool_tokens(76_220) == 997_753
    # Published: ~284B total, 13B active (its model card); the estimate leaves out the compressors and indexer.
    assert spec.total_params == pytest.approx(284e9, rel=0.03)
    assert spec.active_params == pytest.approx(13e9, rel=0.05)


def test_config_json_with_the_wrong_number_of_ratios_is_one_error(tmp_path: Path) -> None:
    cfg = _flash_config()
    cfg["compress_ratios"] = [4, 128] * 10
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="compress_ratios"):
        load_hf_config(path)


@pytest.mark.slow
def test_simulated_deepseek_v4_still_scales_past_the_dense_formula(tmp_path: Path) -> None:
    """The article's finding from the architecture: the dense formula says 24.4 sessions at 40,960 tokens, the
    simulated server is still scaling at 48 (each decoding session holds 186 of the 76,220 block ids)."""
    result = CliRunner().invoke(
        app,
        ["bench", "--out", str(tmp_path / "runs"), "--json", "--sim", "deepseek-v4-flash-gb300",
         "--workload", "agentic-hold", "--context", "40960", "--find-knee", "--max-agents", "48"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "runs").glob("*/result.json")
    run = RunResult.model_validate_json(path.read_text())
    est = run.capacity[0]
    assert est.sessions is not None
    assert 24.3 < est.sessions < 24.6  # 997,753 ÷ the realised context, a little under 40,960
    knee = run.knee[0]
    assert knee.agents == 48  # no knee up to the search's limit
    assert knee.bound == "at_least"
    assert knee.ratio_low is not None
    assert knee.ratio_low > 1.9
    top = max(run.levels, key=lambda lv: lv.agents)
    assert top.agents == 48
    assert top.preemptions == 0
