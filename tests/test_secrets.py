"""The API key and --url credentials never reach disk or the screen; polls carry them."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import string
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import Outcome
from agentload.endpoint.redact import MASK, MIN_SECRET_CHARS, SECRETS, redact, redact_url, split_url
from agentload.endpoint.scrape import ServerProbe
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport, SignedTransport, signed_transport
from agentload.errors import ConfigError
from tests.fuzzing import fuzz_examples
from tests.hostileauth import CHAT, HostileServer, hostile_server

KEY_ENV = "AGENTLOAD_TEST_PLANTED_KEY"


def _planted(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


# -- the registry and URL splitting -----------------------------------------------------------------------------
def test_a_url_is_split_into_a_bare_base_a_masked_url_and_its_credentials() -> None:
    server = split_url("http://alice:pw-0123456789@127.0.0.1:8000/v1?api_key=qk-0123456789&region=eu")
    assert server.base == "http://127.0.0.1:8000/v1"
    assert server.shown == "http://alice:***@127.0.0.1:8000/v1?api_key=***&region=eu"
    assert server.credentials.user == "alice"
    assert server.credentials.password == "pw-0123456789"
    assert server.credentials.params == (("api_key", "qk-0123456789"), ("region", "eu"))
    # What was found is registered, so server text that echoes it is masked too.
    assert redact("denied pw-0123456789 and qk-0123456789") == f"denied {MASK} and {MASK}"
    assert "pw-0123456789" not in repr(server)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://TOKEN-abcdefgh@host/v1", "https://***@host/v1"),
        ("http://h/v1?key=abc", "http://h/v1?key=***"),  # short: masked by its place, not by search
        ("http://h/v1?access_token=t&X-Api-Key=k&page=2", "http://h/v1?access_token=***&X-Api-Key=***&page=2"),
        ("http://u:p@[::1]:8443/v1", "http://u:***@[::1]:8443/v1"),
        ("http://127.0.0.1:99999/v1?token=abc", "http://127.0.0.1:99999/v1?token=***"),  # a port that cannot parse
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ],
)
def test_redact_url_masks_userinfo_and_credential_parameters(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_forms_a_server_echoes_a_key_in_are_masked_too() -> None:
    key = 'sk-a/b+c=d"e-0123'
    SECRETS.add(key)
    SECRETS.add_basic("bob", "pw-basic-0123")
    basic = base64.b64encode(b"bob:pw-basic-0123").decode()
    text = f"{key} {quote(key, safe='')} {json.dumps(key)} Basic {basic}"
    assert redact(text) == f'{MASK} {MASK} "{MASK}" Basic {MASK}'


def test_short_values_are_not_searched_for_in_free_text() -> None:
    SECRETS.add("pass")  # would otherwise mask "passed", "password", a JSON field name
    assert len(SECRETS) == 0
    assert redact("tests passed") == "tests passed"


alphabet = st.characters(codec="utf-8", exclude_characters="*")  # the mask itself; utf-8 has no surrogates


@settings(max_examples=fuzz_examples(300))
@given(
    secret=st.text(alphabet, min_size=MIN_SECRET_CHARS, max_size=40),
    before=st.text(alphabet, max_size=60),
    after=st.text(alphabet, max_size=60),
    copies=st.integers(1, 3),
)
def test_fuzz_no_registered_secret_survives_redaction(secret: str, before: str, after: str, copies: int) -> None:
    SECRETS.clear()
    SECRETS.add(secret)
    text = before + (secret + after) * copies
    out = redact(text)
    assert secret not in out
    assert out.count(MASK) >= copies


@settings(max_examples=fuzz_examples(300))
@given(
    # The user from other characters than the secrets, so that no secret can be part of it.
    user=st.text(string.ascii_lowercase, min_size=1, max_size=12),
    password=st.text(string.ascii_uppercase + string.digits + string.punctuation, min_size=1, max_size=30),
    name=st.sampled_from(["api_key", "key", "token", "access_token", "apikey", "auth", "sig", "x-api-key"]),
    value=st.text(string.ascii_uppercase + string.digits, min_size=1, max_size=30),
)
def test_fuzz_a_split_url_shows_no_credential(user: str, password: str, name: str, value: str) -> None:
    SECRETS.clear()  # one example's secrets would mask another's user name
    url = f"http://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:8000/v1?{name}={quote(value)}&n=1"
    server = split_url(url)
    assert server.base == "http://127.0.0.1:8000/v1"
    assert f"{name}={MASK}" in server.shown
    assert server.shown.endswith("&n=1")
    netloc = server.shown.split("//", 1)[1].split("@", 1)[0]
    assert netloc == f"{user}:{MASK}"
    assert server.credentials.password == password
    assert (name, value) in server.credentials.params


def test_a_url_that_cannot_be_taken_apart_is_a_config_error_that_shows_no_credential() -> None:
    with pytest.raises(ConfigError) as info:
        split_url("http://u:pw-0123456789@[::1/v1")
    assert "pw-0123456789" not in str(info.value)


# -- the signing transport -------------------------------------------------------------------------------------
def _echo_transport() -> MockTransport:
    async def handler(request: MockRequest) -> MockResponse:
        return MockResponse(status=200, chunks_script=[(0.0, b"ok")])

    return MockTransport(handler)


async def test_the_signed_transport_sends_the_key_and_the_url_credentials_on_every_request() -> None:
    inner = _echo_transport()
    server, transport = signed_transport("http://u:pw-0123456789@h:1/v1?api_key=qk-0123456789", "sk-0123456789", inner)
    await transport.send("GET", server.base.removesuffix("/v1") + "/metrics", None, {})
    await transport.send("GET", server.base + "/models?limit=1", None, {"Authorization": "stale"})
    first, second = inner.requests
    assert first.url == "http://h:1/metrics?api_key=qk-0123456789"
    assert second.url == "http://h:1/v1/models?limit=1&api_key=qk-0123456789"
    # A key and a userinfo are both an Authorization header: the key wins.
    assert first.headers["Authorization"] == second.headers["Authorization"] == "Bearer sk-0123456789"
    assert "0123456789" not in repr(transport)


async def test_a_userinfo_without_a_key_is_sent_as_basic_auth() -> None:
    inner = _echo_transport()
    server, transport = signed_transport("http://bob:pw-0123456789@h:1/v1", None, inner)
    assert isinstance(transport, SignedTransport)
    await transport.send("GET", server.base + "/models", None, {})
    assert inner.requests[0].headers["Authorization"] == "Basic " + base64.b64encode(b"bob:pw-0123456789").decode()
    assert inner.requests[0].url == "http://h:1/v1/models"


async def test_a_bare_url_and_no_key_need_no_signing() -> None:
    inner = _echo_transport()
    _, transport = signed_transport("http://h:1/v1", None, inner)
    assert transport is inner


async def test_an_error_body_that_echoes_the_key_is_recorded_masked() -> None:
    key = _planted("sk")

    async def handler(request: MockRequest) -> MockResponse:
        body = json.dumps({"error": {"message": f"bad key {request.headers['Authorization']} at {request.url}"}})
        return MockResponse(status=401, chunks_script=[(0.0, body.encode())])

    server, transport = signed_transport("http://h:1/v1?api_key=qk-0123456789", key, MockTransport(handler))
    record = await ChatClient(server.base, transport=transport, api_key_env=None).chat({"messages": []})
    assert record.outcome is Outcome.HTTP_ERROR
    assert record.error_message == f"bad key Bearer {MASK} at http://h:1/v1/chat/completions?api_key={MASK}"
    assert key not in record.model_dump_json()


async def test_a_reply_that_echoes_the_key_is_recorded_masked_and_a_key_like_prefix_is_kept() -> None:
    key = _planted("sk")

    async def handler(request: MockRequest) -> MockResponse:
        said = f"your key is {request.headers['Authorization'].removeprefix('Bearer ')}; keys start with sk-"
        args = json.dumps({"note": request.headers["Authorization"]})
        events = [
            {"choices": [{"delta": {"content": said}}]},
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "save",
                                                                                        "arguments": args}}]}}]},
        ]  # fmt: skip
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return MockResponse(status=200, headers={"Content-Type": "text/event-stream"}, chunks_script=[(0.0, body)])

    server, transport = signed_transport("http://h:1/v1", key, MockTransport(handler))
    record = await ChatClient(server.base, transport=transport, api_key_env=None).chat({"messages": []})
    assert record.ok, record.error_message
    assert record.content == f"your key is {MASK}; keys start with sk-"
    assert json.loads(record.tool_calls[0].arguments) == {"note": f"Bearer {MASK}"}
    assert key not in record.model_dump_json()


# -- the commands against a hostile server ----------------------------------------------------------------------
async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    full = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "AGENTLOAD_RUNS")} | env
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentload", *args, env=full,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=600)  # a generous bound, never a measurement
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _forms(planted: list[str], basic: tuple[str, str] | None = None) -> list[bytes]:
    """Each planted secret as it could land in a file: raw, URL-quoted, and (a userinfo) in a Basic header."""
    forms = {p.encode() for p in planted} | {quote(p, safe="").encode() for p in planted}
    if basic is not None:
        forms.add(base64.b64encode(f"{basic[0]}:{basic[1]}".encode()))
    return sorted(forms)


def _occurrences(root: Path, texts: list[str], forms: list[bytes], what: str, server: HostileServer) -> int:
    """Occurrences of any form over every file under ``root`` and the captured output; prints the figures."""
    files = [p for p in root.rglob("*") if p.is_file()]
    blobs = [p.read_bytes() for p in files] + [t.encode() for t in texts]
    found = sum(blob.count(form) for blob in blobs for form in forms)
    stats = server.stats
    print(  # the closing note's figures (pytest -s)
        f"\n{what}: {len(files)} files + {len(texts)} captured streams searched, {found} occurrences of "
        f"{len(forms)} planted forms; /metrics authorised {stats.authorised['/metrics']}, /health "
        f"{stats.authorised['/health']}, denied {sum(stats.denied.values())}; {stats.echoed} echoing error bodies"
    )
    return found


MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
BENCH = ["--model", MODEL, "--workload", "agentic", "--context", "3000", "--agents", "2", "--warmup", "1s",
         "--window", "6s", "--min-turns", "4"]  # fmt: skip


@pytest.mark.slow
async def test_bench_with_a_key_and_url_credentials_leaks_nothing_and_reads_metrics(tmp_path: Path) -> None:
    key, qkey = _planted("sk"), _planted("qk")
    out = tmp_path / "runs"
    async with hostile_server(bearer=key, query={"api_key": qkey}) as server:
        url = f"{server.url}/v1?api_key={qkey}"
        code, stdout, stderr = await _cli(
            "bench", "--url", url, *BENCH, "--api-key-env", KEY_ENV, "--out", str(out), env={KEY_ENV: key}
        )
        assert code == 0, stderr
        run_id = json.loads(next(out.glob("*/result.json")).read_text())["run_id"]
        rcode, rout, rerr = await _cli("report", run_id, "--root", str(out), "-o", str(out / "report.html"), "-p",
                                       env={})  # fmt: skip
        assert rcode == 0, rerr
    stats = server.stats
    # Every poll carried the credentials: none was turned away, and /metrics was read all through the run.
    assert sum(stats.denied.values()) == 0, stats.denied
    assert stats.authorised["/metrics"] >= 3
    assert stats.echoed >= 1  # the server did echo the credentials back
    saved = json.loads(next(out.glob("*/result.json")).read_text())
    assert saved["levels"][0]["throughput_source"] == "server"
    assert saved["target"] == f"{server.url}/v1?api_key={MASK}"
    records = next(out.glob("*/records.jsonl")).read_text()
    assert f"Bearer {MASK}" in records  # the echoed bodies were recorded, masked
    found = _occurrences(out, [stdout, stderr, rout, rerr], _forms([key, qkey]), "bench (key + ?api_key)", server)
    assert (out / "report.html").exists()
    assert (out / "history.sqlite").exists()
    assert found == 0


@pytest.mark.slow
async def test_bench_with_a_url_userinfo_sends_it_as_basic_auth_and_stores_it_masked(tmp_path: Path) -> None:
    password = _planted("pw")
    out = tmp_path / "runs"
    async with hostile_server(basic=("alice", password)) as server:
        url = server.url.replace("http://", f"http://alice:{password}@") + "/v1"
        code, stdout, stderr = await _cli("bench", "--url", url, *BENCH, "--out", str(out), env={})
    assert code == 0, stderr
    assert sum(server.stats.denied.values()) == 0
    assert server.stats.authorised["/metrics"] >= 3
    saved = json.loads(next(out.glob("*/result.json")).read_text())
    assert saved["target"] == server.url.replace("http://", f"http://alice:{MASK}@") + "/v1"
    forms = _forms([password], basic=("alice", password))
    found = _occurrences(out, [stdout, stderr], forms, "bench (user:pw@)", server)
    assert found == 0


@pytest.mark.slow
async def test_suite_with_a_key_and_url_credentials_leaks_nothing(tmp_path: Path) -> None:
    key, qkey = _planted("sk"), _planted("qk")
    out = tmp_path / "runs"
    async with hostile_server(bearer=key, query={"token": qkey}, echo_every=3) as server:
        code, stdout, stderr = await _cli(
            "suite", "--url", f"{server.url}/v1?token={qkey}", "--model", MODEL, "--tests", "T1,T2,T3",
            "--api-key-env", KEY_ENV, "--out", str(out), "--json", env={KEY_ENV: key},
        )  # fmt: skip
    assert code == 0, stderr
    assert sum(server.stats.denied.values()) == 0
    assert server.stats.authorised[CHAT] >= 3
    assert server.stats.echoed >= 1
    saved = next(out.glob("suite-*/suite.json")).read_text()
    assert f"Bearer {MASK}" in saved
    assert json.loads(stdout)["endpoint"] == f"{server.url}/v1?token={MASK}"
    found = _occurrences(out, [stdout, stderr], _forms([key, qkey]), "suite (key + ?token)", server)
    assert found == 0


FLEET = """
[defaults]
tools = ["search"]
max_rounds = 3
max_tokens = 16
context_tokens = 400

