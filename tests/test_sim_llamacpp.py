"""The simulator's llama.cpp face (sim/llamacpp.py) against a recorded real llama-server, and probe / scrape on both.

``tests/data/llamacpp/`` holds what a real llama-server said, recorded with curl on 2026-12-01: llama.cpp as
vendored in the ``llama-cpp-python==0.3.36`` sdist (``build_info`` b1-0c1e570), built by
``scripts/llamacpp-tier/setup.sh``, serving the tier's 16 MB random-weight GGUF (``build_model.py``) as
``llama-server -a agentload-llamacpp -np 3 -c 12288 --metrics --slots --cache-ram 0 -t 2 --no-webui``:

* ``props.json``, ``slots.json``, ``models.json``: ``GET /props``, ``/slots``, ``/v1/models`` after the requests below;
* ``slots_busy.json``: ``GET /slots`` while slot 2 generated (a 20-token prompt, 304 tokens decoded so far);
* ``metrics.txt``: ``GET /metrics`` after three requests: ``POST /completion`` of a 20-token prompt with
  ``n_predict`` 400 (400 generated, nothing cached), a chat of 39 prompt tokens and 5 generated (0 cached), and a
  chat of 41 prompt tokens and 3 generated of which usage said 26 were cached.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentload.capacity.profile import ServingProfile, load_profile, parse_profile
from agentload.endpoint.probe import preflight, probe
from agentload.endpoint.scrape import _NORMALISED, _SUMMED, _llamacpp_pool, parse_metrics
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport
from agentload.errors import ConfigError
from agentload.sim.faults import parse_fault
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.sim.tokens import tokenize

DATA = Path(__file__).parent / "data" / "llamacpp"
URL = "http://sim.invalid"


def recorded(name: str) -> Any:
    text = (DATA / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def slot_profile(slots: int = 3, per_slot: int = 4096) -> ServingProfile:
    return parse_profile(
        f"""
name = "np{slots}"
model = "qwen2.5-0.5b"
served_model_name = "agentload-llamacpp"
gpu = "h100"
max_model_len = {per_slot}
max_num_batched_tokens = 2048
slots = {slots}
""",
        "test",
    )


def sim(profile: ServingProfile | None = None, **config: Any) -> tuple[SimServer, InProcessTransport]:
    server = SimServer(SimConfig(profile=profile or slot_profile(), **config))
    return server, InProcessTransport(server)


async def get_json(transport: InProcessTransport, path: str) -> Any:
    resp = await transport.send("GET", URL + path, None, {})
    assert resp.status == 200, path
    return json.loads(await resp.read())


async def post_json(transport: InProcessTransport, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    resp = await transport.send("POST", URL + path, json.dumps(body).encode(), {})
    return resp.status, json.loads(await resp.read())


def types(exposition: str) -> list[tuple[str, str]]:
    """(name, type) of every ``# TYPE`` line, in order."""
    return re.findall(r"^# TYPE (\S+) (\S+)$", exposition, flags=re.M)


def _word(i: int) -> str:
    """A distinct word for each ``i``, all letters: one token of the simulator's tokenizer (a digit is a token)."""
    letters = ""
    while True:
        i, r = divmod(i, 26)
        letters += chr(ord("a") + r)
        if not i:
            return "w" + letters


def words(n: int, start: int = 0) -> str:
    return " ".join(_word(i) for i in range(start, start + n))


# -- the recorded real server through agentload's readers ------------------------------------------------------
def test_the_recorded_metrics_give_the_slot_cache_hit_rate() -> None:
    norm = parse_metrics(recorded("metrics.txt")).normalised()
    # Processed 20 + 39 + (41 − 26) = 74; cached 26; every prompt token 20 + 39 + 41 = 100; generated 400 + 5 + 3.
    assert norm == {
        "running": 0.0,
        "waiting": 0.0,
        "prompt_tokens": 74.0,
        "prefix_hits": 26.0,
        "prefix_queries": 100.0,
        "generation_tokens": 408.0,
    }


def test_every_llamacpp_name_scrape_reads_is_one_the_real_server_exposes() -> None:
    exposed = {name for name, _ in types(recorded("metrics.txt"))}
    read = {name for names in _NORMALISED["llamacpp"].values() for name in names}
    read |= {name for engine, names in _SUMMED.values() if engine == "llamacpp" for name in names}
    assert read <= exposed, read - exposed
    assert "llamacpp:prompt_tokens_cached_total" in read  # the slot cache's server-side hit rate


