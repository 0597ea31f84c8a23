"""The simulator's HTTP front against hostile clients: bad JSON is a 400, never a 500; idle,
half-sent and slow connections are closed; a client that hangs up is one log line; bad fault and pinned step-time
figures are refused with one ``error:`` line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentload.capacity.profile import ServingProfile, load_profile, parse_profile
from agentload.capacity.steptime import StepCoefficients
from agentload.cli.main import app as cli_app
from agentload.errors import ConfigError
from agentload.sim.faults import parse_fault
from agentload.sim.server import SimConfig, SimServer
from tests.fuzzing import fuzz_examples
from tests.hostile import deep, json_values

CHAT = "/v1/chat/completions"
# Generous: these wait for a timer of well under a second on a machine shared by many test runs.
PATIENCE_S = 30.0


def instant_profile(max_model_len: int = 2048) -> ServingProfile:
    """The laptop profile with every step-time coefficient zero, so a reply costs event-loop turns, not time."""
    zero = StepCoefficients(prefill_s_per_token=0, attention_s_per_pair=0, weights_s=0, kv_s_per_token=0, step_s=0,
                            request_s=0, api_overhead_s=0)  # fmt: skip
    return dataclasses.replace(load_profile("laptop"), coefficients=zero, max_model_len=max_model_len)


@asynccontextmanager
async def listening(**config: Any) -> AsyncIterator[tuple[SimServer, int]]:
    """The server behind ``app_runner`` (the one ``agentload sim`` uses) on a loopback port."""
    server = SimServer(SimConfig(profile=instant_profile(), **config))
    runner = server.app_runner()
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield server, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    async with asyncio.timeout(PATIENCE_S):
        return await reader.read()


@pytest.mark.parametrize(
    ("sent", "answer"),
    [
        pytest.param(b"", b"", id="nothing-sent"),
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le", b"", id="half-sent-headers"),
        pytest.param(
            b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"mess',
            b"408",
            id="half-sent-body",
        ),
    ],
)
async def test_an_idle_or_half_sent_connection_is_closed(sent: bytes, answer: bytes) -> None:
    async with listening(idle_timeout_s=0.3, body_timeout_s=0.3) as (_server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(sent)
            await writer.drain()
            got = await closed_by_server(reader)
        finally:
            writer.close()
        assert answer in got
        if not answer:
            assert got == b""


async def test_a_connection_in_use_is_not_closed_by_the_idle_timer() -> None:
    async with listening(idle_timeout_s=0.3) as (_server, port), aiohttp.ClientSession() as session:
        for _ in range(3):  # reused keep-alive connection, each request well inside the idle time
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            async with session.post(f"http://127.0.0.1:{port}{CHAT}", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["usage"]["completion_tokens"] == 4


@pytest.fixture
def sim_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="agentload.sim")
    caplog.set_level(logging.INFO, logger="aiohttp.server")
    return caplog


async def test_a_client_that_hangs_up_mid_stream_is_one_log_line(sim_log: pytest.LogCaptureFixture) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2000}).encode()
    async with listening() as (server, port):
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (CHAT.encode(), len(body), body)
            )
            await writer.drain()
            await reader.readuntil(b"data: ")  # the stream has begun
            writer.close()
        async with asyncio.timeout(PATIENCE_S):
            # ASYNC110: the records are a plain list filled by logging; there is nothing to await but time.
            while sum("went away" in r.getMessage() for r in sim_log.records) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert not server.engine.has_work()  # every hung-up request was taken out of the engine
    assert sum("went away" in r.getMessage() for r in sim_log.records) == 3
    assert [r for r in sim_log.records if r.exc_info or r.levelno >= logging.ERROR] == []


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[asyncio.AbstractEventLoop, TestClient[Any, Any]]]:
    """One in-process server for every example of the fuzzer (a server per example would dominate its time)."""
    loop = asyncio.new_event_loop()
    server = SimServer(SimConfig(profile=instant_profile()))
    test_client: TestClient[Any, Any] = TestClient(TestServer(server.app(), host="127.0.0.1"), loop=loop)
    loop.run_until_complete(test_client.start_server())
    try:
        yield loop, test_client
    finally:
        loop.run_until_complete(test_client.close())
        loop.close()


def post(client: tuple[asyncio.AbstractEventLoop, TestClient[Any, Any]], path: str, data: bytes) -> tuple[int, bytes]:
    loop, test_client = client

    async def go() -> tuple[int, bytes]:
        async with test_client.post(path, data=data, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.read()

    return loop.run_until_complete(go())


LONE_SURROGATE = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(LONE_SURROGATE, id="lone-surrogate"),
        pytest.param(b'{"messages": ' + deep(100_000) + b"}", id="nested-100k"),
        pytest.param(b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}', id="nan"),
        pytest.param(
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f", "parameters": '
            + b'{"a":' * 1000
            + b"{}"
            + b"}" * 1000
            + b"}}]}",
            id="tool-schema-1000-deep",
        ),
    ],
)
@pytest.mark.parametrize("path", [CHAT, "/v1/completions", "/tokenize"])
def test_json_a_strict_parser_refuses_is_a_400(
    client: tuple[asyncio.AbstractEventLoop, TestClient[Any, Any]], path: str, data: bytes
) -> None:
    status, body = post(client, path, data)
    assert status == 400
    assert json.loads(body)["error"]["code"] == 400


# -- the fuzzer ---------------------------------------------------------------------------------------------------
def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the field's real shape, sometimes anything: with even odds nearly every body would be refused at its
    first field and the generation path would go unexercised."""
    return st.integers(0, 6).flatmap(lambda pick: value if pick else json_values)


ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "robot"])
messages = st.lists(
    maybe(
        st.fixed_dictionaries(
            {"role": maybe(ROLES)},
            optional={
                "content": maybe(
                    st.text(max_size=40)
                    | st.lists(
                        st.fixed_dictionaries(
                            {"type": maybe(st.sampled_from(["text", "image_url"]))}, optional={"text": maybe(st.text())}
                        ),
                        max_size=2,
                    )
                ),
                "tool_calls": maybe(
                    st.lists(
                        st.fixed_dictionaries(
                            {
                                "function": maybe(
                                    st.fixed_dictionaries(
                                        {"name": maybe(st.text(max_size=5))},
                                        optional={"arguments": maybe(st.text(max_size=10))},
                                    )
                                )
                            }
                        ),
                        max_size=2,
                    )
                ),
                "tool_call_id": maybe(st.text(max_size=5)),
                "name": maybe(st.text(max_size=5)),
            },
        )
    ),
    min_size=1,
    max_size=3,
)
tools = st.lists(
    maybe(
        st.fixed_dictionaries(
            {
                "type": maybe(st.just("function")),
                "function": maybe(
                    st.fixed_dictionaries(
                        {"name": maybe(st.text(max_size=5))},
                        optional={
                            "parameters": maybe(st.dictionaries(st.text(max_size=4), json_values, max_size=3)),
                            "description": maybe(st.text(max_size=10)),
                        },
                    )
                ),
            }
        )
    ),
    max_size=2,
)
small_counts = st.integers(1, 48) | st.integers(-(2**63), 2**65)
chat_bodies = st.fixed_dictionaries(
    {"messages": maybe(messages)},
    optional={
        "model": maybe(st.sampled_from(["Qwen/Qwen2.5-0.5B-Instruct", "laptop", "gpt-4"])),
        "max_tokens": maybe(small_counts),
        "max_completion_tokens": maybe(small_counts),
        "stream": maybe(st.booleans()),
        "stream_options": maybe(st.fixed_dictionaries({}, optional={"include_usage": maybe(st.booleans())})),
        "n": maybe(st.sampled_from([1, 1, 1, 0, 2])),
        "seed": maybe(st.integers(-(2**70), 2**70)),
        "min_tokens": maybe(st.integers(-1, 8)),
        "ignore_eos": maybe(st.booleans()),
        "temperature": maybe(st.floats(allow_nan=True)),
        "tools": maybe(tools),
        "tool_choice": maybe(st.sampled_from(["auto", "none", "required"]) | st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": maybe(st.text(max_size=5))})})),
        "prompt": maybe(st.text(max_size=20) | st.lists(st.text(max_size=5), max_size=2)
                        | st.lists(st.integers(0, 100), max_size=3)),
    },
)  # fmt: skip
other_bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.binary(max_size=40),
    st.integers(900, 1100).map(lambda d: b'{"messages": ' + deep(d) + b"}"),
    st.just(LONE_SURROGATE),
)
# Three bodies in four are chat-shaped, so most examples get past the JSON parser into validation and generation.
raw_bodies = st.integers(0, 3).flatmap(
    lambda pick: chat_bodies.map(lambda b: json.dumps(b, allow_nan=True).encode()) if pick else other_bodies
)


