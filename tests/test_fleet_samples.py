"""``fleet.samples``: a fleet run's server samples in its run directory, and a failed write that stops only them."""

from __future__ import annotations

import os
from pathlib import Path

from agentload.endpoint.scrape import parse_metrics
from agentload.endpoint.signals import ServerSignals
from agentload.fleet.samples import SERVER_SAMPLES, SampleLog, read_samples

METRICS = """\
vllm:num_requests_running{model_name="m"} 3
vllm:num_requests_waiting{model_name="m"} 1
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:prefix_cache_queries_total{model_name="m"} 1000
vllm:prefix_cache_hits_total{model_name="m"} 400
vllm:num_preemptions_total{model_name="m"} 2
"""


def test_each_scrape_is_appended_with_its_segment_and_a_failed_write_stops_only_the_samples(tmp_path: Path) -> None:
    notes: list[str] = []
    log = SampleLog(tmp_path, 2, note=notes.append)
    snapshot = parse_metrics(METRICS)
    log(ServerSignals(t=10.5, responding=True), snapshot)
    log(ServerSignals(t=11.5, responding=False), None)  # no answer: nothing to keep
    (got,) = read_samples(tmp_path)
    assert (got.segment, got.t, got.running, got.waiting, got.kv_usage) == (2, 10.5, 3, 1, 0.25)
    assert (got.prefix_queries, got.prefix_hits, got.preemptions) == (1000, 400, 2)
    assert log.writer is not None
    assert log.writer._fd is not None
    full = os.open("/dev/full", os.O_WRONLY)  # every write fails as on a full disk
    os.dup2(full, log.writer._fd)
    os.close(full)
    log(ServerSignals(t=12.5, responding=True), snapshot)
    log(ServerSignals(t=13.5, responding=True), snapshot)
    assert len(notes) == 1
    assert "no longer recorded" in notes[0]
    assert log.writer is None
    assert [x.t for x in read_samples(tmp_path)] == [10.5]  # what was written stays
    assert (tmp_path / SERVER_SAMPLES).read_bytes().endswith(b"\n")


def test_a_run_from_before_the_samples_has_none(tmp_path: Path) -> None:
    assert read_samples(tmp_path) == []