def test_the_recorded_props_give_the_slots_and_the_per_slot_context() -> None:
    pool = _llamacpp_pool(recorded("props.json"))
    assert pool is not None
    # -np 3 -c 12288: 3 slots of 4,096 tokens, 12,288 in all = 768 sixteen-token blocks (an equivalent, not exact).
    assert (pool.max_num_seqs, pool.max_model_len, pool.tokens, pool.num_blocks, pool.exact) == (3, 4096, 12288, 768,
                                                                                              False)  # fmt: skip


async def test_probe_reads_the_recorded_server() -> None:
    routes = {
        "/props": recorded("props.json"),
        "/slots": recorded("slots.json"),
        "/v1/models": recorded("models.json"),
        "/health": {"status": "ok"},
    }
    chat = (
        b'data: {"choices":[{"index":0,"delta":{"content":" light"}}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":90,"total_tokens":91,'
        b'"prompt_tokens_details":{"cached_tokens":%d}}}\n\ndata: [DONE]\n\n'
    )
    replies = [chat % 0, chat % 89]

    async def handler(request: MockRequest) -> MockResponse:
        path = "/" + request.url.split("/", 3)[3]
        if request.method == "POST":
            return MockResponse(headers={"Content-Type": "text/event-stream"}, chunks_script=[(0.0, replies.pop(0))])
        if path == "/metrics":
            return MockResponse(chunks_script=[(0.0, recorded("metrics.txt").encode())])
        if path in routes:
            return MockResponse(chunks_script=[(0.0, json.dumps(routes[path]).encode())])
        return MockResponse(status=404, chunks_script=[(0.0, b'{"error":{"code":404}}')])

    result = await probe("http://127.0.0.1:8080", transport=MockTransport(handler))
    assert (result.engine, result.version, result.model) == ("llamacpp", "b1-0c1e570", "agentload-llamacpp")
    assert (result.parallel_slots, result.max_running, result.max_context, result.pool_tokens) == (3, 3, 4096, 12288)


# -- the simulator says what the real server says --------------------------------------------------------------
async def test_the_simulators_metrics_have_the_real_servers_names_and_types() -> None:
    _server, transport = sim()
    try:
        resp = await transport.send("GET", URL + "/metrics", None, {})
        text = (await resp.read()).decode()
    finally:
        await transport.aclose()
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4"  # as llama-server sends it
    assert types(text) == types(recorded("metrics.txt"))
    assert ("llamacpp:n_tokens_max", "counter") in types(text)  # llama.cpp's counter without _total, kept
    assert "vllm:" not in text


async def test_props_slots_models_and_health_have_the_real_servers_shape() -> None:
    server, transport = sim()
    try:
        props = await get_json(transport, "/props")
        slots = await get_json(transport, "/slots")
        models = await get_json(transport, "/v1/models")
        await server.runner.ready.wait()
        health = await get_json(transport, "/health")
        version = await transport.send("GET", URL + "/version", None, {})
    finally:
        await transport.aclose()
    real = recorded("props.json")
    assert set(props) <= set(real)  # no field llama-server lacks
    assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (3, 4096)
    assert set(props["default_generation_settings"]["params"]) == set(real["default_generation_settings"]["params"])
    assert props["build_info"].startswith("agentload-sim")
    assert slots == [{"id": i, "n_ctx": 4096, "speculative": False, "is_processing": False} for i in range(3)]
    assert models["data"][0]["owned_by"] == "llamacpp"
    assert models["data"][0]["meta"]["n_ctx"] == 4096
    assert health == {"status": "ok"}
    assert version.status == 404  # llama-server has no /version


@pytest.mark.parametrize(("profile", "slots", "per_slot"), [(None, 3, 4096), ("llamacpp-8b-l40s", 4, 32768)])
async def test_probe_against_a_slot_profile_gives_the_figures_the_profile_implies(
    profile: str | None, slots: int, per_slot: int
) -> None:
    _server, transport = sim(load_profile(profile) if profile else None)
    try:
        result = await probe(URL, transport=transport)
    finally:
        await transport.aclose()
    assert result.engine == "llamacpp"
    assert (result.version or "").startswith("agentload-sim")
    assert (result.parallel_slots, result.max_running, result.max_context) == (slots, slots, per_slot)
    assert result.pool_tokens == slots * per_slot  # 12,288 / 131,072 tokens (-c)
    assert result.block_size is None
    assert (result.reports_cached_tokens, result.prefix_caching) == (True, True)
    assert result.output_length_control == "ignore_eos + n_predict=max_tokens"
    assert preflight(result, planned_context=2048, requested_width=None).reason == f"llama.cpp has {slots} slots"


