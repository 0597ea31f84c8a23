"""Calibration: the fit recovers known coefficients, the measurement recovers the simulator's own profile, the CLI.

The real-time test calibrates against the simulated server with a purpose-made profile rather than ``laptop``:
laptop's prefill (0.22 ms per token) makes 16 concurrent streams at a useful context take minutes of wall time,
and its 10 ms decode step is only ten times the 1-2 ms by which asyncio timers (epoll's millisecond resolution,
and a busy host) overshoot each simulated sleep. The profile below has a GPU-like shape — cheap prefill, a 30 ms
decode step, a 100 ms API overhead — so that overshoot stays at a few percent of every identifiable quantity
even on a loaded two-core machine (a 40 ms overhead came out 10-15% high there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import json
import random
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentload.capacity.calibrate import (
    FITTED,
    CalibrationPlan,
    CalibrationResult,
    ItlPoint,
    TtftPoint,
    calibrate,
    fit_step_coefficients,
    steady_itl,
)
from agentload.capacity.profile import ServingProfile, load_profile, parse_profile
from agentload.cli.main import app
from agentload.clock import run_virtual
from agentload.endpoint.scrape import ServedModel, ServerPool, ServerProbe, StopRule, StreamTiming
from agentload.errors import ConfigError, EndpointResponseError
from agentload.report.calibrateview import summary
from agentload.sim.chat import TemplatePads
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.sim.tokens import Tokenizer
from agentload.workload.words import WORDS
from tests.simserver import sim_process

AGENTLOAD = [sys.executable, "-m", "agentload"]

TARGET_PROFILE = """
name = "calibration-target"
model = "qwen2.5-0.5b"
served_model_name = "Qwen/Qwen2.5-0.5B-Instruct"
gpu = "laptop"
max_model_len = 16384
max_num_batched_tokens = 8192
block_size = 32

[kv_pool]
num_blocks = 3001

