"""Conversation traces whose hash ids are numbered across the file (``hash_scope: "trace"``, as ``agentload record``
writes them): ids several conversations share are one text across the trees of a pass, and the ceiling counts it."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agentload.agent.loop import Request
from agentload.clock import run_virtual
from agentload.errors import ConfigError
from agentload.workload import conversation_trace as ct
from agentload.workload.conversation_trace import (
    ConversationTraceWorkload,
    load_conversation_trace,
    prefix_ceiling,
    trace_ceiling,
)
from tests.test_workload_harness import LevelRun, hit_rate, run_level, run_level_async, sim_server

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "claude_code_subagent_sample.json"
BLOCK = 64  # trace tokens per hash id; the simulator counts one token a word, so 64 words a block
SYSTEM = list(range(8))  # the system prompt's blocks, which every recorded session opens with


def _req(t: float, tokens: int, ids: list[int], think: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"t": t, "in": tokens, "out": 4, "hash_ids": ids}
    if think is not None:
        out["think_time"] = think
    return out


def recorded(scope: str | None = "trace") -> list[dict[str, Any]]:
    """Four sessions as the recorder numbers them (ids in order of first sight across the file): three open with
    the same eight system blocks, the third with a subagent that does too; the fourth says nothing of its scope."""
    doc: list[dict[str, Any]] = [
        {"id": "a", "block_size": BLOCK, "requests": [
            _req(0.0, 700, [*SYSTEM, 8, 9]), _req(5.0, 850, [*SYSTEM, 8, 9, 10, 11], think=1.0)]},
        {"id": "b", "block_size": BLOCK, "requests": [
            _req(0.0, 620, [*SYSTEM, 12]), _req(3.0, 1000, [*SYSTEM, 12, 13, 14], think=1.0)]},
        {"id": "c", "block_size": BLOCK, "requests": [
            _req(0.0, 600, [*SYSTEM, 15]),
            {"type": "subagent", "t": 0.5, "requests": [_req(0.0, 580, [*SYSTEM, 16])]}]},
        {"id": "d", "block_size": BLOCK, "requests": [_req(0.0, 600, [*SYSTEM, 17])]},
    ]  # fmt: skip
    if scope is not None:
        for conversation in doc[:3]:
            conversation["hash_scope"] = scope
    return doc


def write(tmp_path: Path, doc: object, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def hits(trace: ct.ConversationTrace) -> dict[tuple[str, int], int]:
    return {(c.key, i): r.hit_tokens for tree in trace.trees for c in tree.contexts for i, r in enumerate(c.requests)}


# -- the reader and the ceiling ----------------------------------------------------------------------------------


def test_ids_several_trace_scoped_conversations_name_are_shared_from_where_the_file_first_names_them(
    tmp_path: Path,
) -> None:
    trace = load_conversation_trace(write(tmp_path, recorded()))
    assert dict(trace.shared) == {block: ("c0", 0) for block in SYSTEM}  # 8-17 are each one conversation's
    assert [t.trace_scope for t in trace.trees] == [True, True, True, False]
    assert "hash_scope" not in trace.extra[0]  # a field of the format now, not an unknown one
    # An unlimited cache across the trees of a pass: the system blocks miss once, where the file first sends
    # them, and hit everywhere else (the subagent included); the fourth conversation's ids are its own.
    assert hits(trace) == {
        ("c0", 0): 0, ("c0", 1): 10 * BLOCK,
        ("c1", 0): 8 * BLOCK, ("c1", 1): 9 * BLOCK,
        ("c2", 0): 8 * BLOCK, ("c2.s0", 0): 8 * BLOCK,
        ("c3", 0): 0,
    }  # fmt: skip
    assert trace_ceiling(trace) == pytest.approx(
        (640 + 512 + 576 + 512 + 512) / (700 + 850 + 620 + 1000 + 600 + 580 + 600)
    )


@pytest.mark.parametrize("scope", [None, "conversation"])
def test_without_the_trace_scope_every_conversation_keeps_its_own_ids(tmp_path: Path, scope: str | None) -> None:
    trace = load_conversation_trace(write(tmp_path, recorded(scope)))
    assert dict(trace.shared) == {}
    assert not any(t.trace_scope for t in trace.trees)
    assert trace_ceiling(trace) == pytest.approx((640 + 576) / 4950)  # only hits within a context


def test_a_bad_scope_or_two_block_sizes_under_one_numbering_is_one_error(tmp_path: Path) -> None:
    bad = recorded()
    bad[1]["hash_scope"] = "global"
    with pytest.raises(ConfigError, match=r"conversation 1 \(b\): hash_scope: Input should be 'conversation' or"):
        load_conversation_trace(write(tmp_path, bad))
    mixed = recorded()
    mixed[2]["block_size"] = 16
    with pytest.raises(ConfigError, match=r'hash_scope "trace" .* one block_size; got \[16, 64\]'):
        load_conversation_trace(write(tmp_path, mixed))
    mixed[3]["block_size"] = 32  # a conversation of its own numbering may have any block size
    mixed[2]["block_size"] = BLOCK
    assert load_conversation_trace(write(tmp_path, mixed)).block_size == (BLOCK, BLOCK, BLOCK, 32)


# -- the replay --------------------------------------------------------------------------------------------------


def replay(tmp_path: Path, agents: int, requests: int, **options: Any) -> tuple[ConversationTraceWorkload, LevelRun]:
    workload = ConversationTraceWorkload(load_conversation_trace(write(tmp_path, recorded())), **options)
    return workload, run_level(workload, agents, context=0, stop_after_requests=requests)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, int], str]:
    """(agent/draw/context, turn) → the prompt each request was built with (a level's bodies are in the order they
    were sent, its records in the order they ended: the request's own ids tie a text to its record)."""
    out: dict[tuple[str, int], str] = {}
    build = ct._ContextTurns.build

    def capture(self: ct._ContextTurns, turn: int) -> Request | None:
        request = build(self, turn)
        if request is not None:
            out[request.ids.agent, request.ids.turn] = str(request.body["messages"][0]["content"])
        return request

    monkeypatch.setattr(ct._ContextTurns, "build", capture)
    return out


def texts(run: LevelRun, built: dict[tuple[str, int], str]) -> dict[tuple[str, int], list[str]]:
    """(draw/context, turn) → the words of the prompt each record sent."""
    return {(r.ids.agent.split("/", 1)[1], r.ids.turn): built[r.ids.agent, r.ids.turn].split() for r in run.records}


def test_shared_blocks_are_one_text_across_the_trees_of_a_pass_and_another_in_the_next(
    tmp_path: Path, built: dict[tuple[str, int], str]
) -> None:
    _, run = replay(tmp_path, 4, 14)  # two passes of the file's four trees (seven requests each)
    sent = texts(run, built)
    system = 8 * BLOCK
    first = sent[("d0/c0", 0)]
    for other in ("d1/c1", "d2/c2", "d2/c2.s0"):  # the other sessions of the pass, the subagent too
        assert sent[(other, 0)][:system] == first[:system]
    assert sent[("d3/c3", 0)][:BLOCK] != first[:BLOCK]  # ids of its own numbering: not the others' blocks
    again = sent[("d4/c0", 0)]  # the file's next pass
    assert again[:BLOCK] != first[:BLOCK]
    assert sent[("d5/c1", 0)][:system] == again[:system]
    # An id of one conversation stays salted per draw, and is the same text within the draw's context.
    assert first[system : system + BLOCK] != again[system : system + BLOCK]
    assert sent[("d0/c0", 1)][: 10 * BLOCK] == first[: 10 * BLOCK]
    assert sent[("d1/c1", 0)][system : system + BLOCK] != first[system : system + BLOCK]


def test_another_level_sends_other_shared_text(tmp_path: Path) -> None:
    workload = ConversationTraceWorkload(load_conversation_trace(write(tmp_path, recorded())))

    async def first_prompt(level: int) -> list[str]:
        run = await run_level_async(sim_server(), workload, 1, context=0, level=level, stop_after_requests=1)
        return str(run.bodies[0]["messages"][0]["content"]).split()

    assert run_virtual(first_prompt(0))[:BLOCK] != run_virtual(first_prompt(1))[:BLOCK]


def test_the_server_reuses_shared_blocks_across_trees_up_to_the_ceiling(tmp_path: Path) -> None:
    workload, run = replay(tmp_path, 1, 7)  # one agent: the trees of one pass one after the other
    assert all(r.ok for r in run.records)
    ceiling = prefix_ceiling(workload.trace, run.records)
    assert ceiling == pytest.approx(trace_ceiling(workload.trace))
    assert ceiling is not None
    measured = hit_rate(run.records)
    assert measured <= ceiling + 1e-9
    assert measured == pytest.approx(ceiling, abs=0.01)
    cached = {(r.ids.agent.split("/", 1)[1], r.ids.turn): r.cached_tokens or 0 for r in run.records}
    assert cached[("d1/c1", 0)] >= 8 * BLOCK - 16  # another session's system prompt, found warm
    assert cached[("d3/c3", 0)] < 16  # its own numbering: nothing of the others'


def test_a_mid_start_counts_the_shared_blocks_of_its_warm_up(tmp_path: Path) -> None:
    doc = recorded()
    # A longer second session, so that a mid start has a turn k > 0 to start it at.
    doc[1]["requests"] += [
        _req(6.0, 1100, [*SYSTEM, 12, 13, 14, 18], think=1.0),
        _req(9.0, 1200, [*SYSTEM, 12, 13, 14, 18, 19], think=1.0),
    ]
    seed = next(s for s in range(100) if ct.mid_turn(4, s, 1) >= 2)  # the second draw starts at k >= 2
    k = ct.mid_turn(4, seed, 1)
    workload = ConversationTraceWorkload(load_conversation_trace(write(tmp_path, doc)), start="mid")
    run = run_level(workload, 1, context=0, seed=seed, stop_after_requests=2 + (4 - k) + 2 + 1)
    assert all(r.ok for r in run.records)
    names = {r.ids.agent.split("/", 1)[1] for r in run.records}
    assert f"d1/k{k}/c1" in names
    ceiling = prefix_ceiling(workload.trace, run.records)
    assert ceiling is not None
    measured = hit_rate(run.records)
    assert measured <= ceiling + 1e-9
    assert measured == pytest.approx(ceiling, abs=0.01)
    warm_up = next(r for r in run.records if r.ids.agent.endswith(f"/d1/k{k}/c1") and r.ids.turn == k)
    assert prefix_ceiling(workload.trace, [warm_up]) == pytest.approx(8 * BLOCK / warm_up_tokens(doc, k))
    assert (warm_up.cached_tokens or 0) >= 8 * BLOCK - 16  # a cold context, but the system prompt was sent before


def warm_up_tokens(doc: list[dict[str, Any]], k: int) -> int:
    tokens: int = doc[1]["requests"][k]["in"]
    return tokens


# -- without the scope: as before, byte for byte -----------------------------------------------------------------


def test_traces_without_the_scope_replay_the_same_words_as_before(
    tmp_path: Path, built: dict[tuple[str, int], str]
) -> None:
    """The published traces (no ``hash_scope``): every prompt of a level is the text it was before the scope was
    read, pinned as a digest — the sample alone, and twice over (two conversations naming the same ids, which
    stay apart)."""
    sample = json.loads(SAMPLE.read_text(encoding="utf-8"))
    del sample["hash_id_scope"]  # the sample says "global": its ids would be one numbering across the copies
    twice = [sample, copy.deepcopy(sample)]
    twice[1]["id"] = "second"
    cases = [
        (write(tmp_path, sample, "once.json"), 30, "59247c0219f715fe251364d1bff59e46991c452c920f4db63be242d02307c5fa"),
        (write(tmp_path, twice), 60, "c767d47dc4bb0d89d7d843e707f8a1b1a5543b8638944b5658f6ed2a5cfddf16"),
    ]
    for path, requests, digest in cases:
        workload = ConversationTraceWorkload(load_conversation_trace(path), time_scale=0.01)
        run = run_level(
            workload, 2, context=0, server=sim_server("qwen3-235b-gb300-128k"), stop_after_requests=requests
        )
        prompts = sorted((r.ids.agent, r.ids.turn, built[r.ids.agent, r.ids.turn]) for r in run.records)
        assert len(prompts) == requests
        assert hashlib.sha256(json.dumps(prompts).encode()).hexdigest() == digest, path.name
        assert prefix_ceiling(workload.trace, run.records) == pytest.approx(0.7559, abs=1e-4)


def test_the_published_hash_id_scope_reads_as_the_scope_it_names(tmp_path: Path) -> None:
    """``hash_id_scope`` (the published traces' field): "global" numbers the file's ids together, as
    ``hash_scope: "trace"`` does; "local" keeps each conversation's own; a contradiction is one error."""
    as_ours = load_conversation_trace(write(tmp_path, recorded(), "ours.json"))
    published = recorded(None)
    for conversation in published[:3]:
        conversation["hash_id_scope"] = "global"
    read = load_conversation_trace(write(tmp_path, published, "global.json"))
    assert dict(read.shared) == dict(as_ours.shared)
    assert hits(read) == hits(as_ours)
    for conversation in published[:3]:
        conversation["hash_id_scope"] = "local"
    local = load_conversation_trace(write(tmp_path, published, "local.json"))
    assert dict(local.shared) == {}
    assert not any(t.trace_scope for t in local.trees)
    published[0]["hash_scope"] = "trace"  # and "local" beside it
    with pytest.raises(ConfigError, match=r'conversation 0 \(a\): .*hash_scope "trace" contradicts hash_id_scope'):
        load_conversation_trace(write(tmp_path, published, "both.json"))