async def test_the_counters_mean_what_llamacpps_do() -> None:
    """Processed excludes cached, cached counts slot reuse, and the two add up to every prompt token."""
    assert len(tokenize(words(300))) == 300  # one token per word (precondition of the arithmetic below)
    _server, transport = sim(slot_profile(slots=1))
    try:
        first = words(300)
        status, one = await post_json(transport, "/completion", {"prompt": first, "n_predict": 10, "ignore_eos": True})
        assert status == 200
        # The slot now holds the 300 prompt tokens and 9 of the reply (the last is never decoded). The next prompt
        # is those 300 words and 50 new ones, which differ from the reply. The simulator's word tokens carry the
        # space after them, so the first prompt's last word (at the end of the text) is another token than the
        # same word followed by a space: 299 reused, 51 processed.
        second = first + " " + words(50, start=1000)
        status, two = await post_json(transport, "/completion", {"prompt": second, "n_predict": 5, "ignore_eos": True})
        resp = await transport.send("GET", URL + "/metrics", None, {})
        norm = parse_metrics((await resp.read()).decode()).normalised()
    finally:
        await transport.aclose()
    assert (one["tokens_evaluated"], one["tokens_predicted"], one["timings"]["cache_n"]) == (300, 10, 0)
    assert (two["tokens_evaluated"], two["tokens_predicted"], two["timings"]["cache_n"]) == (350, 5, 299)
    assert one["id_slot"] == two["id_slot"] == 0
    assert two["tokens_cached"] == 350 + 4  # prompt + the reply less its last token, which is never decoded
    # Processed 300 + 51, cached 299; all prompt tokens 300 + 350 = 650; generated 10 + 5.
    assert (norm["prompt_tokens"], norm["prefix_hits"], norm["prefix_queries"]) == (351.0, 299.0, 650.0)
    assert norm["generation_tokens"] == 15.0


async def test_slots_shows_the_busy_slot_and_its_task() -> None:
    _server, transport = sim(slot_profile(slots=2))
    try:
        stream = await transport.send(
            "POST", URL + "/completion",
            json.dumps({"prompt": words(40), "n_predict": 3000, "ignore_eos": True, "stream": True}).encode(), {},
        )  # fmt: skip
        chunks = stream.chunks()
        first = await anext(chunks)
        busy = await get_json(transport, "/slots")
        stream.close()
    finally:
        await transport.aclose()
    event = json.loads(first.split(b"\n", 1)[0].removeprefix(b"data: "))
    assert (event["stop"], event["tokens_evaluated"]) == (False, 40)
    working = [s for s in busy if s["is_processing"]]
    assert [s["is_processing"] for s in busy].count(True) == 1
    assert len(busy) == 2
    slot = working[0]
    assert (slot["n_prompt_tokens_cache"], slot["n_prompt_tokens_processed"]) == (0, 40)
    assert (slot["params"]["n_predict"], slot["params"]["ignore_eos"]) == (3000, True)
    assert slot["next_token"][0]["has_next_token"] is True
    assert slot["next_token"][0]["n_remain"] == 3000 - slot["next_token"][0]["n_decoded"]


async def test_a_fresh_server_serves_its_first_request_in_its_last_slot() -> None:
    real_busy = [s["id"] for s in recorded("slots_busy.json") if s["is_processing"]]
    _server, transport = sim()
    try:
        status, body = await post_json(transport, "/completion", {"prompt": words(20), "n_predict": 4})
    finally:
        await transport.aclose()
    assert status == 200
    assert real_busy == [2]  # the recorded server's first request, on a fresh -np 3 server
    assert body["id_slot"] == 2


async def test_tokenize_takes_llamacpps_content_field() -> None:
    _server, transport = sim()
    try:
        status, body = await post_json(transport, "/tokenize", {"content": "the agent reads"})
    finally:
        await transport.aclose()
    assert status == 200
    assert body == {"tokens": tokenize("the agent reads")}
    assert len(body["tokens"]) == 3


async def test_the_context_error_is_llamacpps() -> None:
    _server, transport = sim(slot_profile(per_slot=512))
    try:
        status, body = await post_json(transport, "/completion", {"prompt": words(600), "n_predict": 4})
    finally:
        await transport.aclose()
    assert status == 400
    assert "request (604 tokens) exceeds the available context size (512 tokens)" in body["error"]["message"]


async def test_a_cold_slot_server_answers_health_as_llamacpp_does() -> None:
    _server, transport = sim(cold_start_s=30.0)
    try:
        resp = await transport.send("GET", URL + "/health", None, {})
        body = json.loads(await resp.read())
    finally:
        await transport.aclose()
    assert resp.status == 503
    assert body == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def test_the_vllm_face_stays_for_pool_profiles_and_can_be_chosen_for_slots() -> None:
    assert not SimServer(SimConfig(profile=load_profile("laptop"))).llamacpp
    assert not SimServer(SimConfig(profile=slot_profile(), api="vllm")).llamacpp
    with pytest.raises(ConfigError, match="no slots"):
        SimServer(SimConfig(profile=load_profile("laptop"), api="llamacpp"))


