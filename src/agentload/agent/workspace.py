"""One agent's workspace directory, opened so that nothing can race a file tool out of it (issue 15, item 9).

Resolving a path and then opening it (``Path.resolve()``, check, ``open``) leaves a window between the check and
the open: another local process that swaps a workspace subdirectory for a symlink in that window gets the write
outside (the issue's campaign: 14–26 of 3,000). So nothing here opens by path. The workspace root is opened as a
directory handle (and checked to be the very directory made at the start, by device and inode), and every
component below it is opened relative to the handle of the one before — ``O_DIRECTORY | O_NOFOLLOW`` for
directories, ``O_NOFOLLOW`` for the file — the ``openat`` walk of ``openat(2)``/``O_NOFOLLOW`` and of
``os.fwalk``. A symlink anywhere, planted before or during the call, fails the open instead of being followed.

``..`` is resolved lexically before the walk (no component is a link, so the lexical and the physical parent are
the same); one that climbs above the root is refused, as is an absolute path. The file itself is opened with
``O_NONBLOCK`` and ``fstat``-ed before any read or write: a FIFO, device or socket is refused without blocking the
event loop (a FIFO with no writer would block a plain ``open`` forever). A write never truncates before that
check, and refuses a file with more than one hard link (a link to a file outside would write through it). Reads
and writes are capped at ``MAX_FILE_BYTES``; a listing stops at ``MAX_LISTED`` names.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

# 1 MiB: far above what an agent's tool result should carry into a prompt, far below what fills a disk.
MAX_FILE_BYTES = 1 << 20
MAX_LISTED = 10_000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class WorkspaceError(PermissionError):
    """A path the workspace refuses; the tool registry reports its message to the model."""


def _components(relative: str) -> list[str]:
    """The path's components below the root, ``.`` and ``..`` resolved; refuses absolute paths and escapes."""
    if "\x00" in relative:
        raise WorkspaceError(f"{relative!r} contains a NUL byte")
    if relative.startswith("/"):
        raise WorkspaceError(f"{relative!r} is outside the agent's workspace (an absolute path)")
    parts: list[str] = []
    for part in relative.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise WorkspaceError(f"{relative!r} is outside the agent's workspace")
            parts.pop()
            continue
        parts.append(part)
    return parts


def _refusal(relative: str, exc: OSError) -> WorkspaceError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return WorkspaceError(
            f"{relative!r}: a symbolic link or a non-directory is in the way (links are not followed)"
        )
    if exc.errno == errno.ENXIO:
        return WorkspaceError(f"{relative!r} is not a regular file")
    return WorkspaceError(f"{relative!r}: {exc.strerror or exc}")


class Workspace:
    """File access confined to ``root`` (created if missing); see the module docstring."""

    def __init__(self, root: Path, *, max_bytes: int = MAX_FILE_BYTES) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.max_bytes = max_bytes
        st = os.stat(self.root, follow_symlinks=False)
        self._identity = (st.st_dev, st.st_ino)

    # -- handles -----------------------------------------------------------------------------------------------
    def _open_root(self) -> int:
        fd = os.open(self.root, _DIR_FLAGS)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            raise WorkspaceError("the agent's workspace directory was replaced")
        return fd

    @contextlib.contextmanager
    def _directory(self, relative: str, parts: list[str], *, create: bool) -> Iterator[int]:
        """A handle on the directory ``parts`` names, walked from the root one component at a time."""
        fd = self._open_root()
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)  # mkdir never follows a link at its last component
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _refusal(relative, exc) from exc
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _regular(self, relative: str, fd: int) -> os.stat_result:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceError(f"{relative!r} is not a regular file")
        return st

    # -- the tools' operations ---------------------------------------------------------------------------------
    def read_text(self, relative: str) -> str:
        parts = _components(relative)
        if not parts:
            raise WorkspaceError(f"{relative!r} is a directory")
        with self._directory(relative, parts[:-1], create=False) as dir_fd:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | _FILE_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(relative, exc) from exc
            try:
                st = self._regular(relative, fd)
                if st.st_size > self.max_bytes:
                    raise WorkspaceError(
                        f"{relative!r} is {st.st_size} bytes; files over {self.max_bytes} are not read"
                    )
                data = _read_at_most(fd, self.max_bytes + 1)
            finally:
                os.close(fd)
        if len(data) > self.max_bytes:  # it grew after the fstat
            raise WorkspaceError(f"{relative!r} is over {self.max_bytes} bytes; not read")
        return data.decode("utf-8")

    def write_text(self, relative: str, text: str) -> str:
        """Write ``text``; returns the path as written (normalised)."""
        parts = _components(relative)
        if not parts:
            raise WorkspaceError(f"{relative!r} is a directory")
        data = text.encode("utf-8")
        if len(data) > self.max_bytes:
            raise WorkspaceError(f"{len(data)} bytes is over the {self.max_bytes}-byte limit of write_file")
        with self._directory(relative, parts[:-1], create=True) as dir_fd:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | _FILE_FLAGS, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(relative, exc) from exc
            try:
                st = self._regular(relative, fd)
                if st.st_nlink > 1:
                    raise WorkspaceError(f"{relative!r} has other hard links; not written through")
                os.ftruncate(fd, 0)  # only now: truncating before the checks would empty whatever was opened
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        return "/".join(parts)

    def list_files(self, relative: str) -> list[str]:
        """Regular files under ``relative`` (links are listed by neither name nor target), sorted."""
        parts = _components(relative)
        prefix = "/".join(parts)
        names: list[str] = []
        with self._directory(relative, parts, create=False) as base_fd:
            # fwalk opens each subdirectory relative to its parent's handle and never follows links.
            for dirpath, _dirs, files, dir_fd in os.fwalk(".", dir_fd=base_fd, follow_symlinks=False):
                for name in files:
                    with contextlib.suppress(OSError):  # removed meanwhile: not listed
                        if stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                            below = os.path.normpath(os.path.join(dirpath, name))
                            names.append(f"{prefix}/{below}" if prefix else below)
                if len(names) >= MAX_LISTED:
                    break
        return sorted(names)[:MAX_LISTED]


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(1 << 16, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
