"""The server's gauges and counters through a fleet run, kept in its run directory for the replay.

A fleet run scrapes the server's /metrics once a second anyway (the connection's monitor feeds the width limiter
and the watchdog); each scrape is appended to ``server.jsonl`` as a ``SegmentSample``: the bench's normalised
``ServerSample`` (``endpoint.samples.to_sample``) with the segment it was taken in, its ``t`` on that segment's
process clock, the clock the turn records' times are on, so ``agentload dashboard RUN`` lays the samples on the
same axis as the agents' turns. Each line also carries the stall watchdog's decisions so far in that segment (its
extensions granted and refused, by phase), which the replay shows as the live page does. Not ``samples.jsonl``: a
directory with that file and no manifest reads as a bench run to the store.

The samples are evidence, not commitments: they are written without fsync, and a write that fails (a full disk)
stops the sampling with one note rather than the run — the turns' checkpoint log is what a resume needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentload.endpoint.samples import ServerSample, to_sample
from agentload.endpoint.scrape import MetricsSnapshot
from agentload.endpoint.signals import ServerSignals
from agentload.endpoint.watchdog import WatchdogStatistics
from agentload.errors import CheckpointError
from agentload.store.jsonl import JsonlReader, JsonlWriter

SERVER_SAMPLES = "server.jsonl"


class SegmentSample(ServerSample):
    """A server sample and the segment (process) of the run it was taken in; one flat object on disk."""

    segment: int
    # The watchdog's extensions granted and refused so far in the segment, by phase; None when the run had no
    # watchdog to read, or was recorded before these were.
    granted: dict[str, int] | None = None
    refused: dict[str, int] | None = None


class SampleLog:
    """A ``SignalPoller`` listener that appends each scrape of the server's /metrics to ``server.jsonl``."""

    def __init__(
        self,
        run_dir: Path,
        segment: int,
        note: Callable[[str], None],
        watchdog: Callable[[], WatchdogStatistics] | None = None,
    ) -> None:
        self.segment = segment
        self.note = note
        self.watchdog = watchdog
        self.writer: JsonlWriter[SegmentSample] | None = JsonlWriter(run_dir / SERVER_SAMPLES, sync=False)

    def __call__(self, sig: ServerSignals, snapshot: MetricsSnapshot | None) -> None:
        if snapshot is None or self.writer is None:
            return
        sample = to_sample(snapshot, sig.t).sample
        wd = self.watchdog() if self.watchdog is not None else None
        line = SegmentSample(
            segment=self.segment,
            granted=None if wd is None else wd.granted,
            refused=None if wd is None else wd.refused,
            **sample.model_dump(),
        )
        try:
            self.writer.write(line)
        except CheckpointError as exc:
            self.close()
            self.note(f"warning: the server's samples are no longer recorded: {exc}")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def read_samples(run_dir: Path) -> list[SegmentSample]:
    """The samples a fleet run recorded, in order (none for a run from before they were recorded)."""
    path = run_dir / SERVER_SAMPLES
    if not path.is_file():
        return []
    return list(JsonlReader(path, SegmentSample))
