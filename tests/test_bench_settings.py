"""``BenchSettings`` (a bench run's flags, checked once, stored as ``bench.json`` and read back to resume) and the
bench application driven through its own API (``BenchSession``), heard by one observer."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentload.bench.analysis import LevelData
from agentload.bench.observe import Observers, Unobserved
from agentload.bench.results import LevelSummary
from agentload.bench.search import SearchStep
from agentload.bench.session import BenchSession
from agentload.bench.settings import DEFAULT_SIM, BenchSettings
from agentload.cli.bench import bench
from agentload.endpoint.connection import Connection
from agentload.endpoint.records import RequestRecord
from agentload.errors import CheckpointError, ConfigError

WHERE = Path("runs/20260101-000000-abcd/bench.json")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"url": "http://127.0.0.1:9", "sim": "laptop"}, "not both"),
        ({"sim": "laptop", "offload_gib": 4.0, "url": None, "agents": 1}, None),
        ({"url": "http://127.0.0.1:9", "offload_gib": 4.0, "agents": 1}, "--offload-gib"),
        ({"sim": "laptop", "model": "m", "agents": 1}, "--model goes with --url"),
        ({"sim": "laptop", "api_key_env": "K", "agents": 1}, "--api-key-env goes with --url"),
        ({"sim": "laptop", "sweep": "1,2", "soak": "1m"}, "choose one of --sweep, --find-knee, --soak"),
        ({"sim": "laptop", "sweep": "1,x"}, "--sweep '1,x'"),
        ({"sim": "laptop", "sweep": "0,4"}, "at least 1"),
        ({"sim": "laptop", "agents": 100_001}, "--agents 100,001: at most 100,000"),
        ({"sim": "laptop", "agents": 1, "context": "2000,"}, None),
        ({"sim": "laptop", "agents": 1, "context": "99999999"}, "--context"),
        ({"sim": "laptop", "agents": 1, "warmup": "1.2.3s"}, "--warmup"),
        ({"sim": "laptop", "agents": 1, "window": "0s"}, "must be positive"),
        ({"sim": "laptop", "agents": 1, "soak": "31d"}, "--soak"),
        ({"sim": "laptop", "agents": 1, "soak": "10m", "window": "soon"}, "--window"),
        ({"sim": "laptop", "soak": "10m"}, "--soak needs --agents"),
        ({"url": "http://127.0.0.1:9"}, "say what to run"),
        ({"sim": "laptop", "find_knee": True, "slo": "ttft_p95"}, "--slo"),
    ],
)
def test_a_bad_flag_or_combination_is_one_config_error(flags: dict[str, Any], says: str | None) -> None:
    if says is None:
        BenchSettings.model_validate(flags)
        return
    with pytest.raises(ConfigError, match=None) as caught:
        BenchSettings.model_validate(flags)
    assert says in str(caught.value)


def test_what_the_flags_mean_is_derived_from_the_settings() -> None:
    bare = BenchSettings()
    assert (bare.simulator, bare.mode, bare.counts) == (DEFAULT_SIM, "find-knee", [])
    # `--agents N` alone on the default simulator still means one level of N agents.
    assert (BenchSettings(agents=3).mode, BenchSettings(agents=3).counts) == ("single", [3])
    grid = BenchSettings(sim="laptop", context="8192,4096,8192", sweep="4,1,2")
    assert (grid.mode, grid.contexts, grid.counts) == ("grid", [4096, 8192], [1, 2, 4])
    soak = BenchSettings(sim="laptop", soak="30m", agents=8, window="90s", warmup="2m")
    assert (soak.mode, soak.counts, soak.window_s, soak.warmup_s) == ("soak", [8], 1800.0, 120.0)
    real = BenchSettings(url="http://127.0.0.1:9/v1", sweep="1,2", wait_ready="1h")
    assert (real.simulator, real.mode, real.wait_ready_s) == (None, "sweep", 3600.0)


def test_the_typer_signature_and_the_settings_agree() -> None:
    # The run's flags are the model's fields: each is a parameter of the command, with the model's default.
    params = inspect.signature(bench).parameters
    for name, field in BenchSettings.model_fields.items():
        assert name in params, name
        assert params[name].default == field.default, name


def test_the_stored_invocation_round_trips() -> None:
    settings = BenchSettings(sim="laptop", context="4096,8192", sweep="1,2,4", warmup="5s", window="20s",
                             min_turns=10, tolerance=0.2, no_pin_slots=False, seed=7)  # fmt: skip
    stored = json.loads(json.dumps(settings.stored()))
    assert stored["sweep"] == "1,2,4"
    assert "url_redacted" not in stored
    assert BenchSettings.resumed(stored, {}, WHERE) == settings


def test_a_url_with_credentials_is_stored_without_them_and_must_be_given_again() -> None:
    settings = BenchSettings(url="http://user:secret@127.0.0.1:9/v1", agents=2)
    stored = json.loads(json.dumps(settings.stored()))
    assert stored["url_redacted"] is True
    assert "secret" not in json.dumps(stored)
    with pytest.raises(ConfigError, match="give that --url again"):
        BenchSettings.resumed(stored, {}, WHERE)
    with pytest.raises(ConfigError, match="give that --url again"):
        BenchSettings.resumed(stored, {"url": "http://user:secret@127.0.0.1:10/v1"}, WHERE)
    again = BenchSettings.resumed(stored, {"url": "http://user:secret@127.0.0.1:9/v1"}, WHERE)
    assert again == settings


def test_an_old_stored_invocation_resumes() -> None:
    # bench.json as an agentload before slot pinning wrote it: no no_pin_slots, a float written as a whole number.
    old = {"url": None, "model": None, "api_key_env": None, "sim": "laptop", "workload": "agentic-hold",
           "context": "4096", "sweep": "1,2,4", "find_knee": False, "slo": None, "soak": None, "agents": None,
           "warmup": "5s", "window": "20s", "tolerance": 0, "max_agents": 1024, "compare_synthetic": False,
           "seed": 0, "same_text": False, "natural_output": False, "min_turns": 10, "wait_ready": "120s"}  # fmt: skip
    settings = BenchSettings.resumed(old, {}, WHERE)
    assert settings.no_pin_slots is True  # those runs let the server choose slots; resumed, they go on so
    assert settings.tolerance == 0.0
    assert settings.offload_gib is None
    # How to reach the server may be given again; the run's own flags may not.
    assert BenchSettings.resumed(old, {"wait_ready": "5m"}, WHERE).wait_ready_s == 300.0
    with pytest.raises(ConfigError, match="drop --sweep, --window"):
        BenchSettings.resumed(old, {"window": "60s", "sweep": "1,2", "wait_ready": "5m"}, WHERE)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"agents": "4"}, "bench.json: agents"),
        ({"find_knee": "yes"}, "bench.json: find_knee"),
        ({"url_redacted": "yes"}, "bench.json: url_redacted"),
        ({"turbo": True}, "flags this agentload does not know (turbo)"),
    ],
)
def test_a_damaged_stored_invocation_is_a_checkpoint_error(change: dict[str, Any], says: str) -> None:
    stored = {**BenchSettings(sim="laptop", agents=2).stored(), **change}
    with pytest.raises(CheckpointError) as caught:
        BenchSettings.resumed(stored, {}, WHERE)
    assert says in str(caught.value)


class Heard(Unobserved):
    """Everything a bench tells, in order, as (call, level) pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.record = self.heard_record
        self.calls: list[tuple[str, int | None]] = []
        self.undone = 0
        self.summaries: list[LevelSummary] = []

    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None:  # fmt: skip
        self.calls.append(("started", level))

    def connected(self, conn: Connection) -> Callable[[], None]:
        self.calls.append(("connected", None))

        def undo() -> None:
            self.undone += 1

        return undo

    def heard_record(self, record: RequestRecord) -> None:
        self.calls.append(("record", record.ids.level))

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        assert data.level == summary.level
        self.calls.append(("done", data.level))
        self.summaries.append(summary)

    def step(self, step: SearchStep) -> None:
        self.calls.append(("step", step.agents))


