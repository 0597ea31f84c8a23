"""``agentload plan`` as a user runs it: tables for people, JSON for tools, one line and exit 2 for mistakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from agentload.capacity.planner import PLAN_FLAGS, AgentShape, PlanSpec
from agentload.cli.main import app

# Qwen3-235B's bf16 weights (470 GB) do not fit one GB300: fp4 weights (an NVFP4 checkpoint), fp8 KV.
QWEN_GB300 = [
    *("plan", "--model", "qwen3-235b-a22b", "--gpu", "gb300"),
    *("--kv-cache-dtype", "fp8", "--weight-dtype", "fp4"),
]
LAPTOP = [
    "plan",
    "--model",
    "qwen2.5-0.5b",
    "--gpu",
    "laptop",
    "--max-model-len",
    "16384",
    "--context-per-agent",
    "8192",
    "--pool-tokens",
    "65536",
]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _fails_cleanly(args: list[str], *needles: str) -> str:
    code, out = _run(*args)
    assert code == 2, out
    assert "Traceback" not in out
    error_lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, out
    for needle in needles:
        assert needle in error_lines[0]
    return error_lines[0]


def test_plan_prints_the_figures_and_the_serve_command() -> None:
    code, out = _run(*QWEN_GB300, "--no-curve")
    assert code == 0, out
    for needle in (
        "117.5 GB",
        "94 KiB",
        "GPU KV cache size: 1,449,792 tokens",
        "Maximum concurrency for 40,960 tokens per request: 35.40x",
        "vllm serve Qwen/Qwen3-235B-A22B",
        "--kv-cache-dtype fp8",
        "--max-num-seqs 35",
        "--enable-prompt-tokens-details",
        "where the numbers come from",
    ):
        assert needle in out
    assert "predicted throughput" not in out


def test_plan_with_curve_marks_the_knee() -> None:
    code, out = _run(*LAPTOP)
    assert code == 0, out
    assert "predicted throughput" in out
    assert "← knee" in out
    assert "knee: " in out


def test_json_is_the_plan_model() -> None:
    code, out = _run(*LAPTOP, "--offload-gib", "1", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["pool"]["startup_lines"][1] == "Maximum concurrency for 16,384 tokens per request: 4.00x"
    assert data["agents"]["window_aware_sessions"] == 8.0
    assert data["offload"]["extra_sessions"] > 0
    assert data["curve"]["knee"] >= 1
    assert any(f["flag"] == "--kv-offloading-size" for f in data["serve"]["flags"])


def test_hybrid_plan_shows_both_session_counts() -> None:
    code, out = _run("plan", "--model", "gemma-3-27b", "--gpu", "h200", "-c", "32768", "--no-curve")
    assert code == 0, out
    assert "naive: pool tokens ÷ context" in out
    assert "window-aware" in out
    assert "fixed per session" in out


def test_model_from_a_config_json_path(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    code, out = _run("plan", "--model", str(folder), "--gpu", "h100", "-c", "32768", "--no-curve", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["kv"]["bytes_per_token"] == 128 * 1024
    assert data["model"]["source"].endswith("config.json")
    assert any("estimated" in note for note in data["model"]["notes"])


def test_unknown_model_lists_the_known_ones() -> None:
    _fails_cleanly(["plan", "--model", "llama-9", "--gpu", "h100"], "unknown model 'llama-9'", "qwen3-235b-a22b")


def test_unknown_gpu_lists_the_known_ones() -> None:
    _fails_cleanly(["plan", "--model", "llama-3.1-8b", "--gpu", "h1000"], "unknown GPU 'h1000'", "gb300", "l40s")


def test_malformed_config_json_names_the_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}), encoding="utf-8")
    _fails_cleanly(["plan", "--model", str(path), "--gpu", "h100"], "missing field 'num_hidden_layers'")


def test_missing_config_json_says_so(tmp_path: Path) -> None:
    _fails_cleanly(["plan", "--model", str(tmp_path / "nope.json"), "--gpu", "h100"], "cannot read")


def test_weights_that_do_not_fit_say_so() -> None:
    _fails_cleanly(["plan", "--model", "qwen3-235b-a22b", "--gpu", "gb300"], "do not fit", "smaller weight dtype")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--gpus", "0"),
        ("--gpus", "-2"),
        ("--gpu-memory-utilization", "0"),
        ("--gpu-memory-utilization", "-0.5"),
        ("--context-per-agent", "0"),
        ("--max-model-len", "-1"),
        ("--offload-gib", "-1"),
        ("--pool-tokens", "0"),
        ("--output-tokens", "0"),
        ("--think-s", "-1"),
        ("--weight-dtype", "fp3"),
    ],
)
def test_bad_flag_values_exit_2_naming_the_flag(flag: str, value: str) -> None:
    _fails_cleanly([*QWEN_GB300, flag, value, "--no-curve"], flag)


# The source article's DeepSeek-V4-Flash runs (docs/deepseek-v4.md): its vLLM log lines are the expected output.
V4_FLASH = [
    *("plan", "--model", "deepseek-v4-flash", "--gpu", "dgx-station-gb300", "--kv-cache-dtype", "fp8"),
    "--no-curve",
]


@pytest.mark.parametrize(
    ("max_model_len", "pool", "logged", "concurrency"),
    [
        ("40960", ["--num-gpu-blocks", "76220"], "GPU KV cache size: 997,753 tokens", "24.36x"),
        ("1048576", ["--num-gpu-blocks", "74697"], "GPU KV cache size: 11,086,409 tokens", "10.57x"),
        ("256000", ["--num-gpu-blocks", "38724"], "GPU KV cache size: 2,497,693 tokens", "9.76x"),
    ],
)
def test_deepseek_v4_plan_prints_what_vllm_logged(
    max_model_len: str, pool: list[str], logged: str, concurrency: str
) -> None:
    code, out = _run(*V4_FLASH, "--max-model-len", max_model_len, *pool)
    assert code == 0, out
    assert logged in out
    assert f"Maximum concurrency for {int(max_model_len):,} tokens per request: {concurrency}" in out
    assert "accounting, not capacity" in out
    assert "fit while decoding" in out


def test_deepseek_v4_plan_from_the_logged_gib() -> None:
    code, out = _run(*V4_FLASH, "--max-model-len", "40960", "--kv-memory-gib", "74.66", "--json")
    assert code == 0, out
    pool = json.loads(out)["pool"]
    # 74.66 GiB ÷ 1,051,776 B per block id is 76,219.2: vLLM rounds the GiB it logs, its pool was 76,220.
    assert abs(pool["num_blocks"] - 76_220) / 76_220 < 1e-4
    assert abs(pool["tokens"] - 997_753) / 997_753 < 1e-4


def test_pool_stated_twice_is_one_error() -> None:
    _fails_cleanly([*V4_FLASH, "--num-gpu-blocks", "76220", "--kv-memory-gib", "74.66"], "state the pool once")


def test_every_flag_the_planner_names_is_an_option_of_the_command() -> None:
    # A bad value's message names the flag of PLAN_FLAGS (the planner's table): the command must declare that very
    # spelling, and the table may only name fields the spec has, or the message names a flag the user cannot type.
    command: Any = typer.main.get_command(app)  # typer's group (its own click): its commands, their params
    options = {name for param in command.commands["plan"].params for name in param.opts}
    assert set(PLAN_FLAGS.values()) <= options, set(PLAN_FLAGS.values()) - options
    fields = {*PlanSpec.model_fields, *(f"agent.{name}" for name in AgentShape.model_fields)}
    assert set(PLAN_FLAGS) <= fields, set(PLAN_FLAGS) - fields
