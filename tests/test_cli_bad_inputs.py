"""Bad input ends in one ``error:`` line and exit status 2, never a traceback, a hang or a huge allocation: the
inputs the adversarial campaign found, and more of the same kinds.

Each case builds its files under ``tmp_path`` and runs the command in process (typer's CliRunner); a case that
reached the code it names would have raised (UnicodeDecodeError, RecursionError, ValueError, a numpy
allocation) or run on, so exit 2 with an ``error:`` line proves the input was refused at the boundary.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.store import ROOT_ENV
from agentload.workload import trace

BINARY = bytes(range(256)) * 4
DEEP_TOML = "a = " + "[" * 50_000 + "]" * 50_000 + "\n"
DEEP_JSON = "[" * 100_000 + "]" * 100_000
LAPTOP = (Path(__file__).resolve().parents[1] / "src/agentload/data/profiles/laptop.toml").read_text("utf-8")
FLEET = '[[tasks]]\nid = "t"\nprompt = "hi"\nmax_rounds = 1\nmax_tokens = 4\n'
ROW = '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'
MOE_CONFIG = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
BENCH = ["bench", "--sim", "laptop", "--agents", "1", "--warmup", "1s", "--window", "2s", "--context", "2000"]

Case = Callable[[Path], list[str]]


def _file(tmp: Path, name: str, data: str | bytes) -> str:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return str(path)


def _run_dir(tmp: Path, manifest: str | bytes) -> str:
    _file(tmp, "run/run.json", manifest)
    return str(tmp / "run")


def _profile(tmp: Path, text: str) -> list[str]:
    return ["sim", "--profile", _file(tmp, "p.toml", text.replace('name = "laptop"', 'name = "bad"')), "--port", "0"]


def _config(tmp: Path, **fields: object) -> list[str]:
    path = _file(tmp, "m/config.json", json.dumps({**MOE_CONFIG, **fields}))
    return ["plan", "--model", path, "--gpu", "h100", "--no-curve"]


def _trace(tmp: Path, text: str) -> list[str]:
    return [*BENCH, "--workload", "trace:" + _file(tmp, "t.jsonl", text)]


def _chain(n: int, *, cycle: bool) -> str:
    tasks = []
    for i in range(n):
        dep = f"t{i - 1}" if i else (f"t{n - 1}" if cycle else None)
        tasks.append(f'[[tasks]]\nid = "t{i}"\nprompt = "x"\n' + (f'depends_on = ["{dep}"]\n' if dep else ""))
    return "".join(tasks)


# name -> (the arguments, built in tmp_path; a piece of the error line that says what was wrong)
CASES: dict[str, tuple[Case, str]] = {
    # item 6: the campaign's list
    "binary FLEET.toml": (lambda t: ["run", _file(t, "f.toml", BINARY), "--virtual"], "not UTF-8"),
    "binary profile": (lambda t: ["sim", "--profile", _file(t, "p.toml", BINARY), "--port", "0"], "not UTF-8"),
    "binary config.json": (
        lambda t: ["plan", "--model", _file(t, "m/config.json", BINARY), "--gpu", "h100", "--no-curve"],
        "not UTF-8",
    ),
    "binary run.json": (lambda t: ["run", "--resume", _run_dir(t, BINARY)], "not UTF-8"),
    "nested FLEET.toml": (lambda t: ["run", _file(t, "f.toml", DEEP_TOML), "--virtual"], "nested too deeply"),
    "nested profile": (lambda t: _profile(t, DEEP_TOML), "nested too deeply"),
    "nested config.json": (
        lambda t: ["plan", "--model", _file(t, "m/config.json", DEEP_JSON), "--gpu", "h100", "--no-curve"],
        "nested too deeply",
    ),
    "nested run.json": (lambda t: ["run", "--resume", _run_dir(t, DEEP_JSON)], "not a run manifest"),
    "nested trace line": (lambda t: _trace(t, DEEP_JSON + "\n"), "nested too deeply"),
    "350-task dependency chain with a cycle": (
        lambda t: ["run", _file(t, "f.toml", _chain(350, cycle=True)), "--virtual"],
        "dependency cycle",
    ),
    "--window 1.2.3s": (lambda t: [*BENCH[:-4], "--window", "1.2.3s"], "expected a duration"),
    "--slo ttft_p95=.s": (lambda t: ["bench", "--sim", "laptop", "--find-knee", "--slo", "ttft_p95=.s"], "--slo"),
    "bench --seed -1": (lambda t: [*BENCH, "--seed", "-1"], "--seed -1"),
    "sim --seed -1": (lambda t: ["sim", "--seed", "-1", "--port", "0"], "--seed -1"),
    "a port > 65535 in --url": (
        lambda t: ["bench", "--url", "http://127.0.0.1:70000", "--model", "m", "--agents", "1"],
        "Port out of range",
    ),
    "sim --host not..a..host": (lambda t: ["sim", "--host", "not..a..host", "--port", "0"], "cannot listen"),
    "offload gib = inf": (lambda t: _profile(t, LAPTOP + "\n[offload]\ngib = inf\n"), "offload.gib"),
    "num_blocks = 1e17": (
        lambda t: _profile(t, LAPTOP.replace("tokens = 65536", "num_blocks = 1e17")),
        "kv_pool.num_blocks",
    ),
    "trace input_length = 1e10": (
        lambda t: _trace(t, '{"timestamp": 0, "input_length": 10000000000, "output_length": 1}\n'),
        "input_length",
    ),
    "config mlp_only_layers: 5": (lambda t: _config(t, mlp_only_layers=5), "mlp_only_layers"),
    # item 7: what hung or ate memory
    "trace timestamp Infinity": (lambda t: _trace(t, ROW + ROW.replace("0", "Infinity", 1)), "Infinity"),
    "fleet context_tokens = 2000000000": (
        lambda t: ["run", _file(t, "f.toml", FLEET + "context_tokens = 2000000000\n"), "--virtual"],
        "context_tokens",
    ),
    "config num_hidden_layers 1e9": (lambda t: _config(t, num_hidden_layers=10**9), "num_hidden_layers"),
    "session trace prompt_tokens 1e10": (
        lambda t: _trace(t, '{"session_id": "a", "turns": [{"prompt_tokens": 10000000000, "completion_tokens": 1}]}\n'),
        "prompt_tokens",
    ),
    # more of the same kinds
    "plan --offload-gib inf": (
        lambda t: ["plan", "--model", "qwen2.5-0.5b", "--gpu", "h100", "--offload-gib", "inf", "--no-curve"],
        "--offload-gib",
    ),
    "profile step_s = inf": (lambda t: _profile(t, LAPTOP + "\n[step]\nstep_s = inf\n"), "step.step_s"),
    "profile pool tokens 2**62": (
        lambda t: _profile(t, LAPTOP.replace("tokens = 65536", "tokens = 4611686018427387904")),
        "kv_pool.tokens",
    ),
    "bench --agents 10**9": (lambda t: [*BENCH[:4], "1000000000", *BENCH[5:]], "--agents"),
    "fleet of 10M agents": (
        lambda t: [
            "run",
            _file(t, "f.toml", "".join(f'[[tasks]]\nid = "t{i}"\nprompt = "x"\ncount = 100000\n' for i in range(100))),
            "--virtual",
        ],
        "agents in all",
    ),
    "config q_lora_rank true": (
        lambda t: _config(t, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, q_lora_rank=True),
        "q_lora_rank",
    ),
    "--executor bogus": (lambda t: [*BENCH, "--executor", "bogus"], "--executor must be local or ray"),
    "--executor ray on virtual time": (lambda t: [*BENCH, "--executor", "ray"], "server over HTTP"),
    "--workers without ray": (lambda t: [*BENCH, "--workers", "2"], "options of --executor ray"),
    "--workers 0": (lambda t: [*BENCH, "--executor", "ray", "--workers", "0"], "--workers"),
    "suite --executor bogus": (lambda t: ["suite", "--executor", "bogus"], "--executor must be local or ray"),
    "run --executor ray --virtual": (
        lambda t: ["run", _file(t, "f.toml", '[[tasks]]\nid = "t"\nprompt = "x"\n'), "--virtual", "--executor", "ray"],
        "serve it with agentload sim",
    ),
    "run --workers without ray": (
        lambda t: ["run", _file(t, "f.toml", '[[tasks]]\nid = "t"\nprompt = "x"\n'), "--workers", "2"],
        "options of --executor ray",
    ),
    "run --dashboard-rate without --dashboard": (
        lambda t: ["run", _file(t, "f.toml", FLEET), "--dashboard-rate", "2"],
        "use it with --dashboard",
    ),
    "run --dashboard-rate 0": (
        lambda t: ["run", _file(t, "f.toml", FLEET), "--dashboard", "--dashboard-rate", "0"],
        "--dashboard-rate",
    ),
    "bench --dashboard-rate without --dashboard": (
        lambda t: [*BENCH, "--dashboard-rate", "2"],
        "use it with --dashboard",
    ),
    "bench --dashboard-rate 100": (lambda t: [*BENCH, "--dashboard", "--dashboard-rate", "100"], "--dashboard-rate"),
}


@pytest.fixture(autouse=True)
def _runs_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "runs"))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_error_line_and_exit_2(name: str, tmp_path: Path) -> None:
    build, needle = CASES[name]
    result = CliRunner().invoke(app, build(tmp_path))
    # CliRunner catches what escapes the command: anything but typer's own exit is a traceback for a user.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert needle in errors[0], errors[0]


def test_a_trace_past_the_row_limit_is_refused_at_the_first_row_too_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The limit lowered so the file stays small; the 317k-row trace of the campaign meets the real one.
    monkeypatch.setattr(trace, "MAX_TRACE_ROWS", 5)
    result = CliRunner().invoke(app, _trace(tmp_path, ROW * 6))
    assert result.exit_code == 2, result.output
    assert "t.jsonl:6: a trace holds at most 5 rows" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["sim", "--port", "70000"],  # typer's own range check (the campaign's "port > 65535")
        ["bench", "--sim", "laptop", "--agents", "x"],
        ["no-such-command"],
        ["sim", "--no-such-flag"],
        ["bench", "--sim", "laptop", "--sweep", "[/x]"],  # the user's text is not rich markup (was a MarkupError)
        ["sim", "--port", "[/x]"],
    ],
)
def test_the_installed_command_reports_a_bad_flag_as_one_error_line(args: list[str]) -> None:
    """The console script (``cli.main:main``) prints typer's usage errors as one ``error:`` line, not a boxed panel."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "agentload", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: "), run.stderr
    assert "╭" not in run.stderr
    assert "Traceback" not in run.stderr


def test_a_url_whose_host_does_not_resolve_fails_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A mistyped host used to be waited for like a loading server (--wait-ready, 120 s). The resolver is faked, so
    # the test asks no DNS server anything.
    real = socket.getaddrinfo

    def fake(host: object, *args: object, **kwargs: object) -> object:
        if host == "vlm-typo.internal":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    result = CliRunner().invoke(
        app,
        ["bench", "--url", "http://vlm-typo.internal:8000", "--model", "m", "--agents", "1", "--out", str(tmp_path)],
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: vlm-typo.internal does not resolve (Name or service not known): check the URL's host name"]
