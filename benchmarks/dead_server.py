"""Seconds from a server's death or freeze to the command's exit, for bench, suite and run.

Each command runs against ``agentload sim --profile laptop`` in its own process; once the server has completed
``--after`` requests (its own counter) it is killed (SIGKILL) or frozen (SIGSTOP: connections are still accepted,
nothing answers), and the command's exit is timed. Goal: ≤ 30 s, a non-zero exit, one ``error:`` line, and what it
had collected on disk.

    .venv/bin/python benchmarks/dead_server.py [--commands bench,suite,run] [--faults kill,freeze] [--after 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

AGENTLOAD = [sys.executable, "-m", "agentload"]
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
FLEET = Path(__file__).parent.parent / "examples" / "laptop-knee.toml"


def command(name: str, url: str, root: Path) -> list[str]:
    if name == "bench":
        return ["bench", "--url", url, "--model", MODEL, "--workload", "agentic", "--context", "2000", "--agents",
                "2", "--warmup", "1s", "--window", "300s", "--out", str(root)]  # fmt: skip
    if name == "suite":
        return ["suite", "--url", url, "--model", MODEL, "--agents", "2", "--out", str(root), "--json"]
    return ["run", str(FLEET), "--url", url, "--out", str(root), "--progress", "none"]


def successes(url: str) -> float:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success"))


def one(name: str, fault: str, after: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        sim = subprocess.Popen([*AGENTLOAD, "sim", "--profile", "laptop", "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        try:
            assert sim.stdout is not None
            line = sim.stdout.readline()
            while line and not line.startswith("Serving "):
                line = sim.stdout.readline()
            url = "http://" + line.split("http://", 1)[1].split()[0]
            env = {**os.environ, "COLUMNS": "400"}
            proc = subprocess.Popen([*AGENTLOAD, *command(name, url, root)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
            while successes(url) < after and proc.poll() is None:
                time.sleep(0.2)
            os.kill(sim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            faulted = time.monotonic()
            try:
                _, err = proc.communicate(timeout=300)
                took = f"{time.monotonic() - faulted:5.1f} s"
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                took = "> 300 s"
            saved = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []
            errors = [x for x in err.splitlines() if x.startswith("error:")]
            return (f"{name:5} {fault:6} exit {proc.returncode}  {took} after the fault  "
                    f"error lines {len(errors)}: {errors[-1][:150] if errors else '-'}\n"
                    f"      saved: {', '.join(saved[:8])}")  # fmt: skip
        finally:
            if sim.poll() is None:
                os.kill(sim.pid, signal.SIGCONT)
            sim.kill()
            sim.communicate(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--commands", default="bench,suite,run")
    ap.add_argument("--faults", default="kill,freeze")
    ap.add_argument("--after", type=int, default=10, help="completed requests before the fault")
    args = ap.parse_args()
    for name in args.commands.split(","):
        for fault in args.faults.split(","):
            print(one(name, fault, args.after), flush=True)


if __name__ == "__main__":
    main()
