"""``bench --same-text``: two runs with the same seed send the same words; without it each run draws its own.

The profile's tokenizer splits words as a real one does (a word costs 1, 2 or 3 tokens by its hash), so the server's
prompt counts tell whether two runs sent the same text: on the simulator's default one-token-a-word tokenizer any two
texts of the same length would count the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agentload.cli.main import app

PROFILE = """
name = "split-words"
model = "qwen2.5-0.5b"
gpu = "laptop"
max_model_len = 4096

[kv_pool]
num_blocks = 777

[tokenizer]
word_pieces = [0.5, 0.3, 0.2]
"""


def _prompts(tmp_path: Path, profile: Path, *extra: str) -> list[tuple[str, int, int]]:
    """(agent, turn, prompt tokens the server counted) of every answered request of one bench run, in order."""
    out = tmp_path / "runs"
    args = ["bench", "--sim", str(profile), "--agents", "2", "--context", "3000", "--warmup", "2s", "--window", "30s",
            "--out", str(out), "--json", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run_dir = out / json.loads(result.stdout)["run_id"]
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    seen = [(r["ids"]["agent"], r["ids"]["turn"], r["prompt_tokens"]) for r in records if r.get("prompt_tokens")]
    assert len(seen) >= 8  # enough turns that two different texts cannot count the same by chance
    return sorted(seen)


def test_same_text_sends_the_same_words_in_two_runs_and_each_run_draws_its_own_without_it(tmp_path: Path) -> None:
    profile = tmp_path / "split.toml"
    profile.write_text(PROFILE)
    first, second = _prompts(tmp_path, profile, "--same-text"), _prompts(tmp_path, profile, "--same-text")
    assert first == second
    salted, salted_again = _prompts(tmp_path, profile), _prompts(tmp_path, profile)
    assert salted != salted_again
    assert salted != first
