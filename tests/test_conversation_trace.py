"""Claude Code conversation traces: the reader's bad inputs, the session-tree replay on the simulator, the ceiling."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import typer

from agentload.bench.analysis import LevelData, summarise
from agentload.cli.common import clean_errors
from agentload.clock import run_virtual
from agentload.endpoint.records import RequestRecord
from agentload.errors import ConfigError
from agentload.report.levels import LEVEL_COLUMNS, Column
from agentload.workload import conversation_trace as ct
from agentload.workload.base import ReplayCeiling
from agentload.workload.conversation_trace import (
    ConversationTraceWorkload,
    is_conversation_trace,
    load_conversation_trace,
    prefix_ceiling,
    trace_ceiling,
)
from agentload.workload.registry import get_workload
from agentload.workload.trace import trace_workload
from tests.test_workload_harness import LevelRun, hit_rate, run_level, run_level_async, sim_server

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "claude_code_subagent_sample.json"
# The sample's prompts reach 48,732 tokens: a 131,072-token context, and a 997,753-token pool that holds two trees'
# ~175k distinct tokens without evicting any (an unlimited cache, as far as these tests go).
PROFILE = "qwen3-235b-gb300-128k"
SCALE = 0.01  # recorded waits times this: the sample's 800 s conversation in ~10 s


def sample() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SAMPLE.read_text(encoding="utf-8"))
    return doc


def write(tmp_path: Path, doc: object, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def by_session(records: list[RequestRecord]) -> dict[tuple[str, int], RequestRecord]:
    """(draw/context, turn) → record: ``agent-1/d0/c0.s0`` → ``d0/c0.s0``."""
    return {(r.ids.agent.split("/", 1)[1], r.ids.turn): r for r in records}


# -- the reader --------------------------------------------------------------------------------------------------


def test_the_sample_reads_as_one_tree_with_its_subagent_and_keeps_unknown_fields() -> None:
    trace = load_conversation_trace(SAMPLE)
    (tree,) = trace.trees
    assert [(c.key, c.start_s, len(c.requests)) for c in tree.contexts] == [("c0", 0.0, 5), ("c0.s0", 185.091, 10)]
    assert trace.block_size == (64,)
    assert tree.trace_scope  # its "hash_id_scope": "global": ids numbered across the file, read as ours
    assert "hash_id_scope" not in trace.extra[0]  # a field of the format, not an unknown one
    assert "_source" in trace.extra[0]
    parent = tree.contexts[0].requests
    # The parent's third request shares its first 337 blocks with the second; think times are the recorded ones.
    assert parent[2].hit_tokens == 337 * 64
    assert parent[2].wait_s == 15.0
    assert tree.contexts[1].requests[0].hit_tokens == 0  # the subagent starts cold


def test_a_missing_think_time_is_the_gap_the_timestamps_leave(tmp_path: Path) -> None:
    doc = sample()
    for entry in (_request(doc, 1), _request(doc, 2)):
        del entry["think_time"]
    del _request(doc, 1)["api_time"]
    parent = load_conversation_trace(write(tmp_path, doc)).trees[0].contexts[0].requests
    assert parent[1].wait_s == pytest.approx(17.0 - 0.0 - 4.87)  # t 17 after t 0, whose reply took 4.87 s
    assert parent[2].wait_s == pytest.approx(35.0 - 17.0)  # the previous response time unknown: the whole gap


def test_the_format_is_told_from_jsonl_traces(tmp_path: Path) -> None:
    assert is_conversation_trace(SAMPLE)
    assert is_conversation_trace(write(tmp_path, [sample()]))  # an array of conversations
    assert is_conversation_trace(write(tmp_path, sample(), "compact.json"))  # one line
    assert not is_conversation_trace(DATA / "mooncake_sessions.jsonl")
    assert not is_conversation_trace(DATA / "sessions_small.jsonl")
    assert isinstance(trace_workload(SAMPLE), ConversationTraceWorkload)


def _request(doc: dict[str, Any], *path: int) -> dict[str, Any]:
    entry: dict[str, Any] = doc
    for i in path:
        entry = entry["requests"][i]
    return entry


BAD: list[tuple[str, Any, str]] = [
    ("negative time", lambda d: _request(d, 1).update(t=-1.0), r"conversation 0 \(02f3098e-6bc\): requests\[1\]\.t:"),
    (
        "negative think",
        lambda d: _request(d, 3, 2).update(think_time=-2.0),
        r"requests\[3\]\.requests\[2\]\.think_time",
    ),
    ("fractional hash id", lambda d: _request(d, 0)["hash_ids"].__setitem__(5, 5.5), r"requests\[0\]\.hash_ids\[5\]"),
    ("text hash id", lambda d: _request(d, 3, 0)["hash_ids"].__setitem__(0, "762"), r"requests\[3\]\.requests\[0\]"),
    ("bool hash id", lambda d: _request(d, 0)["hash_ids"].__setitem__(0, True), r"requests\[0\]\.hash_ids\[0\]"),
    (
        "subagent without requests",
        lambda d: _request(d, 3).update(requests=[]),
        r"requests\[3\]\.requests: .*at least 1",
    ),
    ("in as text", lambda d: _request(d, 4).update({"in": "48248"}), r"requests\[4\]\.in"),
    ("no block size", lambda d: d.pop("block_size"), r"conversation 0 \(02f3098e-6bc\): block_size: Field required"),
    ("more blocks than tokens", lambda d: _request(d, 0).update({"in": 640}), r"requests\[0\]\.hash_ids: 335 blocks"),
    ("no requests", lambda d: d.update(requests=[]), r"requests: .*at least 1"),
]


@pytest.mark.parametrize(("case", "spoil", "needle"), BAD, ids=[b[0] for b in BAD])
def test_each_malformed_conversation_is_one_error_naming_file_request_and_field(
    tmp_path: Path, case: str, spoil: Any, needle: str
) -> None:
    doc = sample()
    spoil(doc)
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError, match=needle) as info:
        load_conversation_trace(path)
    assert str(path) in str(info.value)


def test_the_second_conversation_of_an_array_is_named_by_its_index(tmp_path: Path) -> None:
    bad = copy.deepcopy(sample())
    _request(bad, 2)["out"] = -1
    with pytest.raises(ConfigError, match=r"conversation 1 \(02f3098e-6bc\): requests\[2\]\.out"):
        load_conversation_trace(write(tmp_path, [sample(), bad]))
    with pytest.raises(ConfigError, match="conversation 1: expected a JSON object, got int"):
        load_conversation_trace(write(tmp_path, [sample(), 7]))


def test_truncated_non_finite_nested_and_oversized_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = SAMPLE.read_text(encoding="utf-8")
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{cut}: not valid JSON"):
        get_workload(f"trace:{cut}")
    nan = tmp_path / "nan.json"
    nan.write_text(text.replace('"think_time": 12.0', '"think_time": NaN', 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="NaN is not a number"):
        load_conversation_trace(nan)
    deep = sample()
    inner = _request(deep, 3)
    for _ in range(ct.MAX_DEPTH):  # subagents of subagents, one level past the limit
        inner["requests"].append({"type": "subagent", "t": 1.0, "requests": [dict(_request(deep, 0))]})
        inner = inner["requests"][-1]
    with pytest.raises(ConfigError, match=f"nested deeper than {ct.MAX_DEPTH}"):
        load_conversation_trace(write(tmp_path, deep))
    monkeypatch.setattr(ct, "MAX_DOCUMENT_BYTES", 1000)
    with pytest.raises(ConfigError, match="larger than 0 MiB, the most agentload reads"):
        load_conversation_trace(SAMPLE)


def test_a_bad_trace_through_the_command_line_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = sample()
    _request(doc, 1)["t"] = -5
    path = write(tmp_path, doc)
    with pytest.raises(typer.Exit) as info, clean_errors():
        get_workload(f"trace:{path}")
    assert info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "requests[1].t" in err
    assert "Traceback" not in err


def test_options_are_checked() -> None:
    assert get_workload(f"trace:{SAMPLE}", time_scale=0.5).time_scale == 0.5  # type: ignore[attr-defined]
    with pytest.raises(
        ConfigError, match=r"unknown trace option speed for a conversation trace .*its options: time_scale, start"
    ):
        get_workload(f"trace:{SAMPLE}", speed=2.0)
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ConfigError, match="time_scale must be a number"):
            get_workload(f"trace:{SAMPLE}", time_scale=bad)


# -- the replay --------------------------------------------------------------------------------------------------


def replay(agents: int, requests: int, **options: Any) -> tuple[ConversationTraceWorkload, LevelRun]:
    workload = get_workload(f"trace:{SAMPLE}", time_scale=SCALE, **options)
    assert isinstance(workload, ConversationTraceWorkload)
    run = run_level(workload, agents, context=0, server=sim_server(PROFILE), stop_after_requests=requests)
    return workload, run


def test_the_server_reaches_the_traces_own_ceiling_on_an_unlimited_pool() -> None:
    workload, run = replay(2, 30)
    assert all(r.ok for r in run.records)
    # Two whole trees (15 requests each): the ceiling of what was replayed is the trace's own.
    assert len(run.records) == 30
    ceiling = prefix_ceiling(workload.trace, run.records)
    assert ceiling == pytest.approx(trace_ceiling(workload.trace))
    assert ceiling == pytest.approx(0.7559, abs=1e-4)  # the sample's own: 198,896 of 263,111 prompt tokens
    measured = hit_rate(run.records)
    assert ceiling is not None
    assert measured == pytest.approx(ceiling, abs=0.01)
    assert measured <= ceiling + 1e-9  # text of the request's own after its blocks: no hit the trace lacks
    # Each request's size is the trace's: its ``in`` as the server counts it, its ``out`` exactly.
    sent = by_session(run.records)
    for draw in ("d0", "d1"):
        for context in workload.trace.trees[0].contexts:
            for turn, request in enumerate(context.requests):
                record = sent[(f"{draw}/{context.key}", turn)]
                assert abs(record.prompt_tokens - request.tokens) <= 2, (context.key, turn)
                assert record.completion_tokens == request.out
    assert sorted(s.ok for s in run.sessions) == [True, True]  # one session per tree


def test_subagents_are_children_spawned_at_their_time_and_turns_wait_their_think_time() -> None:
    _, run = replay(1, 15)
    sent = by_session(run.records)
    parent, child = sent[("d0/c0", 0)], sent[("d0/c0.s0", 0)]
    assert child.t_sent - parent.t_sent == pytest.approx(185.091 * SCALE, abs=1e-6)
    # The child runs beside its parent, which goes on with its own turns meanwhile.
    assert parent.t_done < child.t_sent < sent[("d0/c0", 4)].t_sent
    assert child.t_sent < sent[("d0/c0", 3)].t_done
    assert sent[("d0/c0", 1)].t_sent - parent.t_done == pytest.approx(12.0 * SCALE, abs=1e-6)
    assert sent[("d0/c0", 4)].t_sent - sent[("d0/c0", 3)].t_done == pytest.approx(318.0 * SCALE, abs=1e-6)
    # Its own cache context: the child's first prompt finds nothing of the parent's cached.
    assert (child.cached_tokens or 0) < 16


def test_each_draw_is_salted_afresh_and_blocks_repeat_only_within_a_context() -> None:
    _, run = replay(2, 30)
    bodies = {(r.ids.agent.split("/", 1)[1], r.ids.turn): b for r, b in zip(run.records, run.bodies, strict=True)}

    def text(key: str, turn: int) -> str:
        content: str = bodies[(key, turn)]["messages"][0]["content"]
        return content

    first, again = text("d0/c0", 0).split(), text("d1/c0", 0).split()
    assert len(first) == len(again)
    assert first[:64] != again[:64]
    # Within a draw, the next request opens with the 335 blocks the trace says it shares.
    assert text("d0/c0", 1).split()[: 335 * 64] == first[: 335 * 64]
    assert text("d0/c0.s0", 0).split()[:64] != first[:64]
    sent = by_session(run.records)
    assert (sent[("d1/c0", 0)].cached_tokens or 0) < 16  # the second draw found nothing of the first


def test_another_level_or_run_sends_other_text() -> None:
    """The same seed and draw at another level, or in another run, is another text: nothing of it is warm."""
    workload = get_workload(f"trace:{SAMPLE}", time_scale=SCALE)

    async def first_prompt(level: int, run_id: str) -> Any:
        run = await run_level_async(sim_server(PROFILE), workload, 1, context=0, level=level, run_id=run_id,
                                    stop_after_requests=1)  # fmt: skip
        return run.bodies[0]["messages"]

    base = run_virtual(first_prompt(0, "run-a"))
    assert run_virtual(first_prompt(0, "run-a")) == base  # the same level of the same run: the same words
    assert run_virtual(first_prompt(1, "run-a")) != base
    assert run_virtual(first_prompt(0, "run-b")) != base


def test_the_level_summary_and_table_show_the_ceiling_beside_the_measured_rate() -> None:
    workload, run = replay(2, 30)
    t0 = min(r.t_sent for r in run.records)
    assert isinstance(workload, ReplayCeiling)  # what bench's runner looks for to give the level its ceiling
    data = LevelData(0, 2, 0, workload.name, 0.0, 0.0, run.ended_at + 1, records=run.records, t0=t0,
                     ceiling=workload.ceiling)  # fmt: skip
    summary = summarise(data)
    assert summary.prefix_hit_ceiling == pytest.approx(prefix_ceiling(workload.trace, run.records))
    assert summary.prefix_hit_rate_usage == pytest.approx(summary.prefix_hit_ceiling, abs=0.01)
    column = next(c for c in LEVEL_COLUMNS if isinstance(c, Column) and c.header == "trace\nceiling")
    assert column.cell(summary) == "75.6%"
    other = summarise(LevelData(0, 2, 0, "agentic", 0.0, 0.0, run.ended_at + 1, records=run.records, t0=t0))
    assert other.prefix_hit_ceiling is None
