"""``agentload record`` on the command line: bad input is one error line, and Ctrl-C or a kill keeps the trace."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.workload.conversation_trace import load_conversation_trace
from tests.simserver import running_sim

KEY = "sk-record-cli-0123456789abcdef"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["record", *args])
    return result.exit_code, result.output


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--upstream", "ftp://127.0.0.1:8000"], "expected an http:// or https:// URL"),
        (["--upstream", "http://"], "expected an http:// or https:// URL"),
        (["--upstream", "http://127.0.0.1:99999"], "--upstream"),
        (["--upstream", "http://u:pw@127.0.0.1:8000"], "no credentials in the URL"),
        (["--upstream", "http://127.0.0.1:8000/?key=1"], "no query or fragment"),
        (["--listen", "0.0.0.0:8100"], "not a loopback address"),
        (["--listen", "nonsense"], "expected HOST:PORT"),
        (["--listen", "127.0.0.1:70000"], "expected HOST:PORT"),
        (["--block-size", "0"], "--block-size must be from 1"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    defaults = {"--upstream": "http://127.0.0.1:8000", "--out": str(tmp_path / "t.json"), "--listen": "127.0.0.1:0"}
    for flag, value in defaults.items():
        if flag not in args:
            args = [*args, flag, value]
    code, output = _run(*args)
    assert code == 2, output
    assert output.startswith("error: ")
    assert message in output
    assert len(output.strip().splitlines()) == 1


def test_a_port_in_use_and_an_unwritable_out_are_one_error_line(tmp_path: Path, busy_port: int) -> None:
    code, output = _run("--upstream", "http://127.0.0.1:8000", "--out", str(tmp_path / "t.json"),
                        "--listen", f"127.0.0.1:{busy_port}")  # fmt: skip
    assert code == 2
    assert output.startswith("error: --listen")
    assert "cannot listen there" in output
    for out in (tmp_path / "missing" / "t.json", tmp_path):
        code, output = _run("--upstream", "http://127.0.0.1:8000", "--out", str(out), "--listen", "127.0.0.1:0")
        assert code == 2, output
        assert output.startswith(f"error: --out {out}"), output
    assert not list(tmp_path.iterdir())  # the probe file is gone


@contextmanager
def sim_thread() -> Iterator[str]:
    """The simulator on a loop of its own in a thread (no second process to start): its base URL."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with running_sim("llama-8b-h100") as (_, url):
            started.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.result(timeout=60)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()


@contextmanager
def recorder(upstream: str, out: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``agentload record`` in its own process on a free port: (the process, its base URL)."""
    with log.open("wb") as err:  # a file, not a pipe: a full pipe would block the proxy
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentload", "record", "--upstream", upstream, "--out", str(out),
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "COLUMNS": "300"},
        )  # fmt: skip
    try:
        for _ in range(1200):
            text = log.read_text(errors="replace")
            if "Recording on " in text:
                yield proc, text.split("Recording on ", 1)[1].split()[0]
                return
            if proc.poll() is not None:
                break
            time.sleep(0.05)  # a pause between reads of the log, not a measurement
        raise AssertionError(f"the recorder did not start: {log.read_text(errors='replace')}")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _send(url: str, turns: int) -> None:
    """One agent's ``turns`` turns, sent with curl-like plainness (urllib), each waiting for its reply."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count the ducks."}]
    for n in range(turns):
        body = json.dumps({"messages": messages, "max_tokens": 8, "stream": n % 2 == 0}).encode()
        request = urllib.request.Request(
            url + "/v1/chat/completions", body, {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            r.read()
        messages += [{"role": "assistant", "content": f"{n} ducks."}, {"role": "user", "content": "And now?"}]


def _recorded(out: Path) -> int:
    try:
        return sum(len(c["requests"]) for c in json.loads(out.read_text()))
    except (OSError, ValueError):
        return 0


def test_each_completed_request_is_on_disk_at_once_and_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    out, log = tmp_path / "t.json", tmp_path / "log"
    with sim_thread() as upstream, recorder(upstream, out, log) as (proc, url):
        _send(url, 3)
        # Written while the proxy still runs (each completed request rewrites the file, atomically): a kill from
        # here on loses nothing.
        for _ in range(1200):
            if _recorded(out) == 3:
                break
            time.sleep(0.05)  # a pause between reads of the file, not a measurement
        assert _recorded(out) == 3
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    assert _recorded(out) == 3
    load_conversation_trace(out)
    text = log.read_text()
    assert "recorded 3 requests in 1 sessions" in text
    assert "Traceback" not in text
    assert KEY not in text
    assert KEY not in out.read_text()
