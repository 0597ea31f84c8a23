"""Request-trace formats beside Mooncake (Qwen-Bailian, BurstGPT, Azure) read from real samples, their bad rows,
format detection, and a trace shorter than a level (looped with fresh text, or refused — never an empty level)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.bench.orchestrate import BenchPlan, run_bench
from agentload.bench.target import sim_target
from agentload.cli.main import app
from agentload.clock import run_virtual
from agentload.endpoint.records import RequestRecord
from agentload.errors import ConfigError
from agentload.workload.registry import get_workload
from agentload.workload.trace import (
    BAILIAN_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    MooncakeTrace,
    MooncakeWorkload,
    SessionReplayWorkload,
    fit_to_level,
    load_trace,
    trace_workload,
)
from tests.test_workload_harness import run_level

DATA = Path(__file__).parent / "data"
BLOCK = 16  # the simulator's KV block


def request_trace(path: Path) -> MooncakeTrace:
    trace = load_trace(path)
    assert isinstance(trace, MooncakeTrace)
    return trace


def by_key(records: list[RequestRecord]) -> dict[tuple[str, int], RequestRecord]:
    return {(r.ids.agent.split("/", 1)[1], r.ids.turn): r for r in records}


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return path


# -- the samples ---------------------------------------------------------------------------------------------------


def test_mooncake_conversation_sample_reads_with_512_token_blocks() -> None:
    trace = request_trace(DATA / "mooncake_conversation_sample.jsonl")
    assert (trace.format, trace.block_tokens, len(trace.rows)) == ("mooncake", MOONCAKE_BLOCK_TOKENS, 30)
    assert Counter(r.timestamp for r in trace.rows) == {0.0: 10, 3000.0: 16, 5999.0: 3, 9000.0: 1}
    first, last = trace.rows[0], trace.rows[-1]
    assert (first.input_length, first.output_length, len(first.hash_ids)) == (6758, 500, 14)
    assert (last.input_length, last.output_length) == (10355, 584)
    # Every request of the conversation trace opens with block 0 (one shared system prompt), and names one block
    # per 512 tokens of its input.
    assert all(r.hash_ids[0] == 0 for r in trace.rows)
    assert all(len(r.hash_ids) == -(-r.input_length // MOONCAKE_BLOCK_TOKENS) for r in trace.rows)


def test_bailian_sample_reads_its_chains_as_sessions_with_16_token_blocks() -> None:
    trace = request_trace(DATA / "bailian_sample.jsonl")
    assert (trace.format, trace.block_tokens, len(trace.rows)) == ("bailian", BAILIAN_BLOCK_TOKENS, 6)
    # chat 1 → 2 → 4 is one session; chat 5's parent (77) is not in the file: it is a session of its own.
    assert [r.session_id for r in trace.rows] == ["chat0", "chat1", "chat1", "chat3", "chat1", "chat77"]
    assert [r.timestamp for r in trace.rows] == [0.0, 750.0, 9500.0, 11000.0, 30250.0, 31000.0]
    assert (trace.rows[0].input_length, trace.rows[0].output_length) == (502, 1494)


def test_bailian_replay_shares_16_token_blocks_and_sends_a_chain_in_order() -> None:
    run = run_level(trace_workload(DATA / "bailian_sample.jsonl"), 2, context=0)
    assert all(r.ok for r in run.records)
    assert len(run.records) == 6
    turns = by_key(run.records)
    t0 = min(r.t_sent for r in run.records)
    c1, c2, c4 = (turns[("session:chat1", i)] for i in range(3))
    assert c1.t_sent - t0 == pytest.approx(0.75, abs=1e-3)
    assert c2.t_sent >= c1.t_done
    assert c2.t_sent - t0 >= 9.5 - 1e-3
    assert c4.t_sent >= c2.t_done
    assert c4.t_sent - t0 >= 30.25 - 1e-3
    # Shared leading blocks of 16 tokens: chat 3 shares one with chat 1, chat 2 six, chat 4 eleven (within the
    # simulator's block, where the end-of-message marker falls). With Mooncake's 512-token blocks chat 3 would
    # have shared its whole prompt.
    search = turns[("session:chat3", 0)]
    for record, blocks in ((search, 1), (c2, 6), (c4, 11)):
        assert abs((record.cached_tokens or 0) - blocks * BAILIAN_BLOCK_TOKENS) <= BLOCK, (record.ids, blocks)
    assert [r.prompt_tokens for r in (c1, c2, search, c4)] == [100, 190, 60, 260]


def test_burstgpt_sample_reads_sizes_and_times_and_shares_nothing() -> None:
    trace = request_trace(DATA / "burstgpt_sample.csv")
    assert (trace.format, trace.skipped) == ("burstgpt", 0)
    assert [(r.timestamp, r.input_length, r.output_length, r.hash_ids) for r in trace.rows] == [
        (5000.0, 472, 18, []),
        (45000.0, 1087, 230, []),
        (118000.0, 417, 276, []),
    ]
    run = run_level(trace_workload(DATA / "burstgpt_sample.csv", speed=10.0), 1, context=0)
    t0 = min(r.t_sent for r in run.records)
    sent = sorted((round(r.t_sent - t0, 3), r.prompt_tokens, r.completion_tokens) for r in run.records)
    assert sent == [(0.0, 472, 18), (4.0, 1087, 230), (11.3, 417, 276)]
    # No hash ids: every prompt is its own, so nothing past the chat template is found cached.
    assert all((r.cached_tokens or 0) < BLOCK for r in run.records)


@pytest.mark.parametrize(
    ("name", "rows", "first", "last", "last_at_s"),
    [
        ("azure_conv_sample.csv", 20, (374, 44), (1353, 142), 13.0250880),
        ("azure_code_sample.csv", 15, (4808, 10), (1827, 10), 29.6103250),
    ],
)
def test_azure_samples_read_sizes_and_times(
    name: str, rows: int, first: tuple[int, int], last: tuple[int, int], last_at_s: float
) -> None:
    trace = request_trace(DATA / name)
    assert (trace.format, len(trace.rows)) == ("azure", rows)
    assert (trace.rows[0].input_length, trace.rows[0].output_length) == first
    assert (trace.rows[-1].input_length, trace.rows[-1].output_length) == last
    t0, tn = trace.rows[0].timestamp, trace.rows[-1].timestamp
    assert t0 is not None
    assert tn is not None
    # TIMESTAMP carries seven fractional digits; the microseconds survive.
    assert (tn - t0) / 1000 == pytest.approx(last_at_s, abs=1e-6)


def test_azure_replay_keeps_the_arrival_gaps() -> None:
    run = run_level(trace_workload(DATA / "azure_code_sample.csv", speed=4.0), 3, context=0)
    assert len(run.records) == 15
    assert all(r.ok for r in run.records)
    t0 = min(r.t_sent for r in run.records)
    # The 13th request came 29.479069 s after the first; at four times the speed, 7.37 s.
    assert sorted(r.t_sent - t0 for r in run.records)[12] == pytest.approx(29.479069 / 4, abs=1e-3)


def test_zero_token_rows_are_failures_skipped_and_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n6,ChatGPT,300,0,300,API log\n7,GPT-4,0,0,0,API log\n",
    )
    trace = request_trace(path)
    assert (len(trace.rows), trace.skipped) == (1, 2)
    only_failures = write(tmp_path, "f.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,7\n")
    with pytest.raises(ConfigError, match="no replayable row"):
        load_trace(only_failures)


# -- bad rows: one error naming the file, the line and the field ------------------------------------------------------

BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BURST + "45,ChatGPT,12.5,230,1317,Conversation log\n", "b.csv:3: Request tokens must be a whole number"),
        (BURST + "45,ChatGPT,-3,230,1317,Conversation log\n", "b.csv:3: Request tokens must be a whole number"),
        (BURST + "45,ChatGPT,100,lots,1317,Conversation log\n", "b.csv:3: Response tokens must be a whole number"),
        (BURST + "soon,ChatGPT,100,20,120,Conversation log\n", "b.csv:3: Timestamp must be seconds"),
        (BURST + "inf,ChatGPT,100,20,120,Conversation log\n", "b.csv:3: Timestamp must be finite"),
        (BURST + "45,ChatGPT,3000000,20,120,Conversation log\n", "b.csv:3: Request tokens 3,000,000 is above"),
        (BURST + "45,ChatGPT,100\n", "b.csv:3: 3 columns where the header has 6"),
        (AZURE + "yesterday,374,44\n", "b.csv:3: TIMESTAMP must read like"),
        (AZURE + "2023-13-16 18:15:46.1,374,44\n", "b.csv:3: TIMESTAMP must read like"),
        ("Time,Prompt,Reply\n1,2,3\n", "b.csv:1: a CSV header of no known trace format"),
        ("", "b.csv: the trace is empty"),
    ],
)
def test_a_bad_csv_row_is_one_error_naming_its_line_and_column(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_trace(write(tmp_path, "b.csv", text))


def bailian(**row: object) -> str:
    base: dict[str, object] = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 20,
                               "output_length": 4, "type": "text", "turn": 1, "hash_ids": [1, 2]}  # fmt: skip
    return json.dumps({**base, **row}) + "\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (bailian() + bailian(chat_id=2, input_length="20"), "t.jsonl:2: input_length"),
        (bailian() + bailian(chat_id=2, timestamp=-1), "t.jsonl:2: timestamp"),
        (bailian() + bailian(chat_id=2, parent_chat_id=-5), "t.jsonl:2: parent_chat_id"),
        (bailian() + bailian(), "t.jsonl:2: chat_id 1 appears twice"),
        (bailian() + bailian(chat_id=2, parent_chat_id=1, timestamp=0.1), "t.jsonl:2: timestamp 100 is before"),
        (
            bailian() + '{"timestamp": 1, "input_length": 5, "output_length": 1}\n',
            "t.jsonl:2: a mooncake line in a bai",
        ),
    ],
)
def test_a_bad_bailian_row_is_one_error_naming_its_line_and_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_trace(write(tmp_path, "t.jsonl", text))


def test_a_bad_csv_trace_ends_bench_with_one_error_line(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", BURST + "45,ChatGPT,12.5,230,1317,Conversation log\n")
    args = ["bench", "--sim", "qwen3-235b-gb300", "--agents", "1", "--workload", f"trace:{path}"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    assert "b.csv:3: Request tokens" in result.output
    assert "Traceback" not in result.output


def test_mangled_csv_samples_end_in_a_trace_or_one_config_error(tmp_path: Path) -> None:
    rng = random.Random(7)
    for name in ("burstgpt_sample.csv", "azure_code_sample.csv"):
        clean = (DATA / name).read_bytes()
        for _ in range(150):
            data = bytearray(clean)
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] = rng.choice(b'0-9.,"\n\r\x00\xff e:')
            path = tmp_path / name
            path.write_bytes(bytes(data))
            try:
                outcome = "read" if isinstance(load_trace(path), MooncakeTrace) else "other"
            except ConfigError as exc:  # one error, naming the file: never a traceback
                outcome = "refused" if name in str(exc) else str(exc)
            assert outcome in ("read", "refused")


# -- detection -----------------------------------------------------------------------------------------------------


def test_formats_are_told_apart_by_name_header_and_fields(tmp_path: Path) -> None:
    # A CSV trace saved without .csv is still read by its header.
    assert request_trace(write(tmp_path, "burst.txt", BURST)).format == "burstgpt"
    assert request_trace(write(tmp_path, "az.log", AZURE)).format == "azure"
    assert request_trace(write(tmp_path, "bom.csv", "\ufeff" + AZURE)).format == "azure"  # a spreadsheet's export
    # Columns are found by name: order and extra columns do not matter.
    reordered = "Log Type,Response tokens,Request tokens,Timestamp\nAPI log,18,472,5\n"
    row = request_trace(write(tmp_path, "r.csv", reordered)).rows[0]
    assert (row.timestamp, row.input_length, row.output_length) == (5000.0, 472, 18)
    # JSONL: chat_id + parent_chat_id is Bailian, turns a session trace, anything else Mooncake.
    assert request_trace(write(tmp_path, "b.jsonl", bailian())).format == "bailian"
    mooncake = '{"timestamp": 0, "input_length": 5, "output_length": 1, "chat_id": 3}\n'
    assert request_trace(write(tmp_path, "m.jsonl", mooncake)).format == "mooncake"
    assert not isinstance(load_trace(DATA / "sessions_small.jsonl"), MooncakeTrace)


# -- a trace shorter than a level ------------------------------------------------------------------------------------


def short_trace(tmp: Path, rows: int = 60, span_ms: int = 51_000) -> Path:
    """``rows`` requests evenly over ``span_ms``, each opening with the same block."""
    lines = [
        json.dumps(
            {
                "timestamp": round(i * span_ms / (rows - 1)),
                "input_length": 600 + 7 * i,
                "output_length": 24,
                "hash_ids": [1, 1000 + i],
            }
        )
        for i in range(rows)
    ]
    return write(tmp, "small.jsonl", "\n".join(lines) + "\n")


def test_a_trace_shorter_than_the_level_is_looped_and_every_level_measures_turns(tmp_path: Path) -> None:
    workload = get_workload(f"trace:{short_trace(tmp_path)}")
    note = fit_to_level(workload, 60.0, 30.0)
    assert note is not None
    assert "lasts 51 s" in note
    assert "needs 90 s (60 s warm-up + 30 s window)" in note
    plan = BenchPlan(make_target=lambda: sim_target("llama-8b-h100"), workload=workload, contexts=[40_960],
                     mode="sweep", agents=[1, 4], warmup_s=60.0, window_s=30.0)  # fmt: skip
    result = run_virtual(run_bench(plan))[0]
    # The trace ended inside the warm-up: replayed once, both windows were empty (0 turns, yet a verdict).
    # Looped, each window holds the trace's rate: 60 rows in 51 s + one gap, ~1.15 a second.
    assert [lvl.agents for lvl in result.levels] == [1, 4]
    for lvl in result.levels:
        assert lvl.turns >= 30, lvl
        assert lvl.requests_failed == 0, lvl


def test_looping_a_trace_resalts_each_pass(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "two.jsonl",
        '{"timestamp": 0, "input_length": 800, "output_length": 8, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1000, "input_length": 800, "output_length": 8, "hash_ids": [1, 3]}\n',
    )
    run = run_level(trace_workload(path, repeat=True), 1, context=0, duration_s=9.5)
    keys = [k for k, _ in sorted(by_key(run.records).items(), key=lambda kv: kv[1].t_sent)]
    # Two rows, a pass every 2 s (the trace's second and one gap): five passes in 9.5 s, later ones marked @n.
    assert keys == [(f"row{line}" + (f"@{lap}" if lap else ""), 0) for lap in range(5) for line in (1, 2)]
    turns = by_key(run.records)
    for lap in range(5):
        suffix = f"@{lap}" if lap else ""
        first, second = turns[(f"row1{suffix}", 0)], turns[(f"row2{suffix}", 0)]
        # Within a pass the second row shares block 1 (512 tokens) with the first; a pass finds nothing of the
        # pass before it cached, though its rows name the same hash ids.
        assert (first.cached_tokens or 0) < BLOCK
        assert abs((second.cached_tokens or 0) - MOONCAKE_BLOCK_TOKENS) <= BLOCK


def test_without_repeat_a_short_trace_is_refused_with_both_lengths(tmp_path: Path) -> None:
    workload = trace_workload(short_trace(tmp_path), repeat=False, speed=2.0)
    assert isinstance(workload, MooncakeWorkload)
    with pytest.raises(ConfigError, match=r"lasts 26 s at speed 2 but a level needs 420 s \(120 s warm-up"):
        fit_to_level(workload, 120.0, 300.0)
    # A trace that outlasts the level is left as it is.
    assert fit_to_level(workload, 5.0, 10.0) is None
    assert fit_to_level(get_workload("agentic-hold"), 120.0, 300.0) is None


def test_a_short_session_trace_is_looped_or_refused() -> None:
    looped = trace_workload(DATA / "sessions_small.jsonl")
    assert isinstance(looped, SessionReplayWorkload)
    assert looped.span_s < 420
    note = fit_to_level(looped, 120.0, 300.0)
    assert note is not None
    assert "lasts at least" in note
    run = run_level(looped, 1, context=0, duration_s=3 * looped.span_s + 60)
    # Replayed more than once: more sessions than the trace holds.
    assert len(run.sessions) > len(looped.trace.sessions)
    with pytest.raises(ConfigError, match="a level needs 420 s"):
        fit_to_level(trace_workload(DATA / "sessions_small.jsonl", repeat=False), 120.0, 300.0)
