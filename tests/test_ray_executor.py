"""``bench --executor ray`` on a real Ray, in a network namespace that has only loopback (Ray binds the machine's
address otherwise, and must never reach another host): the simulator over HTTP, benched in one process and over two
Ray actors, and once with an actor killed mid-level (``ray_scenarios.py`` runs inside the namespace).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).parent / "ray_scenarios.py"
# A user, network, PID and mount namespace: only loopback (brought up inside), and every process Ray starts in it
# ends with it (its first process is the namespace's init), whatever happens to the run.
NAMESPACE = ("unshare", "-rn", "--pid", "--fork", "--mount-proc")


def _namespace_works() -> str | None:
    """None when a loopback-only network namespace can be made here, else why not."""
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install 'agentload[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) for a loopback-only network namespace"
    probe = subprocess.run([*NAMESPACE, "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace here: {probe.stderr.strip()}"
    return None


WHY_NOT = _namespace_works()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]


def _scenario(mode: str, out: Path) -> None:
    cmd = f"ip link set lo up && exec {sys.executable} {SCENARIOS} {mode} {out}"
    done = subprocess.run([*NAMESPACE, "bash", "-c", cmd], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]


def _records(run_root: Path) -> list[dict[str, object]]:
    (run,) = [p for p in run_root.iterdir() if p.is_dir()]
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def _key(r: dict[str, object]) -> tuple[str, int, int]:
    ids = r["ids"]
    assert isinstance(ids, dict)
    return ids["agent"], ids["turn"], ids["attempt"]


def test_two_ray_actors_run_the_agents_one_process_runs_turn_for_turn(tmp_path: Path) -> None:
    _scenario("compare", tmp_path)
    local, ray = _records(tmp_path / "local"), _records(tmp_path / "ray")
    result = json.loads((tmp_path / "ray.json").read_text())
    assert result["settings"]["executor"] == "ray: 2 actors on this machine (one clock)"
    a = {_key(r): (r["prompt_tokens"], r["completion_tokens"]) for r in local}
    b = {_key(r): (r["prompt_tokens"], r["completion_tokens"]) for r in ray}
    assert len(b) == len(ray)  # nothing recorded twice
    assert {k[0] for k in b} == {f"agent-{i}/s0" for i in range(6)}  # every agent ran
    common = set(a) & set(b)
    # Real time: the two runs complete different numbers of turns, but a turn both ran is the same turn.
    assert len(common) >= 0.6 * min(len(a), len(b))
    assert all(a[k] == b[k] for k in common)


def test_a_killed_actor_loses_no_saved_turn_and_its_agents_go_on_from_their_next_session(tmp_path: Path) -> None:
    _scenario("kill", tmp_path)
    records = _records(tmp_path / "kill")
    counts = Counter(_key(r) for r in records)
    assert max(counts.values()) == 1  # no turn saved twice
    result = json.loads((tmp_path / "kill.json").read_text())
    (level,) = result["levels"]
    note = next(w for w in level["warnings"] if "died during this level" in w)
    dead = int(note.split("actor ", 1)[1].split(" ", 1)[0])
    assert "3 of its 3 agents went on" in note
    agents = {str(_key(r)[0]) for r in records}
    for i in range(dead, 6, 2):  # the dead actor's agents: a first session saved, then the next one
        assert f"agent-{i}/s0" in agents, sorted(agents)
        assert f"agent-{i}/s1" in agents, sorted(agents)


def _fleet_turns(run_root: Path) -> dict[tuple[str, int], tuple[int, int]]:
    """Each committed turn (agent, round) of the run's log: its final request's prompt and completion tokens."""
    (run,) = [p for p in run_root.iterdir() if p.is_dir()]
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for line in (run / "turns.jsonl").read_text().splitlines():
        x = json.loads(line)
        if x["kind"] == "turn":
            key = (x["agent"], x["round"])
            assert key not in out, f"{key} committed twice"
            final = x["turn"]["records"][-1]
            out[key] = (final["prompt_tokens"], final["completion_tokens"])
    return out


def test_a_fleet_over_two_ray_actors_does_what_it_does_in_one_process(tmp_path: Path) -> None:
    _scenario("fleet-compare", tmp_path)
    local, ray = _fleet_turns(tmp_path / "local"), _fleet_turns(tmp_path / "ray")
    result = json.loads((tmp_path / "ray.json").read_text())
    assert result["executor"] == "ray: 2 actors on this machine (one clock)"
    assert result["totals"]["done"] == 8
    assert set(ray) == {(f"w.{i}", r) for i in range(8) for r in range(6)}
    assert ray == local  # the same turns, with the tokens the server counted, agent by agent


def test_a_killed_fleet_actor_loses_and_repeats_no_committed_turn(tmp_path: Path) -> None:
    _scenario("fleet-kill", tmp_path)
    turns = _fleet_turns(tmp_path / "kill")  # fails on a turn committed twice
    assert set(turns) == {(f"w.{i}", r) for i in range(8) for r in range(6)}
    result = json.loads((tmp_path / "kill.json").read_text())
    assert result["totals"]["done"] == 8
    assert any("died" in w and "sent again by the live actors" in w for w in result["warnings"]), result["warnings"]
