"""The simulator's resident memory before and after large request bodies.

Starts ``agentload sim`` in its own process, reads its VmRSS from /proc, POSTs ``--bodies`` chat bodies of
``--mb`` MB each to /v1/chat/completions (each one a single user message of words, far past the profile's context,
so the server answers 400 as vLLM does), and reads VmRSS again after each. A server that keeps nothing of a refused
body returns to about where it started.

    .venv/bin/python benchmarks/sim_body_memory.py [--profile laptop] [--mb 20] [--bodies 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's tests package

from tests.simserver import sim_process


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def body(mb: float, salt: int) -> bytes:
    """A distinct body each time (``salt``), so that nothing the server cached from one serves the next."""
    words = f"lorem{salt} ipsum dolor sit amet consectetur adipiscing elit "
    text = words * int(mb * 2**20 / len(words))
    return json.dumps({"model": None, "messages": [{"role": "user", "content": text}], "max_tokens": 8}).encode()


def post(url: str, data: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read()[:120].decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:120].decode(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="laptop")
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--bodies", type=int, default=2)
    args = ap.parse_args()
    with sim_process(args.profile) as (sim, url):
        time.sleep(1.0)  # let the freshly started server settle before the first reading
        print(f"before: {rss_mb(sim.pid):7.1f} MB")
        for i in range(args.bodies):
            data = body(args.mb, i)
            status, text = post(url + "/v1/chat/completions", data)
            time.sleep(0.5)
            size = len(data) / 2**20
            print(f"after body {i + 1} ({size:.1f} MB, HTTP {status}): {rss_mb(sim.pid):7.1f} MB  {text[:60]!r}")


if __name__ == "__main__":
    main()
