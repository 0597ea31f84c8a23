"""Append-only JSON Lines files: one pydantic model per line, written as the run goes, read back lazily.

Every ``write`` hands its whole line to the kernel in one ``os.write`` on an ``O_APPEND`` descriptor, with no
buffer in this process: when the run dies (an exception, Ctrl-C, SIGKILL), every line already written is in
the file. ``flush`` adds ``fsync``, which only matters if the *machine* dies; the benchmark calls it at the end
of each level rather than per request, because an fsync costs milliseconds on some disks and a level can
finish thousands of requests a second in virtual time. ``append`` is the durable write, for a log whose every line
is a commitment (the fleet's checkpoint, ``fleet.checkpoint``): the line, then its ``fsync`` off the event loop,
before the caller goes on. A writer made with ``sync=False`` never fsyncs (a run in simulated time, where an fsync
would stall the loop for nothing measured).

A line can still be torn (the disk filled, or the machine died between write and fsync): it has no newline.
Readers drop such a last line and say so; a writer reopening the file cuts it off first, so its own lines
start clean. A complete line that does not parse is damage, not a torn write, and is an error.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from agentload.errors import CheckpointError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def cut_torn_tail(path: Path) -> int:
    """Truncate ``path`` after its last newline; returns the bytes removed (0: nothing was torn)."""
    try:
        with path.open("rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            # Walk back in blocks: a torn line is at most one record long, so this reads little.
            pos = size
            block = 1 << 16
            while pos > 0:
                start = max(0, pos - block)
                f.seek(start)
                chunk = f.read(pos - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                pos = start
            else:
                keep = 0
            if keep < size:
                f.truncate(keep)
                # Durable like the lines before it: a resume that cut a torn line must not see it come back.
                f.flush()
                os.fsync(f.fileno())
            return size - keep
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise CheckpointError(f"cannot repair {path}: {exc.strerror or exc}") from exc


class JsonlWriter(Generic[M]):
    """Appends one model per line to ``path`` (created if missing; an existing file is continued)."""

    def __init__(self, path: Path, *, sync: bool = True) -> None:
        self.path = path
        self.sync = sync  # False: never fsync (see the module docstring)
        self.written = 0  # lines written by this writer
        cut_torn_tail(path)
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise CheckpointError(f"cannot open {path} for appending: {exc.strerror or exc}") from exc

    def write(self, item: M) -> None:
        self.write_line(item.model_dump_json())

    def write_line(self, json_text: str) -> None:
        """Append one line of already serialised JSON (it must not contain a newline)."""
        if self._fd is None:
            raise CheckpointError(f"{self.path} is closed")
        data = memoryview((json_text + "\n").encode("utf-8"))
        try:
            # A regular file takes the whole buffer in one call unless the disk is full; loop for that case so
            # a short write is never silently left as a torn line followed by more lines.
            while data:
                done = os.write(self._fd, data)
                data = data[done:]
        except OSError as exc:
            raise CheckpointError(f"cannot append to {self.path}: {exc.strerror or exc}") from exc
        self.written += 1

    async def append(self, item: M) -> None:
        """``write``, then ``flush`` off the event loop: the caller waits for the disk, the other tasks keep running.

        One synchronous write per line: no other coroutine can interleave bytes into it, and the kernel completes a
        regular-file write even when the process is killed during it. So the line is in the file before the first
        await, and a cancel can land only after it.
        """
        self.write(item)
        if self.sync:
            await asyncio.to_thread(self.flush)

    def flush(self) -> None:
        """Make every line written so far durable (survives a machine crash, not only a process death)."""
        if self._fd is None or not self.sync:
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise CheckpointError(f"cannot sync {self.path}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        """Sync (unless ``sync=False``) and close."""
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            self.release()

    def release(self) -> None:
        """Close without syncing: every line is already in the kernel's hands (a process death loses none)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __enter__(self) -> JsonlWriter[M]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class JsonlReader(Generic[T]):
    """Iterates the items of a JSONL file, each line validated against ``schema`` (a model or a ``TypeAdapter``,
    e.g. a discriminated union of line kinds); ``torn_bytes`` tells, after iterating, whether a torn tail was
    dropped, and ``numbered`` gives each item with its line number (for errors that point at the file)."""

    def __init__(self, path: Path, schema: type[T] | TypeAdapter[T], *, what: str | None = None) -> None:
        self.path = path
        self._adapter: TypeAdapter[T] = schema if isinstance(schema, TypeAdapter) else TypeAdapter(schema)
        self.what = what or getattr(schema, "__name__", "line")
        self.torn_bytes = 0

    def numbered(self) -> Iterator[tuple[int, T]]:
        self.torn_bytes = 0
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        with f:
            for number, line in enumerate(f, start=1):
                if not line.endswith(b"\n"):
                    self.torn_bytes = len(line)
                    return
                if not line.strip():
                    continue
                try:
                    yield number, self._adapter.validate_json(line)
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(p) for p in first["loc"]) or "line"
                    raise CheckpointError(f"{self.path}:{number}: not a {self.what} ({where}: {first['msg']})") from exc

    def __iter__(self) -> Iterator[T]:
        for _, item in self.numbered():
            yield item
