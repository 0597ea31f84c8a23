"""A fleet whose server dies or freezes mid-run: time to exit, what is left resumable, and the resume.

The issue's experiment, as a user runs it: ``agentload sim`` (profile laptop) in one process, ``agentload run
examples/laptop-knee.toml --url …`` in another; ``--at`` seconds after the first committed turn the server is
SIGKILLed (``--fault kill``) or SIGSTOPped (``--fault freeze``; killed once the run has ended). Printed: seconds
from the fault to the run's exit, its exit code and error line, agents done / interrupted / unstarted / failed
from its results.json; then a fresh server, ``agentload run --resume RUN_DIR``, and the same counts after it.

    .venv/bin/python benchmarks/bench_fleet_crash.py [--fault kill|freeze] [--at 15] [--fleet examples/laptop-knee.toml]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENTLOAD = [sys.executable, "-m", "agentload"]


def start_sim(workdir: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*AGENTLOAD, "sim", "--port", "0", "--profile", "laptop"], stdout=out, stderr=out)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("Serving "):
                return proc, "http://" + line.split("http://", 1)[1].split()[0]
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the simulator did not start: {log.read_text(errors='replace')}")


def counts(run_dir: Path) -> str:
    totals = json.loads((run_dir / "results.json").read_text())["totals"]
    return (
        f"{totals['done']} done, {totals['interrupted']} interrupted, {totals['unstarted']} unstarted, "
        f"{totals['failed']} failed, {totals['turns']} turns"
    )


def run_cli(args: list[str], workdir: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"{name}.out"
    with log.open("wb") as out:
        proc = subprocess.Popen([*AGENTLOAD, "run", *args, "--progress", "lines"], stdout=out, stderr=out)
    return proc, log


def last_error(log: Path) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("error: ")]
    return lines[-1] if lines else "(no error line)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["kill", "freeze"], default="kill")
    parser.add_argument("--at", type=float, default=15.0, help="seconds into the run")
    parser.add_argument("--fleet", default=str(Path(__file__).parents[1] / "examples" / "laptop-knee.toml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        runs = workdir / "runs"
        sim, url = start_sim(workdir, "first")
        run, out = run_cli([args.fleet, "--url", url, "--out", str(runs)], workdir, "first")
        # ``--at`` counts from the first committed turn: on a busy machine the probe alone can take seconds.
        while not any(runs.glob("*/turns.jsonl")) or "turn" not in next(runs.glob("*/turns.jsonl")).read_text():
            if run.poll() is not None:
                raise SystemExit(f"the run ended before its first turn: {out.read_text()}")
            time.sleep(0.1)
        time.sleep(args.at)
        if run.poll() is not None:
            raise SystemExit(f"the run ended before the fault: {out.read_text()}")
        os.kill(sim.pid, signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
        faulted = time.monotonic()
        code = run.wait(timeout=600)
        to_exit = time.monotonic() - faulted
        sim.kill()
        sim.wait()
        if not runs.exists():
            raise SystemExit(f"no run directory; the run said:\n{out.read_text(errors='replace')}")
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]  # the root may also hold history.sqlite
        when = f"{args.fault} {args.at:.0f} s after the first turn"
        print(f"{when}: the run exited {code} after {to_exit:.1f} s; {last_error(out)}")
        print(f"  saved in results.json: {counts(run_dir)}")
        sim, url = start_sim(workdir, "second")
        started = time.monotonic()
        resumed, out = run_cli(["--resume", str(run_dir), "--url", url], workdir, "second")
        code = resumed.wait(timeout=3600)
        sim.kill()
        sim.wait()
        print(f"resume: exited {code} after {time.monotonic() - started:.1f} s; {counts(run_dir)}")


if __name__ == "__main__":
    main()