[[tasks]]
id = "t"
prompt = "Task {replica}."
count = 4
"""


@pytest.mark.slow
async def test_run_with_a_key_and_url_credentials_leaks_nothing_and_resumes_only_with_the_url(
    tmp_path: Path,
) -> None:
    key, qkey = _planted("sk"), _planted("qk")
    out = tmp_path / "runs"
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    async with hostile_server(bearer=key, query={"key": qkey}) as server:
        url = f"{server.url}/v1?key={qkey}"
        code, stdout, stderr = await _cli(
            "run", str(fleet), "--url", url, "--mode", "parallel", "--width", "2", "--progress", "lines",
            "--api-key-env", KEY_ENV, "--out", str(out), "--json", env={KEY_ENV: key},
        )  # fmt: skip
        assert code in (0, 1), stderr  # 1: an agent failed on an echoed 401; the run itself completed
        run_dir = next(out.glob("*/run.json")).parent
        # run.json keeps the URL masked, so a resume must be given the URL again rather than use a broken one.
        rcode, rout, rerr = await _cli("run", "--resume", str(run_dir), env={KEY_ENV: key})
        assert rcode == 2
        assert "give --url again" in rerr
    stats = server.stats
    assert sum(stats.denied.values()) == 0, stats.denied
    assert stats.authorised["/metrics"] >= 1
    assert stats.authorised[CHAT] >= 4
    assert json.loads((run_dir / "run.json").read_text())["url"] == f"{server.url}/v1?key={MASK}"
    found = _occurrences(out, [stdout, stderr, rout, rerr], _forms([key, qkey]), "run (key + ?key)", server)
    assert found == 0


@pytest.mark.slow
async def test_probe_signs_every_path_and_prints_no_credential(tmp_path: Path) -> None:
    key, qkey = _planted("sk"), _planted("qk")
    async with hostile_server(bearer=key, query={"api_key": qkey}, echo_every=1) as server:
        code, stdout, stderr = await _cli(
            "probe", "--url", f"{server.url}/v1?api_key={qkey}", "--api-key-env", KEY_ENV, "--json",
            env={KEY_ENV: key},
        )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["engine"] == "agentload-sim"
    assert result["metrics_url"] == f"{server.url}/metrics"
    assert sum(server.stats.denied.values()) == 0
    assert server.stats.authorised["/metrics"] == 1
    assert server.stats.authorised["/health"] == 1
    assert server.stats.echoed >= 1  # the cached-token test requests were answered with echoing errors
    found = _occurrences(tmp_path, [stdout, stderr], _forms([key, qkey]), "probe (key + ?api_key)", server)
    assert found == 0


async def test_the_calibration_probe_signs_metrics_with_the_url_userinfo_and_query() -> None:
    password, qkey = _planted("pw"), _planted("qk")
    async with hostile_server(basic=("carol", password), query={"sig": qkey}) as server:
        url = server.url.replace("http://", f"http://carol:{password}@") + f"/v1?sig={qkey}"
        async with ServerProbe(url) as probe:
            snapshot = await probe.metrics()
            models = await probe.models()
    assert snapshot.named("vllm:num_requests_running")
    assert models[0].id == MODEL
    assert str(probe.url) == server.url
    assert server.stats.authorised["/metrics"] == 1
    assert sum(server.stats.denied.values()) == 0


@settings(max_examples=fuzz_examples(200))
@given(
    status=st.integers(400, 599),
    shape=st.sampled_from(["error.message", "message", "error", "text", "sse-error"]),
    # Padding that puts the secret across the client's cuts (200 characters of a text body, 500 of a message).
    pad=st.integers(170, 215) | st.integers(470, 515) | st.integers(0, 600),
    before=st.text(st.characters(codec="utf-8", exclude_characters="*"), max_size=20),
    after=st.text(st.characters(codec="utf-8", exclude_characters="*"), max_size=60),
    via=st.sampled_from(["key", "query"]),
)
async def test_fuzz_an_error_body_that_echoes_a_secret_leaves_no_part_of_it_in_the_record(
    status: int, shape: str, pad: int, before: str, after: str, via: str
) -> None:
    """Wherever the body puts the secret — cut by the client's truncation or not — no 8 characters of it stay."""
    SECRETS.clear()
    secret = "sk-" + "0123456789abcdef" * 2
    echoed = ("." * pad + before)[:pad] + secret + after
    bodies = {
        "error.message": json.dumps({"error": {"message": echoed, "type": "auth"}}),
        "message": json.dumps({"message": echoed}),
        "error": json.dumps({"error": echoed}),
        "text": echoed,
    }

    async def handler(request: MockRequest) -> MockResponse:
        if shape == "sse-error":
            event = b"data: " + json.dumps({"error": {"message": echoed}}).encode() + b"\n\n"
            return MockResponse(status=200, chunks_script=[(0.0, event)])
        return MockResponse(status=status, chunks_script=[(0.0, bodies[shape].encode())])

    url = "http://h:1/v1" + (f"?api_key={secret}" if via == "query" else "")
    server, transport = signed_transport(url, secret if via == "key" else None, MockTransport(handler))
    record = await ChatClient(server.base, transport=transport, api_key_env=None).chat({"messages": []})
    assert not record.ok
    saved = record.model_dump_json()
    assert secret[:MIN_SECRET_CHARS] not in saved
    assert json.dumps(secret)[1 : MIN_SECRET_CHARS + 1] not in saved