@settings(max_examples=fuzz_examples(300))
@given(raw_bodies, st.sampled_from([CHAT, CHAT, CHAT, "/v1/completions", "/tokenize"]))
def test_fuzz_no_body_makes_the_simulator_answer_500(
    client: tuple[asyncio.AbstractEventLoop, TestClient[Any, Any]], data: bytes, path: str
) -> None:
    status, body = post(client, path, data)
    event(f"status {status}")  # --hypothesis-show-statistics: the mix of accepted and refused bodies
    assert status != 500, body[:300]
    assert status in (200, 400, 404), (status, body[:300])
    if status != 200:
        assert json.loads(body)["error"]["message"]


# -- fault flags and pinned step times ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag",
    ["stall:0.5:nan", "stall:nan", "stall:0.5:inf", "http429:0.1:-1", "stall:0.5:1e9", "reset:inf", "reset:-0.1"],
)
def test_a_non_finite_or_out_of_range_fault_is_refused(flag: str) -> None:
    with pytest.raises(ConfigError, match="--fault"):
        parse_fault(flag)
    result = CliRunner().invoke(cli_app, ["sim", "--fault", flag])
    assert result.exit_code == 2
    assert result.output.startswith("error: ")
    assert "Traceback" not in result.output


def test_a_fault_in_range_is_kept() -> None:
    spec = parse_fault("stall:0.25:3.5")
    assert (spec.kind, spec.rate, spec.seconds) == ("stall", 0.25, 3.5)