def test_the_application_runs_a_bench_heard_through_one_observer() -> None:
    settings = BenchSettings(sim="laptop", context="2000", sweep="1,2", warmup="1s", window="4s", min_turns=4)
    session = BenchSession.open(settings)
    assert session.virtual
    first, second = Heard(), Heard()
    try:
        result, data = session.drive(session.measure(Observers([first, second]), run_id="test-run"))
    finally:
        session.close()
    assert result.run_id == "test-run"
    assert [lv.agents for lv in result.levels] == [1, 2]
    assert first.calls == second.calls  # every observer hears the same calls, in the same order
    # Each level: started, its connection, its requests, then done (after its last request); the sweep's steps.
    for level in (0, 1):
        mine = [i for i, (_, lv) in enumerate(first.calls) if lv == level and first.calls[i][0] != "step"]
        kinds = [first.calls[i][0] for i in mine]
        assert kinds[0] == "started"
        assert kinds[-1] == "done"
        assert set(kinds[1:-1]) == {"record"}
        assert first.calls[mine[0] + 1] == ("connected", None)
    assert [c for c in first.calls if c[0] == "step"] == [("step", 1), ("step", 2)]
    assert first.undone == 2  # each level's subscription undone when it ended
    assert [s.model_dump() for s in first.summaries] == [lv.model_dump() for lv in result.levels]
    records = sum(1 for kind, _ in first.calls if kind == "record")
    assert records == sum(len(lv.records) for lv in data)


def test_a_single_record_sink_is_called_directly_and_several_each_once() -> None:
    got: list[RequestRecord] = []

    class Sink(Unobserved):
        def __init__(self) -> None:
            super().__init__()
            self.record = got.append

    one = Sink()
    # The one observer that takes records is the sink a turn calls: no fan-out frame on a turn's path.
    assert Observers([Unobserved(), one, Unobserved()]).record is one.record
    both = Observers([Sink(), Sink()])
    record = RequestRecord(t_sent=1.0, t_done=2.0)
    both.record(record)
    assert got == [record, record]
