"""Run inside a network namespace with only loopback (``test_ray_executor.py`` starts it): the simulator over HTTP,
then ``agentload bench`` on it, in one process and with ``--executor ray``; with ``kill``, one Ray actor is killed
(SIGKILL) once the level has saved turns. ``fleet-compare`` and ``fleet-kill`` do the same with ``agentload run``
on a fleet. Each run's directory is left under OUT for the test to read.

    python tests/ray_scenarios.py compare|kill|fleet-compare|fleet-kill OUT
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # run as a script: the repository's tests package
from tests.simserver import sim_process

BENCH = ["--agents", "6", "--context", "4096", "--warmup", "2s", "--seed", "5"]


def bench(url: str, model: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentload",
            "bench",
            "--url",
            url,
            "--model",
            model,
            *BENCH,
            "--out",
            str(out),
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", "RAY_DISABLE_USAGE_STATS": "1"},
    )


def finish(p: subprocess.Popen[str], name: str, out: Path) -> None:
    stdout, stderr = p.communicate(timeout=600)
    (out / f"{name}.stderr").write_text(stderr)
    (out / f"{name}.json").write_text(stdout)
    if p.returncode != 0:
        raise SystemExit(f"{name} exited {p.returncode}: {stderr[-3000:]}")


FLEET = """
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 6
max_tokens = 24
think_time_s = 1.0
context_tokens = 600
tool_result_tokens = 60

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = 8
"""


def fleet(url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    spec = out.parent / "fleet.toml"
    spec.write_text(FLEET)
    return subprocess.Popen(
        [sys.executable, "-m", "agentload", "run", str(spec), "--url", url, "--mode", "parallel", "--width", "8",
         "--out", str(out), "--json", "--progress", "none", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", "RAY_DISABLE_USAGE_STATS": "1"},
    )  # fmt: skip


def turns(out: Path) -> int:
    lines = [line for f in out.glob("*/turns.jsonl") for line in f.read_text().splitlines()]
    return sum(1 for line in lines if line.startswith('{"kind":"turn"'))


def workers(kind: str = "LevelWorker") -> list[int]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [int(line.split()[0]) for line in ps.splitlines() if f"ray::{kind}" in line]


def records(out: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in out.glob("*/records.jsonl"))


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    with sim_process("laptop") as (_, url):
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            model = json.load(r)["data"][0]["id"]
        if mode == "compare":
            for name, extra in (("local", ()), ("ray", ("--executor", "ray", "--workers", "2"))):
                finish(bench(url, model, out / name, "--window", "8s", *extra), name, out)
            return
        if mode == "fleet-compare":
            for name, extra in (("local", ()), ("ray", ("--executor", "ray", "--workers", "2"))):
                finish(fleet(url, out / name, *extra), name, out)
            return
        if mode == "fleet-kill":
            p = fleet(url, out / "kill", "--executor", "ray", "--workers", "2")
            deadline = time.monotonic() + 240
            while turns(out / "kill") < 10 and time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.1)
            pids = workers("FleetWorker")
            if not pids:
                raise SystemExit("no Ray actor to kill")
            os.kill(pids[0], signal.SIGKILL)
            (out / "killed").write_text(f"{len(pids)} actors, killed one after {turns(out / 'kill')} turns")
            finish(p, "kill", out)
            return
        p = bench(url, model, out / "kill", "--window", "14s", "--executor", "ray", "--workers", "2")
        deadline = time.monotonic() + 240
        while records(out / "kill") < 12 and time.monotonic() < deadline and p.poll() is None:  # in the window
            time.sleep(0.2)
        pids = workers()
        if not pids:
            raise SystemExit("no Ray actor to kill")
        os.kill(pids[0], signal.SIGKILL)
        (out / "killed").write_text(f"{len(pids)} actors, killed one after {records(out / 'kill')} records")
        finish(p, "kill", out)


if __name__ == "__main__":
    main()