PROFILE = 'name = "p"\nmodel = "qwen2.5-0.5b"\ngpu = "laptop"\nmax_model_len = 4096\n[kv_pool]\ntokens = 65536\n'


@pytest.mark.parametrize(
    ("pinned", "says"),
    [
        ("prefill_s_per_token = -1e-5", "prefill_s_per_token"),
        ("weights_s = nan", "weights_s must be finite"),
        ("step_s = inf", "step_s must be finite"),
        ("num_layers = 0", "num_layers"),
        ("shared_weight_fraction = 2.0", "shared_weight_fraction"),
    ],
)
def test_pinned_step_times_are_validated(tmp_path: Path, pinned: str, says: str) -> None:
    text = PROFILE + f"[step.pinned]\n{pinned}\n"
    with pytest.raises(ConfigError, match=r"\[step.pinned\]") as info:
        parse_profile(text, "p.toml")
    assert says in str(info.value)
    path = tmp_path / "p.toml"
    path.write_text(text)
    result = CliRunner().invoke(cli_app, ["sim", "--profile", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith("error: ")


def test_valid_pinned_step_times_are_used() -> None:
    profile = parse_profile(PROFILE + "[step.pinned]\nweights_s = 0.004\nstep_s = 0.0\n", "p.toml")
    assert (profile.coefficients.weights_s, profile.coefficients.step_s) == (0.004, 0.0)