async def test_a_request_that_waited_for_a_slot_keeps_what_it_asked() -> None:
    # One slot: b waits while a runs; a's response ends (the client closes it) before b gets the slot.
    _server, transport = sim(slot_profile(slots=1))
    try:
        body_a = {"prompt": words(30), "n_predict": 3000, "ignore_eos": True, "stream": True}
        body_b = {"prompt": words(30, start=500), "n_predict": 2500, "ignore_eos": True, "stream": True}
        a = await transport.send("POST", URL + "/completion", json.dumps(body_a).encode(), {})
        await anext(a.chunks())
        b = await transport.send("POST", URL + "/completion", json.dumps(body_b).encode(), {})
        queued = await get_json(transport, "/slots")
        a.close()
        await anext(b.chunks())  # b has the slot now
        busy = await get_json(transport, "/slots")
        b.close()
    finally:
        await transport.aclose()
    assert queued[0]["params"]["n_predict"] == 3000  # a held the slot while b waited
    assert busy[0]["is_processing"] is True
    assert busy[0]["params"]["n_predict"] == 2500  # was -1: b's request was forgotten when a's response ended


async def test_id_slot_pins_a_request_and_a_busy_slot_defers_it() -> None:
    # llama.cpp (get_available_slot): a task naming a busy slot is deferred although another slot is idle.
    _server, transport = sim(slot_profile(slots=2))
    try:
        body_a = {"prompt": words(30), "n_predict": 3000, "ignore_eos": True, "stream": True, "id_slot": 0}
        body_b = {"prompt": words(30, start=500), "n_predict": 4, "id_slot": 0}
        a = await transport.send("POST", URL + "/completion", json.dumps(body_a).encode(), {})
        await anext(a.chunks())
        b = await transport.send("POST", URL + "/completion", json.dumps(body_b).encode(), {})
        waiting = await get_json(transport, "/slots")
        metrics = (await (await transport.send("GET", URL + "/metrics", None, {})).read()).decode()
        a.close()
        done = json.loads(await b.read())
    finally:
        await transport.aclose()
    assert [s["is_processing"] for s in waiting] == [True, False]
    assert re.search(r"^llamacpp:requests_deferred 1(\.0)?$", metrics, flags=re.M)
    assert done["id_slot"] == 0


async def test_a_chat_request_names_its_slot_and_an_id_past_the_last_wraps() -> None:
    _server, transport = sim(slot_profile(slots=3))
    try:
        chat = {"model": "agentload-llamacpp", "messages": [{"role": "user", "content": words(20)}],
                "max_tokens": 3000, "ignore_eos": True, "stream": True, "id_slot": 1}  # fmt: skip
        a = await transport.send("POST", URL + "/v1/chat/completions", json.dumps(chat).encode(), {})
        chunks = a.chunks()
        await anext(chunks)
        await anext(chunks)  # the role chunk, then the first token: the request holds its slot
        first = await get_json(transport, "/slots")
        wrapped = {"prompt": words(10), "n_predict": 2, "id_slot": 5}  # 5 mod 3 = slot 2
        status, body = await post_json(transport, "/completion", wrapped)
        junk = {"prompt": words(10), "n_predict": 2, "id_slot": "zero"}  # llama.cpp: wrong type → -1, any slot
        status_junk, body_junk = await post_json(transport, "/completion", junk)
        a.close()
    finally:
        await transport.aclose()
    assert [s["is_processing"] for s in first] == [False, True, False]
    assert (status, body["id_slot"]) == (200, 2)
    assert status_junk == 200
    assert body_junk["id_slot"] == 2  # any slot: slot 2 holds this very prompt (similarity 1 > 0.1)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_malformed_fault_ends_a_completion_reply_with_the_broken_text(stream: bool) -> None:
    _server, transport = sim(faults=[parse_fault("malformed:1")])
    try:
        raw = json.dumps({"prompt": words(10), "n_predict": 6, "stream": stream}).encode()
        resp = await transport.send("POST", URL + "/completion", raw, {})
        body = (await resp.read()).decode()
    finally:
        await transport.aclose()
    if stream:
        lines = [ln for ln in body.split("\n\n") if ln]
        assert lines[-1] == 'data: {"index":0,"content": '  # the broken event is the last: no final object
        assert all(json.loads(ln.removeprefix("data: "))["stop"] is False for ln in lines[:-1])
    else:
        assert body == '{"index": 0, "content'
