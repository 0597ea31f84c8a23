"""Serving profiles: built-ins resolve, pools come out as vLLM would log them, bad profiles fail with one line."""

from __future__ import annotations

from typing import Any

import pytest

from agentload.capacity.profile import (
    WEIGHT_BYTES,
    KVPoolSpec,
    OffloadSpec,
    ProfileFile,
    builtin_profiles,
    load_profile,
    parse_profile,
    resolve,
)
from agentload.errors import ConfigError, UnknownNameError


def _profile(**fields: Any) -> ProfileFile:
    base: dict[str, Any] = {"name": "t", "model": "qwen3-235b-a22b", "gpu": "gb300", "max_model_len": 40960}
    return ProfileFile(**{**base, **fields})


@pytest.mark.parametrize("name", builtin_profiles())
def test_every_builtin_profile_resolves(name: str) -> None:
    profile = load_profile(name)
    assert profile.num_blocks > 0
    assert profile.max_concurrency >= 1


def test_the_source_benchmark_pool_gives_vllms_24_36x() -> None:
    profile = load_profile("qwen3-235b-gb300")
    assert profile.startup_lines()[1] == "Maximum concurrency for 40,960 tokens per request: 24.36x"


def test_a_logged_pool_at_131072_gives_4_68x() -> None:
    spec = _profile(model="llama-3.1-8b", gpu="h100", max_model_len=131072, kv_pool=KVPoolSpec(tokens=613_024))
    profile = resolve(spec, "test")
    assert profile.startup_lines() == [
        "GPU KV cache size: 613,024 tokens",
        "Maximum concurrency for 131,072 tokens per request: 4.68x",
    ]


def test_weights_that_do_not_fit_say_so() -> None:
    with pytest.raises(ConfigError, match=r"weights \(470.0 GB in bf16\) do not fit in 1 × 288 GB"):
        resolve(_profile(weight_dtype="bf16"), "test")


def test_more_gpus_make_room_for_the_weights() -> None:
    profile = resolve(_profile(weight_dtype="bf16", num_gpus=4), "test")
    assert profile.layout.replication == 1.0  # 4 KV heads over 4 GPUs split evenly
    assert profile.num_blocks > 0


def test_a_pool_too_small_for_one_request_says_so() -> None:
    with pytest.raises(ConfigError, match="lower max_model_len"):
        resolve(_profile(weight_dtype="fp4", kv_pool=KVPoolSpec(tokens=16_384)), "test")


def test_offload_size_is_the_total_over_all_ranks() -> None:
    one = resolve(_profile(weight_dtype="fp8", offload=OffloadSpec(gib=100)), "test")
    # Qwen3-235B's 4 KV heads on 8 GPUs are stored twice, so the same GiB hold half the blocks.
    eight = resolve(_profile(weight_dtype="fp8", num_gpus=8, offload=OffloadSpec(gib=100)), "test")
    assert eight.offload_blocks == one.offload_blocks // 2
    # A block comes back over eight links, each carrying its rank's share (two copies in all).
    assert eight.offload_load_s(1000) == pytest.approx(one.offload_load_s(1000) / 4)


def test_gb300_reloads_a_40k_session_over_nvlink_c2c_in_about_a_tenth_of_a_second() -> None:
    profile = resolve(_profile(weight_dtype="fp4", kv_cache_dtype="fp8", offload=OffloadSpec(gib=100)), "test")
    # 2,560 blocks × 1.47 MiB at 450 GB/s.
    assert profile.offload_load_s(2560) == pytest.approx(0.0088, rel=0.01)


def test_unknown_builtin_profile_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="laptop"):
        load_profile("nope")


def test_profile_with_bad_field_names_it() -> None:
    text = 'name = "x"\nmodel = "llama-3.1-8b"\ngpu = "h100"\nmax_model_len = 0\n'
    with pytest.raises(ConfigError, match="max_model_len"):
        parse_profile(text, "x.toml")


def test_embedded_model_table_with_an_impossible_field_names_it() -> None:
    text = (
        'name = "x"\ngpu = "h100"\nmax_model_len = 4096\n[model]\nname = "m"\nnum_layers = 2\nhidden_size = 64\n'
        "num_attention_heads = 4\nnum_kv_heads = 4\nhead_dim = 16\ntotal_params = 1e6\nactive_params = 2e6\n"
    )
    with pytest.raises(ConfigError, match="active_params cannot exceed total_params"):
        parse_profile(text, "x.toml")


def test_weight_formats_keep_their_public_name() -> None:
    assert WEIGHT_BYTES["fp4"] == 0.5
    assert WEIGHT_BYTES["bf16"] == 2.0


def test_a_profile_fits_big_agent_payloads_and_the_laptop_states_its_limit() -> None:
    # Agent tests send 50k-token tool results; rehearsing them needs a context of 64k or more.
    long = load_profile("qwen3-235b-gb300-128k")
    assert long.max_model_len >= 65_536
    assert long.startup_lines()[1] == "Maximum concurrency for 131,072 tokens per request: 7.61x"
    laptop = load_profile("laptop")
    assert laptop.max_model_len < 65_536
    assert f"{laptop.max_model_len:,}" in laptop.description


def test_a_profile_states_its_tokenizers_split_of_words_as_shares() -> None:
    base = 'name = "x"\nmodel = "llama-3.1-8b"\ngpu = "h100"\nmax_model_len = 4096\n'
    assert parse_profile(base, "x.toml").word_pieces == (1.0,)
    split = parse_profile(base + "[tokenizer]\nword_pieces = [184, 39, 30, 3, 2]\n", "x.toml")
    assert sum(split.word_pieces) == pytest.approx(1.0)
    assert split.word_pieces[0] == pytest.approx(184 / 258)
    named = parse_profile(base + "[tokenizer.word_tokens]\nthe = 1\nprefix = 2\n", "x.toml")
    assert named.word_tokens == (("prefix", 2), ("the", 1))


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("word_pieces = [0.5, -0.1]", "none negative"),
        ("word_pieces = [0, 0]", "not all zero"),
        ("word_pieces = []", "word_pieces"),
        (f"word_pieces = [{', '.join(['0.1'] * 17)}]", "word_pieces"),
        ("word_pieces = [nan]", "word_pieces"),
        ("pieces = [1]", "pieces"),
        ("[tokenizer.word_tokens]\nthe = 0", "word_tokens counts from 1"),
        ("[tokenizer.word_tokens]\nthe = 99", "word_tokens counts from 1"),
    ],
)
def test_a_bad_tokenizer_table_is_one_clear_error(table: str, says: str) -> None:
    text = f'name = "x"\nmodel = "llama-3.1-8b"\ngpu = "h100"\nmax_model_len = 4096\n[tokenizer]\n{table}\n'
    with pytest.raises(ConfigError, match=says):
        parse_profile(text, "x.toml")
