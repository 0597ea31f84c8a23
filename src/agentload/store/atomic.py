"""The one atomic writer of the project: a file is replaced whole or not at all, never seen half-written.

Every compiled file a run leaves (``result.json``, ``results.json``, ``suite.json``, ``run.json``,
``manifest.json``, the CSV export) and the HTML report go through ``atomic_file``: the bytes go to a hidden
temporary file beside the target, are fsynced, then renamed over it (``os.replace`` is atomic on POSIX within
one filesystem). A reader — ``agentload report`` while a fleet resumes, a second process — sees the old file or
the new one. On failure the temporary file is removed and one ``CheckpointError`` names the target.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from agentload.errors import CheckpointError


def _tmp_path(path: Path) -> Path:
    # Hidden and per thread of each process: two writers replacing one file never write into each other's
    # temporary file (per process only, two threads collided: one renamed the file the other was still writing).
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


@contextmanager
def atomic_file(path: Path, *, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file to write ``path`` through; it replaces ``path`` when the block ends without an exception."""
    tmp = _tmp_path(path)
    try:
        with tmp.open("w", encoding="utf-8", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    with atomic_file(path) as f:
        f.write(text)