[step.pinned]
prefill_s_per_token = 2e-5
attention_s_per_pair = 2e-9
weights_s = 0.03
kv_s_per_token = 5e-7
api_overhead_s = 0.1
"""

# Every coefficient the measurements determine well; request_s (µs per request) is drowned by timer jitter.
IDENTIFIABLE = ("prefill_s_per_token", "attention_s_per_pair", "weights_s", "kv_s_per_token", "api_overhead_s")


# -- the fit on exact data ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["laptop", "llama-8b-h100", "qwen3-235b-gb300", "deepseek-sliding-gb300"])
def test_fit_recovers_every_coefficient_from_model_generated_points(name: str) -> None:
    """Dense, MoE and sliding-window profiles; short prompts are memory-bound and large batches compute-bound."""
    profile = load_profile(name)
    c, sm, rtt = profile.coefficients, profile.step_model, 0.0005
    ttft = [
        TtftPoint(target_tokens=n, prompt_tokens=n, ttft_s=rtt + c.api_overhead_s + sm.prefill_time(n))
        for n in (16, 32, 64, 256, 1024, 4096, 8192)
    ]
    itl = [
        ItlPoint(batch=b, context=ctx, itl_s=sm.decode_step_time(b, ctx), gaps=10)
        for ctx in (64, 256, 4096)
        for b in (1, 2, 4, 8, 16, 64, 256)
    ]
    fitted, report = fit_step_coefficients(
        ttft, itl, structure=c, model=profile.model, step_s=c.step_s, round_trip_s=rtt
    )
    for key in (*FITTED, "api_overhead_s"):
        assert getattr(fitted, key) == pytest.approx(getattr(c, key), rel=1e-9), key
    assert report.ttft_rel_rms < 1e-9
    assert report.itl_rel_rms < 1e-9
    assert report.memory_bound_ttft > 0  # the regime search really was exercised


def test_laptop_points_fall_in_both_regimes() -> None:
    """The premise of the test above for laptop: its 16-token prefill is memory-bound, batch 256 compute-bound."""
    sm = load_profile("laptop").step_model
    c = sm.c
    assert c.weights_s > c.prefill_s_per_token * 16
    assert c.prefill_s_per_token * 256 > c.weights_s + c.kv_s_per_token * 256 * 64


def test_steady_itl_uses_only_the_window_where_every_stream_decodes() -> None:
    # Stream a starts at t=0 and decodes every 10 ms while b prefills; from b's first token (t=0.1) both decode
    # every 30 ms. Only the 30 ms gaps are in the window.
    a = StreamTiming(0.0, (0.0, 0.01, 0.02, 0.1, 0.13, 0.16, 0.19, 0.22), 100, 0, 8)
    b = StreamTiming(0.0, (0.1, 0.13, 0.16, 0.19, 0.22, 0.25), 100, 0, 6)
    point = steady_itl([a, b], prompt_tokens=100, min_gaps=2)
    assert point is not None
    assert point.itl_s == pytest.approx(0.03)
    assert point.gaps == 8
    # a's window gaps end at chunks 4..7, b's at 1..4: contexts 104..107 and 101..104.
    assert point.context == pytest.approx(104.0)
    assert steady_itl([a, b], prompt_tokens=100, min_gaps=5) is None
    late = StreamTiming(0.0, (0.3, 0.33, 0.36), 100, 0, 3)  # starts after a ended: never together
    assert steady_itl([a, late], prompt_tokens=100, min_gaps=1) is None


def test_streams_whose_chunks_came_in_bursts_are_read_from_burst_to_burst() -> None:
    # A loaded client read the chunks of both streams in bursts of four, a burst every 0.2 s: most gaps are 0
    # (their median was once an ITL of zero, a pydantic ValidationError; then no point, which on a busy machine left
    # calibrate with too few). Four tokens a burst at 0.2 s a burst: a step of 50 ms.
    burst = (0.0, 0.0, 0.0, 0.0, 0.2, 0.2, 0.2, 0.2, 0.4, 0.4, 0.4, 0.4)
    a = StreamTiming(0.0, burst, 100, 0, 12)
    b = StreamTiming(0.0, burst, 100, 0, 12)
    point = steady_itl([a, b], prompt_tokens=100, min_gaps=2)
    assert point is not None
    assert point.itl_s == pytest.approx(0.05)
    # All in one burst: nothing spans two, so there is no step time to read.
    together = StreamTiming(0.0, (0.3,) * 12, 100, 0, 12)
    assert steady_itl([together, together], prompt_tokens=100, min_gaps=2) is None


# -- the whole calibration against a modelled server (no HTTP, no wall time) ----------------------------------
def _llama3(messages: Sequence[Mapping[str, str]]) -> str:
    """A Llama-3-style template (not the simulator's ChatML): a BOS, each message's role between header markers and
    its text followed by an end marker, the assistant's header as the generation prompt."""
    text = "".join(f"<|start_header_id|> {m['role']} <|end_header_id|>\n\n{m['content']} <|eot_id|> " for m in messages)
    return f"<|begin_of_text|> {text}<|start_header_id|> assistant <|end_header_id|>\n\n"


def _costly_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """ChatML as a BPE vocabulary counts it when a message's first word costs more than in running text: every
    message costs several tokens more than the generation prompt, and there is no BOS."""
    text = "".join(f"<|im_start|> {m['role']} \n<|w|> <|w|> <|w|> {m['content']} <|im_end|> <|nl|> " for m in messages)
    return f"{text}<|im_start|> assistant \n"


class ModelledServer:
    """A ``CalibrationTarget`` whose timings come straight from a profile's step model.

    Streams started in the same event-loop turn form one batch and decode in lockstep; a prompt's token count is
    its word count, as in the simulator's tokenizer.
    """

    def __init__(
        self,
        profile: ServingProfile,
        served: str,
        round_trip_s: float = 0.0004,
        tokenizer: Tokenizer | None = None,
        template: Callable[[Sequence[Mapping[str, str]]], str] | None = None,
    ) -> None:
        self.profile = profile
        self.tokenizer = tokenizer  # its /tokenize; None: it has none
        self.template = template or _llama3  # its chat template (not the simulator's ChatML)
        self.served = served
        self.rtt = round_trip_s
        self._group: list[int] = []
        self.batches: list[int] = []
        self.stopped = 0

    async def models(self) -> list[ServedModel]:
        return [ServedModel(id=self.served, max_model_len=self.profile.max_model_len)]

    async def pool(self) -> ServerPool:
        p = self.profile
        return ServerPool(engine="vllm", num_blocks=p.num_blocks, block_size=p.block_size, source="model", exact=True)

    async def round_trip(self) -> float:
        return self.rtt

    async def count_tokens(self, model: str, text: str) -> int | None:
        return None if self.tokenizer is None else len(self.tokenizer.tokenize(text))

    async def count_chat_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int | None:
        if self.tokenizer is None:
            return None
        return len(self.tokenizer.tokenize(self.template(messages)))

    async def stream_completion(self, body: Mapping[str, Any], stop: StopRule | None = None) -> StreamTiming:
        group = self._group
        group.append(1)
        await asyncio.sleep(0)  # let the other streams started with this one join its batch
        if self._group is group:
            self._group = []
            self.batches.append(len(group))
        n, prompt, out = len(group), len(str(body["prompt"]).split()), int(body["max_tokens"])
        sm, c = self.profile.step_model, self.profile.coefficients
        times = [self.rtt + c.api_overhead_s + sm.prefill_time(prompt)]
        for j in range(1, out):
            times.append(times[-1] + sm.decode_step_time(n, prompt + j))
        for count, t in enumerate(times, 1):
            if stop is not None and stop(count, t) and count < out:
                self.stopped += 1  # the client hung up: like a real server, no usage follows
                return StreamTiming(0.0, tuple(times[:count]), None, None, None)
        return StreamTiming(0.0, tuple(times), prompt, 0, out)


async def test_calibration_of_a_modelled_server_recovers_it_and_writes_a_generic_profile(tmp_path: Path) -> None:
    truth = load_profile("laptop")
    target = ModelledServer(truth, served="acme/unknown-7b")
    plan = CalibrationPlan(itl_contexts=(256, 2048), itl_repeats=2)
    result = await calibrate(target, url="http://model", plan=plan)
    assert result.catalogue_model is None
    # Two passes over both contexts, each pass every batch size in turn (drift touches all points alike).
    assert target.batches[-20:] == [1, 2, 4, 8, 16] * 4
    assert len(result.itl) == 20
    # The steady window ended one stream of every batch of 2 or more early (a lone stream asks for exactly the
    # window): 4 batches × 2 contexts × 2 passes. Those streams carry no usage, so their contexts came from the
    # estimated tokens per word.
    assert target.stopped == 16
    for key in (*FITTED, "api_overhead_s"):
        assert getattr(result.coefficients, key) == pytest.approx(getattr(truth.coefficients, key), rel=1e-6), key
    assert result.fit.ttft_rel_rms < 1e-6
    assert result.fit.itl_rel_rms < 1e-6
    path = tmp_path / "p.toml"
    path.write_text(result.profile_toml)
    written = load_profile(str(path))
    assert written.name == "calibrated-unknown-7b"
    assert (written.model.name, written.served_model_name) == ("acme/unknown-7b", "acme/unknown-7b")
    assert (written.num_blocks, written.block_size, written.max_model_len) == (4096, 16, 16384)
    assert written.coefficients == result.coefficients
    assert CalibrationResult.model_validate_json(result.model_dump_json()) == result


async def test_calibration_measures_how_the_servers_tokenizer_splits_agentloads_words() -> None:
    server_split = Tokenizer((0.6, 0.25, 0.15))
    target = ModelledServer(load_profile("laptop"), served="m", tokenizer=server_split)
    result = await calibrate(target, url="http://model", plan=CalibrationPlan(itl_contexts=(256, 2048), words=WORDS))
    written = parse_profile(result.profile_toml, "calibrated")
    # What the server's /tokenize makes of each word, word by word: the profile's shares are those counts.
    counts = [len(server_split.tokenize(w)) for w in WORDS]
    assert dict(written.word_tokens) == dict(zip(WORDS, counts, strict=True))
    assert written.word_pieces == pytest.approx([counts.count(k) / len(WORDS) for k in (1, 2, 3)], abs=1e-4)
    assert 1.3 < statistics.mean(counts) < 1.8
    assert result.tokens_per_word == pytest.approx(statistics.mean(counts), abs=1e-3)


@pytest.mark.parametrize("template", [_llama3, _costly_messages], ids=["llama3", "costly-messages"])
@pytest.mark.parametrize("plain", [False, True], ids=["split-words", "one-token-a-word"])
async def test_the_calibrated_simulator_counts_a_conversation_as_the_servers_chat_template_does(
    template: Callable[[Sequence[Mapping[str, str]]], str], plain: bool
) -> None:
    """The server's template (a BOS and big headers; or messages that cost more than the generation prompt) costs
    what the simulator's ChatML does not; calibrated, the simulator pads its own, so every prompt of a conversation
    has the server's length, on a tokenizer that splits words and on one that makes a token of each."""
    server_split = Tokenizer((1.0,) if plain else (0.6, 0.25, 0.15))
    target = ModelledServer(load_profile("laptop"), served="m", tokenizer=server_split, template=template)
    result = await calibrate(target, url="http://model", plan=CalibrationPlan(itl_contexts=(256, 2048), words=WORDS))
    assert result.chat_template is not None
    calibrated = parse_profile(result.profile_toml, "calibrated")
    assert calibrated.chat_template == result.chat_template
    simulated = SimServer(SimConfig(profile=calibrated))
    uncalibrated = SimServer(SimConfig(profile=dataclasses.replace(calibrated, chat_template=None)))
    rng = random.Random(7)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    messages = [{"role": "system", "content": words(rng.randint(20, 300))}]
    misses = []
    for turn in range(8):
        messages.append({"role": "user", "content": words(rng.randint(5, 400))})
        server = await target.count_chat_tokens("m", messages)
        assert server is not None
        body = json.dumps({"messages": messages}).encode()
        assert simulated.tokenize_body(body)["count"] == server, turn
        misses.append(server - uncalibrated.tokenize_body(body)["count"])
        messages.append({"role": "assistant", "content": words(rng.randint(1, 200))})
    # Without the pads the simulator counts every prompt shorter, by more each turn (the check has teeth).
    assert all(m > 0 for m in misses), misses
    assert misses[-1] > misses[0], misses


async def test_a_server_whose_tokenize_takes_no_messages_keeps_the_simulators_template() -> None:
    class NoChatTokenize(ModelledServer):
        async def count_chat_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int | None:
            return None

    target = NoChatTokenize(load_profile("laptop"), served="m", tokenizer=Tokenizer((0.6, 0.25, 0.15)))
    result = await calibrate(target, url="http://model", plan=CalibrationPlan(itl_contexts=(256, 2048), words=WORDS))
    assert result.chat_template is None
    assert parse_profile(result.profile_toml, "calibrated").chat_template is None
    assert any("takes no messages" in note for note in result.notes)


async def test_without_tokenize_the_split_comes_from_the_measured_tokens_per_word() -> None:
    plan = CalibrationPlan(words=WORDS)
    result = await calibrate(ModelledServer(load_profile("laptop"), served="m"), url="http://model", plan=plan)
    written = parse_profile(result.profile_toml, "calibrated")
    assert written.word_pieces == (1.0, 0.0)  # the modelled server counts a token a word
    assert written.word_tokens == ()
    assert any("no /tokenize" in note for note in result.notes)


async def test_a_failing_tokenize_leaves_the_split_to_usage_and_the_calibration_goes_on() -> None:
    class BrokenTokenize(ModelledServer):
        async def count_tokens(self, model: str, text: str) -> int | None:
            raise EndpointResponseError("POST /tokenize on http://model: HTTP 500: boom", status=500)

    plan = CalibrationPlan(words=WORDS)
    result = await calibrate(BrokenTokenize(load_profile("laptop"), served="m"), url="http://model", plan=plan)
    assert parse_profile(result.profile_toml, "calibrated").word_tokens == ()
    assert any("/tokenize failed" in note and "HTTP 500" in note for note in result.notes)


async def test_the_summary_shows_pool_coefficients_and_fit() -> None:
    result = await calibrate(ModelledServer(load_profile("laptop"), served="m"), url="http://model")
    buffer = io.StringIO()
    summary(result, Console(file=buffer, width=200))
    out = buffer.getvalue()
    assert "KV pool: 4,096 blocks × 16 tokens = 65,536 tokens" in out
    for name in (*FITTED, "api_overhead_s", "step_s"):
        assert name in out
    assert "Fit error (relative RMS): TTFT 0.0%" in out
    assert "note: step_s is not identifiable" in out
    assert "Tokenizer: 1.000 tokens a word of agentload's text (words made of 1, 2, … tokens: 100% 1;" in out


async def test_calibration_names_a_model_the_server_does_not_serve() -> None:
    target = ModelledServer(load_profile("laptop"), served="Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ConfigError) as info:
        await calibrate(target, url="http://model", model="gpt-9")
    assert str(info.value) == "--model 'gpt-9' is not served; the server lists Qwen/Qwen2.5-0.5B-Instruct"


# -- against the simulated server, in virtual time -------------------------------------------------------------
SIM_URL = "http://sim.invalid"  # the in-process simulator's: no socket, so nothing else on the machine moves a timing


def test_calibrating_the_simulator_recovers_its_profile(tmp_path: Path) -> None:
    """Calibrate the in-process simulator on a virtual-time loop: every TTFT and inter-token gap is the served
    profile's own step time, whatever else the machine runs, so the fit must recover its coefficients."""
    run_virtual(_calibrate_and_replay(tmp_path))


def _sim(profile: str) -> InProcessTransport:
    return InProcessTransport(SimServer(SimConfig(profile=load_profile(profile))))


async def _calibrate_and_replay(tmp_path: Path) -> None:
    source = tmp_path / "target.toml"
    source.write_text(TARGET_PROFILE)
    truth = load_profile(str(source))
    plan = CalibrationPlan(
        # Lengths up to 3/4 of max_model_len give the quadratic attention term a long lever.
        ttft_lengths=(256, 1024, 2048, 3072, 4096, 6144, 8192, 12288),
        ttft_max_share=0.75,
        itl_contexts=(512, 4096),
        steady_tokens=32,
        # The fastest of five per length: a request that arrives mid-step waits for the step in flight (the
        # engine's own quantisation, virtual time or not), and the minimum sheds that wait.
        ttft_repeats=5,
    )
    async with ServerProbe(SIM_URL, transport=_sim(str(source))) as probe:
        result = await calibrate(probe, url=SIM_URL, plan=plan)

    assert (result.pool.num_blocks, result.pool.block_size) == (3001, 32)
    assert result.catalogue_model == "qwen2.5-0.5b"
    # Exact data up to whole tokens: the fit is within a fraction of a percent (0.1 % when this was written).
    for key in IDENTIFIABLE:
        assert getattr(result.coefficients, key) == pytest.approx(getattr(truth.coefficients, key), rel=0.02), key
    assert result.coefficients.step_s == truth.coefficients.step_s

    path = tmp_path / "calibrated.toml"
    path.write_text(result.profile_toml)
    written = load_profile(str(path))
    assert (written.num_blocks, written.block_size, written.max_model_len) == (3001, 32, 16384)
    assert written.served_model_name == "Qwen/Qwen2.5-0.5B-Instruct"
    c, sm = written.coefficients, written.step_model
    for t in result.fastest_ttft:
        predicted = result.round_trip_s + c.api_overhead_s + sm.prefill_time(t.new_tokens, t.cached_tokens)
        assert predicted == pytest.approx(t.ttft_s, rel=0.10), t
    for i in result.itl:
        assert sm.decode_step_time(i.batch, round(i.context)) == pytest.approx(i.itl_s, rel=0.10), i
    assert {i.batch for i in result.itl} == {1, 2, 4, 8, 16}
    assert result.fit.ttft_rel_rms < 0.05
    assert result.fit.itl_rel_rms < 0.05

    # The written profile served by the simulator behaves like the server it was calibrated from.
    original_ttft = {t.target_tokens: t.ttft_s for t in result.fastest_ttft}[4096]
    original_itl = next(i.itl_s for i in result.itl if i.batch == 1 and i.context < 1000)
    async with ServerProbe(SIM_URL, transport=_sim(str(path))) as replay:
        words = " ".join(["word"] * 4095)
        ttft = min([(await replay.stream_completion({"prompt": f"{k} {words}", "max_tokens": 1})).ttft or 0
                    for k in range(4)])  # fmt: skip
        stream = await replay.stream_completion({"prompt": "x " * 511, "max_tokens": 40})
    assert ttft == pytest.approx(original_ttft, rel=0.10)
    gaps = [b - a for a, b in itertools.pairwise(stream.token_times)]
    assert statistics.median(gaps) == pytest.approx(original_itl, rel=0.10)


# -- the command ----------------------------------------------------------------------------------------------


class _ModelsOnly(BaseHTTPRequestHandler):
    """An OpenAI-compatible front with no metrics, server info or props (a hosted API, say)."""

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "hosted-model", "max_model_len": 8192}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass


@pytest.fixture
def models_only_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_cli_unreachable_url_is_one_line_and_exit_2(closed_port: int) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--url", f"http://127.0.0.1:{closed_port}"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"error: cannot reach http://127.0.0.1:{closed_port}: connection refused"]


def test_cli_server_without_pool_metrics_exit_2(models_only_server: str) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--url", models_only_server])
    assert result.exit_code == 2
    assert "cannot read the KV pool" in result.output
    assert "no /metrics" in result.output
    assert "Traceback" not in result.output


def test_cli_refuses_a_missing_output_folder_before_measuring(closed_port: int, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "p.toml"
    result = CliRunner().invoke(app, ["calibrate", "--url", f"http://127.0.0.1:{closed_port}", "-o", str(out)])
    assert result.exit_code == 2
    assert "does not exist" in result.output  # not "cannot reach": no request was made


def test_cli_never_prints_the_api_key(models_only_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    result = CliRunner().invoke(app, ["calibrate", "--url", models_only_server, "--api-key-env", "MY_KEY"])
    assert result.exit_code == 2
    assert "sk-very-secret" not in result.output


QUICK_PROFILE = """
name = "quick"
model = "qwen2.5-0.5b"
gpu = "laptop"
max_model_len = 4096

[kv_pool]
num_blocks = 777

[tokenizer]
word_pieces = [0.5, 0.3, 0.2]

[step.pinned]
prefill_s_per_token = 1e-6
attention_s_per_pair = 1e-10
weights_s = 0.006
kv_s_per_token = 1e-7
api_overhead_s = 0.003
"""


@pytest.mark.slow
def test_cli_calibrates_a_running_simulator_and_writes_a_profile_sim_can_serve(tmp_path: Path) -> None:
    """Both commands as a user runs them, each in its own process (a stalled run fails on the timeout)."""
    source = tmp_path / "quick.toml"
    source.write_text(QUICK_PROFILE)
    out = tmp_path / "calibrated.toml"
    with sim_process(str(source)) as (_, url):
        args = ["calibrate", "--url", f"{url}/v1", "--repeats", "1", "--max-batch", "4", "--json"]
        run = subprocess.run([*AGENTLOAD, *args, "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)  # the progress went to stderr, a line as each phase started
    for phase in ("reading the server", "TTFT against prompt length", "ITL against batch size and context"):
        assert f"calibrate: {phase}: " in run.stderr, run.stderr
    assert data["pool"]["num_blocks"] == 777
    assert data["profile_toml"] == out.read_text()
    written = load_profile(str(out))
    assert (written.num_blocks, written.max_model_len) == (777, 4096)
    assert written.coefficients.weights_s == pytest.approx(0.006, rel=0.5)  # only: is it this server at all?
    # The simulator's /tokenize splits words as its profile says; calibration read that split back word by word.
    split = Tokenizer((0.5, 0.3, 0.2))
    counts = [split.pieces(w) for w in WORDS]
    assert dict(written.word_tokens) == dict(zip(WORDS, counts, strict=True))
    assert written.word_pieces == pytest.approx([counts.count(k) / len(WORDS) for k in (1, 2, 3)], abs=1e-4)
    # Its chat template was counted too; served again, the simulator needs no pads to match itself.
    assert written.chat_template is not None
    assert TemplatePads.fit(*written.chat_template, plain=False).none, written.chat_template
