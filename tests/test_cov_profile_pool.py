"""Serving profiles past ``test_profile``: the pool stated in GiB (vLLM's "Available KV cache memory" line) or in
blocks, one way only; calibrated coefficients pinned over the derived ones, checked; an inline GPU table; a
profile named by path. Pool figures are hand arithmetic on Qwen2.5-0.5B's KV shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentload.capacity.profile import KVPoolSpec, ProfileFile, load_profile, parse_profile, resolve
from agentload.errors import ConfigError

# Qwen2.5-0.5B: 24 layers × 2 KV heads × 64 dims × 2 (K, V) × 2 bytes = 12,288 bytes per token in bf16, so a
# 16-token block is 196,608 bytes.
BLOCK_BYTES = 196_608


def _spec(**fields: Any) -> ProfileFile:
    base: dict[str, Any] = {"name": "t", "model": "qwen2.5-0.5b", "gpu": "h100", "max_model_len": 4096}
    return ProfileFile(**{**base, **fields})


def test_a_pool_in_gib_is_blocks_of_that_many_bytes() -> None:
    profile = resolve(_spec(kv_pool=KVPoolSpec(available_gib=1.0)), "t")
    assert profile.num_blocks == 2**30 // BLOCK_BYTES == 5461
    assert profile.pool_tokens == 5461 * 16
    # vLLM logs the GiB to 0.01: the source says how many blocks that rounding is worth (0.005 GiB → 27 blocks).
    assert "±27 blocks" in profile.pool_source


def test_a_pool_in_gib_is_per_gpu() -> None:
    one = resolve(_spec(kv_pool=KVPoolSpec(available_gib=1.0)), "t")
    two = resolve(_spec(num_gpus=2, kv_pool=KVPoolSpec(available_gib=1.0)), "t")
    assert two.num_blocks == 2 * 2**30 // BLOCK_BYTES == 10922  # 14 heads and 2 KV heads split over 2
    assert two.num_blocks > one.num_blocks


def test_a_pool_in_blocks_is_taken_as_stated() -> None:
    profile = resolve(_spec(kv_pool=KVPoolSpec(num_blocks=1000)), "t")
    assert (profile.num_blocks, profile.pool_tokens) == (1000, 16_000)
    assert profile.pool_source == "stated in blocks by the profile"


@pytest.mark.parametrize(
    "pool",
    [{"tokens": 65536, "num_blocks": 4096}, {"num_blocks": 10, "available_gib": 1.0}],
)
def test_the_pool_is_stated_one_way(pool: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="state the pool one way, not"):
        KVPoolSpec(**pool)


def test_a_pool_past_what_the_simulator_holds_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"is more than the .* the simulator holds"):
        resolve(_spec(kv_pool=KVPoolSpec(available_gib=100_000.0)), "t")


def _toml(extra: str) -> str:
    return (
        f'name = "p"\nmodel = "qwen2.5-0.5b"\ngpu = "h100"\nmax_model_len = 4096\n[kv_pool]\nnum_blocks = 1000\n{extra}'
    )


def test_pinned_coefficients_replace_the_derived_ones() -> None:
    derived = parse_profile(_toml(""), "p.toml")
    pinned = parse_profile(_toml("[step.pinned]\nstep_s = 0.0025\n"), "p.toml")
    assert pinned.coefficients.step_s == 0.0025
    assert derived.coefficients.step_s != 0.0025
    # Only what was pinned changes.
    rest = {k: v for k, v in derived.coefficients.model_dump().items() if k != "step_s"}
    assert {k: v for k, v in pinned.coefficients.model_dump().items() if k != "step_s"} == rest


@pytest.mark.parametrize(
    ("pinned", "message"),
    [
        ("warp_s = 1.0\n", r"\[step.pinned\]: unknown coefficients warp_s"),
        ("step_s = inf\n", r"\[step.pinned\]: step_s must be finite numbers"),
        ("step_s = nan\n", r"\[step.pinned\]: step_s must be finite numbers"),
        ("step_s = -0.001\n", r"\[step.pinned\]: step_s"),  # a negative step time would run the clock backwards
    ],
)
def test_bad_pinned_coefficients_are_one_error(pinned: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_profile(_toml("[step.pinned]\n" + pinned), "p.toml")


def test_an_inline_gpu_table_is_read_and_checked() -> None:
    gpu = "[gpu]\nmemory_gb = 48\nbandwidth_gbps = 864\ntflops_bf16 = 181\n"
    text = _toml("").replace('gpu = "h100"\n', "") + gpu
    profile = parse_profile(text, "p.toml")
    assert (profile.gpu.name, profile.gpu.memory_gb) == ("p", 48)
    with pytest.raises(ConfigError, match=r"p\.toml \[gpu\]: .*bandwidth_gbps"):
        parse_profile(text.replace("bandwidth_gbps = 864", "bandwidth_gbps = 0"), "p.toml")


def test_an_unknown_weight_or_kv_dtype_is_refused() -> None:
    with pytest.raises(ConfigError, match="weight_dtype must be one of"):
        parse_profile('weight_dtype = "int2"\n' + _toml(""), "p.toml")
    with pytest.raises(ConfigError, match="unknown kv cache dtype 'int4'"):
        parse_profile('kv_cache_dtype = "int4"\n' + _toml(""), "p.toml")


def test_a_profile_is_loaded_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(_toml(""), encoding="utf-8")
    assert load_profile(str(path)).num_blocks == 1000
    with pytest.raises(ConfigError, match="cannot read profile"):
        load_profile(str(tmp_path / "absent.toml"))
