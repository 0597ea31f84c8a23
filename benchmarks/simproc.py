"""Run the simulated server as a separate process for benchmarks (pinned to its own core when there are two)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fast_profile(step_s: float) -> str:
    """A profile whose every step takes ``step_s`` of modelled time, whatever the batch: only CPU limits it."""
    return f"""
name = "bench-fast"
model = "qwen2.5-0.5b"
gpu = "laptop"
max_model_len = 16384
max_num_batched_tokens = 65536
max_num_seqs = 4096
[kv_pool]
tokens = 4000000
[step]
api_overhead_s = 0.0
[step.pinned]
prefill_s_per_token = 1e-12
attention_s_per_pair = 0.0
weights_s = {step_s}
kv_s_per_token = 0.0
step_s = 0.0
request_s = 0.0
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def sim_process(profile_text: str, *extra: str, pin: bool = True) -> Iterator[tuple[subprocess.Popen[str], str, int]]:
    """Start ``agentload sim`` on a free loopback port; yield (process, host, port); stop it afterwards.

    With two or more cores (and ``pin``) the server is pinned to the first and this process to the second, so
    client and server do not steal each other's time.
    """
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "bench.toml"
        profile.write_text(profile_text)
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentload", "sim", "--profile", str(profile), "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stdout is not None
            address = ""
            for line in proc.stdout:
                if line.startswith("Serving "):
                    address = line.split("http://", 1)[1].split()[0]
                    break
            if not address:
                raise SystemExit("the simulated server did not start")
            cores = sorted(os.sched_getaffinity(0))
            if pin and len(cores) >= 2:
                os.sched_setaffinity(proc.pid, {cores[0]})
                os.sched_setaffinity(0, {cores[1]})
            host, port = address.rsplit(":", 1)
            yield proc, host, int(port)
        finally:
            proc.terminate()
            proc.communicate(timeout=10)
