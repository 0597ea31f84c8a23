"""KV arithmetic against the worked numbers of docs/background.md §3 and §5 (literal figures, not the formula again)."""

from __future__ import annotations

import pytest

from agentload.capacity.catalog import get_model
from agentload.capacity.kv import KVDtype, kv_layout, parse_kv_dtype
from agentload.errors import ConfigError

KIB = 1024
MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("model", "bf16_kib", "fp8_kib"),
    [
        ("llama-3.1-8b", 128, 64),
        ("llama-3.1-70b", 320, 160),
        ("qwen3-32b", 256, 128),
        ("qwen3-235b-a22b", 188, 94),
        ("qwen2.5-0.5b", 12, 6),
    ],
)
def test_dense_kv_bytes_per_token_match_domain(model: str, bf16_kib: int, fp8_kib: int) -> None:
    spec = get_model(model)
    assert kv_layout(spec, KVDtype.BF16).bytes_per_token == bf16_kib * KIB
    assert kv_layout(spec, KVDtype.FP8).bytes_per_token == fp8_kib * KIB
    # Dense models keep every token in every layer: nothing is fixed per session.
    assert kv_layout(spec, KVDtype.BF16).fixed_bytes_per_session == 0


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v3.2"])
def test_mla_kv_per_token_is_the_latent(model: str) -> None:
    spec = get_model(model)
    assert kv_layout(spec, KVDtype.BF16).bytes_per_token / KIB == pytest.approx(68.6, abs=0.05)
    assert kv_layout(spec, KVDtype.FP8).bytes_per_token / KIB == pytest.approx(34.3, abs=0.05)


def test_sparse_read_attention_stores_as_much_as_dense_mla() -> None:
    # DSA limits what a step reads, not what is stored (docs/background.md §3).
    v3 = kv_layout(get_model("deepseek-v3"), KVDtype.FP8)
    v32 = kv_layout(get_model("deepseek-v3.2"), KVDtype.FP8)
    assert v32.bytes_per_token == v3.bytes_per_token
    assert v32.blocks_per_request(100_000) == v3.blocks_per_request(100_000)


def test_gpt_oss_grows_36_kib_per_token_plus_about_5_mib_per_session() -> None:
    layout = kv_layout(get_model("gpt-oss-120b"), KVDtype.BF16)
    assert layout.growing_bytes_per_token == 36 * KIB
    assert layout.fixed_bytes_per_session / MIB == pytest.approx(5.0, abs=0.1)


def test_gemma3_grows_80_kib_per_token_plus_about_423_mib_per_session() -> None:
    layout = kv_layout(get_model("gemma-3-27b"), KVDtype.BF16)
    assert layout.growing_bytes_per_token == 80 * KIB
    assert layout.fixed_bytes_per_session / MIB == pytest.approx(423, abs=1)


def test_hybrid_groups_are_equal_sized_and_sliding_groups_hold_only_their_window() -> None:
    gemma = kv_layout(get_model("gemma-3-27b"), KVDtype.BF16)
    # 10 global + 52 local layers → groups of 10: one full group and six sliding ones (the last padded).
    assert [g.window for g in gemma.groups] == [None] + [1024] * 6
    # One request at 40,960 tokens: 2,560 full-attention blocks + 65 per sliding group (ceil(1023/16) + 1).
    assert gemma.blocks_per_request(40_960) == 2_560 + 6 * 65
    # A request shorter than the window holds its whole context in every group.
    assert gemma.blocks_per_request(160) == 7 * 10


@pytest.mark.parametrize(
    ("logged_tokens", "max_model_len", "line"),
    [
        (997_753, 40_960, "24.36x"),
        (613_024, 131_072, "4.68x"),
    ],
)
def test_dense_max_concurrency_is_vllms(logged_tokens: int, max_model_len: int, line: str) -> None:
    layout = kv_layout(get_model("qwen3-235b-a22b"), KVDtype.FP8)
    blocks = layout.num_blocks_for_logged_tokens(logged_tokens)
    assert f"{layout.max_concurrency(blocks, max_model_len):.2f}x" == line


def test_hybrid_logged_pool_understates_full_attention_capacity() -> None:
    layout = kv_layout(get_model("gpt-oss-120b"), KVDtype.BF16)
    # vLLM logs num_blocks // num_groups × block_size: with two groups, half the blocks.
    assert layout.logged_pool_tokens(20_000) == 160_000
    assert layout.num_blocks_for_logged_tokens(160_000) == 20_000
    # At 32k tokens per session the window-aware count is about twice the naive pool ÷ context.
    naive = layout.naive_sessions(20_000, 32_768)
    aware = 20_000 / layout.blocks_per_request(32_768)
    assert naive == pytest.approx(4.88, abs=0.01)
    assert aware == pytest.approx(9.72, abs=0.01)


def test_a_shared_system_prompt_is_stored_once() -> None:
    layout = kv_layout(get_model("qwen2.5-0.5b"), KVDtype.BF16)
    # 4,096 blocks; sessions of 8,192 tokens (512 blocks) sharing 2,000 tokens (125 full blocks).
    assert layout.sessions_sharing_prefix(4_096, 8_192, 2_000) == pytest.approx(3_971 / 387)
    assert layout.sessions_sharing_prefix(4_096, 8_192, 0) == 8.0


@pytest.mark.parametrize(
    ("model", "tp", "copies"),
    [
        ("llama-3.1-8b", 1, 1.0),
        ("llama-3.1-8b", 8, 1.0),  # 8 KV heads split one per GPU
        ("qwen3-235b-a22b", 8, 2.0),  # 4 KV heads on 8 GPUs: each head lives on two
        ("deepseek-v3", 8, 8.0),  # MLA's latent is shared by all heads: every rank stores all of it
    ],
)
def test_tensor_parallel_replicates_kv_that_cannot_split(model: str, tp: int, copies: float) -> None:
    layout = kv_layout(get_model(model), KVDtype.BF16, tensor_parallel=tp)
    assert layout.replication == copies
    assert layout.num_blocks_for_bytes(layout.page_bytes * copies * 10) == 10


def test_heads_that_do_not_split_are_refused() -> None:
    with pytest.raises(ConfigError, match="KV heads"):
        kv_layout(get_model("qwen2.5-0.5b"), KVDtype.BF16, tensor_parallel=7)  # 14 heads split, 2 KV heads cannot
    with pytest.raises(ConfigError, match="attention heads"):
        kv_layout(get_model("qwen2.5-0.5b"), KVDtype.BF16, tensor_parallel=4)


@pytest.mark.parametrize(
    ("text", "dtype"),
    [("auto", KVDtype.BF16), ("bfloat16", KVDtype.BF16), ("half", KVDtype.FP16), ("fp8_e4m3", KVDtype.FP8)],
)
def test_kv_dtype_accepts_vllm_spellings(text: str, dtype: KVDtype) -> None:
    assert parse_kv_dtype(text) is dtype


def test_unknown_kv_dtype_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="int3"):
        parse_kv_dtype("int3")
