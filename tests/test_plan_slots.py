"""``agentload plan --slots N``: llama.cpp's question (llama-server -np N), answered with hand arithmetic.

Llama-3.1-8B keeps 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 131,072 B = 128 KiB of KV per token
(the worked number in docs/background.md §5). A slot of 32,768 tokens therefore allocates 32,768 × 128 KiB = 4 GiB =
4,294,967,296 B, and 4 slots 16 GiB = 17,179,869,184 B (llama.cpp allocates all of -c at start). Its weights in
int8 are its 8.03 B parameters × 1 byte = 8.03 GB; one L40S has 48 GB, so beside the weights and the planner's
default 2 GiB of activations (2,147,483,648 B) it holds ⌊(48e9 − 8.03e9 − 2,147,483,648) ÷ 4,294,967,296⌋ =
⌊8.80⌋ = 8 such slots.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from agentload.capacity.planner import PLAN_FLAGS, parse_spec, plan
from agentload.cli.main import app
from agentload.errors import ConfigError
from agentload.sim.curve import add_throughput_curve

L40S_8B = {"model": "llama-3.1-8b", "gpu": "l40s", "weight_dtype": "int8", "slot_context": 32768}
CLI_8B = ["plan", "--model", "llama-3.1-8b", "--gpu", "l40s", "--weight-dtype", "int8", "--slot-context", "32768"]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_four_slots_of_32k_on_an_l40s() -> None:
    p = plan(parse_spec({**L40S_8B, "slots": 4, "context_per_agent": 16384}, PLAN_FLAGS))
    s = p.slots
    assert s is not None
    assert p.kv.bytes_per_token == 131_072
    assert (s.slots, s.slot_context, s.total_context) == (4, 32768, 131_072)
    assert s.kv_bytes_per_slot == 4_294_967_296
    assert s.kv_gb_all_slots == pytest.approx(17.179869184)
    assert s.weights_gb == pytest.approx(8.03)
    assert (s.slots_memory_allows, s.fits_memory) == (8, True)
    # Agents that fit = the slots, whatever the memory; the per-agent figures all say 4.
    assert s.agents_that_fit == p.agents.recommended_agents == 4
    assert p.agents.estimate == p.agents.shared_prefix_sessions == 4.0  # no prefix is shared across slots
    assert "slots_full" in s.past_slots
    assert "waits for one" in s.past_slots
    assert p.serve.command_line() == "llama-server -m llama-3.1-8b.gguf -np 4 -c 131072 -ngl 999 --metrics --slots"
    assert s.startup_line == "load_model: initializing, n_slots = 4, n_ctx_slot = 32768, kv_unified = 'false'"


def test_more_slots_than_the_memory_holds_are_flagged() -> None:
    # 16 slots × 4 GiB = 64 GiB of KV beside 8.03 GB of weights on a 48 GB card: the memory holds 8 (above).
    p = plan(parse_spec({**L40S_8B, "slots": 16}, PLAN_FLAGS))
    assert p.slots is not None
    assert (p.slots.slots_memory_allows, p.slots.fits_memory, p.slots.agents_that_fit) == (8, False, 16)
    code, out = _run(*CLI_8B, "--slots", "16", "--no-curve")
    assert code == 0, out
    assert "llama-server would fail to allocate -c" in " ".join(out.split())


def test_an_fp8_kv_cache_becomes_q8_0_and_halves_the_slot() -> None:
    p = plan(parse_spec({**L40S_8B, "slots": 4, "kv_cache_dtype": "fp8"}, PLAN_FLAGS))
    assert p.slots is not None
    assert p.slots.kv_bytes_per_slot == 2_147_483_648  # 32,768 × 64 KiB
    assert "-ctk q8_0 -ctv q8_0" in p.serve.command_line()


def test_the_cli_prints_the_slot_plan_and_json() -> None:
    code, out = _run(*CLI_8B, "--slots", "4", "--context-per-agent", "16384", "--no-curve")
    assert code == 0, out
    flat = " ".join(out.split())
    assert re.search(r"agents that fit\W+4\W+one per slot", out)
    for needle in (
        "--slot-prompt-similarity",
        "4.3 GB",  # 4,294,967,296 B per slot
        "17.2 GB",  # all four
        "-np 4",
        "-c 131072",
        "past 4 agents:",
        "n_ctx_slot = 32768",
    ):
        assert needle in flat, needle
    assert "vllm serve" not in out
    code, out = _run(*CLI_8B, "--slots", "4", "--no-curve", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert (data["slots"]["agents_that_fit"], data["slots"]["total_context"]) == (4, 131072)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--slots", "0"], "--slots"),
        (["--slots", "-3"], "--slots"),
        (["--slot-context", "0", "--slots", "2"], "--slot-context"),
        (["--slots", "4", "--pool-tokens", "100000"], "drop --pool-tokens"),
        (["--slots", "4", "--offload-gib", "10"], "no CPU KV offload"),
        (["--slots", "4", "--max-model-len", "8192"], "give one"),
        (["--slots", "4", "--context-per-agent", "40000"], "does not fit a slot"),
        # llama.cpp splits layers across GPUs; sized with vLLM's tensor-parallel rules it over-stated the KV.
        (["--slots", "4", "--gpus", "16"], "--slots plans one GPU"),
    ],
)
def test_bad_slot_values_are_one_error_line(extra: list[str], needle: str) -> None:
    code, out = _run(*CLI_8B, *extra, "--no-curve")
    assert code == 2, out
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    assert needle in errors[0]


def test_slot_context_needs_slots() -> None:
    with pytest.raises(ConfigError, match="give --slots too"):
        parse_spec({"model": "llama-3.1-8b", "gpu": "l40s", "slot_context": 8192}, PLAN_FLAGS)


def test_the_simulated_curve_has_its_knee_at_the_slot_count() -> None:
    spec = parse_spec(
        {"model": "llama-3.1-8b", "gpu": "h100", "slots": 3, "slot_context": 8192, "context_per_agent": 8192},
        PLAN_FLAGS,
    )
    curve = add_throughput_curve(plan(spec)).curve
    assert curve is not None
    assert (curve.knee, curve.first_past_knee) == (3, 4)
    points = {p.agents: p for p in curve.points}
    # Past the slots a turn waits for a slot and re-prefills: the hit rate collapses, nothing is preempted.
    assert points[4].prefix_hit_rate < 0.5 * points[3].prefix_hit_rate
    assert points[4].mean_waiting > 0
    assert all(p.preemptions == 0 for p in curve.points)


def test_agents_whose_turns_do_not_overlap_share_one_slot_below_the_slot_count() -> None:
    """llama.cpp's similarity rule: an idle slot sharing > 10% of the prompt beats an empty one.

    A 0.5B model on an H100 answers a turn long before the other agent's next one, so with 2 agents on 3 slots the
    second agent's first turn takes the first agent's idle slot (their 2,000-token system prompt is 31% of its
    6,392-token prompt), and from then on each turn finds the other agent's conversation there: only the system
    prompt is reused, 2,000 of each 7,792-token prompt = 25.7%, while two slots stay empty.
    """
    spec = parse_spec({"model": "qwen2.5-0.5b", "gpu": "h100", "slots": 3, "slot_context": 8192}, PLAN_FLAGS)
    p = plan(spec)
    assert p.slots is not None
    assert any("--slot-prompt-similarity" in n for n in p.slots.notes)
    curve = add_throughput_curve(p, counts=[1, 2], refine=False).curve
    assert curve is not None
    points = {pt.agents: pt for pt in curve.points}
    assert points[2].prefix_hit_rate == pytest.approx(2000 / 7792, abs=0.005)
    assert points[1].prefix_hit_rate > 0.8
