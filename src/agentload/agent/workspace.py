"""One agent's workspace directory, opened so that nothing can race a file tool out of it, and bounded in size.

Resolving a path and then opening it (``Path.resolve()``, check, ``open``) leaves a window between the check and
the open: another local process that swaps a workspace subdirectory for a symlink in that window gets the write
outside. So nothing here opens by path. The workspace root is opened as a directory handle (and checked to be the
very directory made at the start, by device and inode), and every component below it is opened relative to the
handle of the one before — ``O_DIRECTORY | O_NOFOLLOW`` for directories, ``O_NOFOLLOW`` for the file — the
``openat`` walk of ``openat(2)``/``O_NOFOLLOW``. A symlink anywhere, planted before or during the call, fails the
open instead of being followed.

``..`` is resolved lexically before the walk (no component is a link, so the lexical and the physical parent are
the same); one that climbs above the root is refused, as is an absolute path. The file itself is opened with
``O_NONBLOCK`` and ``fstat``-ed before any read or write: a FIFO, device or socket is refused without blocking the
event loop (a FIFO with no writer would block a plain ``open`` forever). A write never truncates before that
check, and refuses a file with more than one hard link (a link to a file outside would write through it). Reads
and writes are capped at ``MAX_FILE_BYTES``; a listing stops at ``MAX_LISTED`` names.

A model decides the paths, so it could otherwise build a tree thousands of directories deep: every recursive walk
(``os.fwalk``, ``os.walk``, ``Path.rglob``, ``shutil.rmtree``) then dies of ``RecursionError``, and one holding a
handle per level runs out of descriptors. Writes are therefore bounded in depth (``MAX_DEPTH``), entries
(``MAX_ENTRIES``) and bytes (``MAX_WORKSPACE_BYTES``), and every walk here (``scan``, ``remove_tree``) is
iterative with an explicit stack, so a tree made some other way (an older version, another process) is walked
to the bounds and no further instead of crashing whoever walks it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# 1 MiB: far above what an agent's tool result should carry into a prompt, far below what fills a disk.
MAX_FILE_BYTES = 1 << 20
MAX_LISTED = 10_000
# Components of a path below the workspace root, the file's own name included. Real projects nest a dozen deep at
# most; 32 leaves room for that while a walk's stack (one directory handle per level) stays tiny, far below the
# descriptor limit and the thousand or so levels where a recursive walk dies of RecursionError.
MAX_DEPTH = 32
# Files and directories in one workspace, handed-over copies included. An agent's notes and reports are tens of
# files and a hand-over adds at most fifty per dependency; equal to MAX_LISTED, so a listing of whatever the tools
# made is never cut, and a walk that sees this many entries can stop (the workspace is full either way).
MAX_ENTRIES = MAX_LISTED
# Bytes of regular files in one workspace: 32 files at the MAX_FILE_BYTES cap, eight times what one hand-over copies
# in, yet a fleet of a hundred agents that each fill their own still stops at 3.2 GiB of disk.
MAX_WORKSPACE_BYTES = 32 << 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class WorkspaceError(PermissionError):
    """A path the workspace refuses; the tool registry reports its message to the model."""


@dataclass
class Scan:
    """What one bounded walk saw below a directory of the workspace (``Workspace.scan``)."""

    files: list[tuple[str, int]] = field(default_factory=list)  # regular files: path below the root, size; sorted
    entries: int = 0  # files, directories, links and anything else seen, the starting directory not included
    too_deep: list[str] = field(default_factory=list)  # non-empty directories at MAX_DEPTH: not followed below
    unreadable: list[str] = field(default_factory=list)  # directories that could not be opened or read
    too_many: bool = False  # stopped at the entry bound: there is more than was seen

    @property
    def cut(self) -> bool:
        """Whether something below the starting directory was left unseen."""
        return bool(self.too_deep or self.unreadable or self.too_many)


@dataclass
class _Usage:
    entries: int
    bytes: int


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
    """File access confined to ``root`` (created if missing); see the module docstring.

    The entries and bytes the workspace holds are counted once, lazily, by one bounded walk on the first write
    (so a workspace re-created on resume, or filled by another process or an older version, is counted as it is on
    disk), then kept up to date by this object's own writes instead of walking the tree on every write. What lies
    below ``MAX_DEPTH`` is not counted: no tool can reach it. A walk cut at ``MAX_ENTRIES`` counts the workspace as
    full: no new file, and no write that grows one.
    """

    def __init__(self, root: Path, *, max_bytes: int = MAX_FILE_BYTES) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.max_bytes = max_bytes
        st = os.stat(self.root, follow_symlinks=False)
        self._identity = (st.st_dev, st.st_ino)
        self._used: _Usage | None = None

    # -- handles -----------------------------------------------------------------------------------------------
    def _open_root(self) -> int:
        fd = os.open(self.root, _DIR_FLAGS)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            raise WorkspaceError("the agent's workspace directory was replaced")
        return fd

    @contextlib.contextmanager
    def _directory(self, relative: str, parts: list[str], *, create: bool, file_bytes: int = 0) -> Iterator[int]:
        """A handle on the directory ``parts`` names, walked from the root one component at a time.

        With ``create``, missing directories are made, each admitted first against the workspace's bounds together
        with the ones still to make below it and a new file of ``file_bytes``, so a refused write leaves none behind.
        """
        fd = self._open_root()
        try:
            for i, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError as exc:
                    if not create:
                        raise _refusal(relative, exc) from exc
                    self._admit(relative, len(parts) - i + 1, file_bytes)
                    with contextlib.suppress(FileExistsError):  # made meanwhile: the open below takes it
                        os.mkdir(part, 0o755, dir_fd=fd)  # mkdir never follows a link at its last component
                        self._usage().entries += 1
                    try:
                        child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except OSError as exc2:
                        raise _refusal(relative, exc2) from exc2
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

    # -- bounds ------------------------------------------------------------------------------------------------
    def _usage(self) -> _Usage:
        if self._used is None:
            with self._directory(".", [], create=False) as fd:
                seen = _scan(fd, [], MAX_ENTRIES)
            used = _Usage(seen.entries, sum(size for _, size in seen.files))
            if seen.too_many:  # more than a walk may see: full, whatever the true figures are
                used = _Usage(max(used.entries, MAX_ENTRIES), max(used.bytes, MAX_WORKSPACE_BYTES))
            self._used = used
        return self._used

    def _over(self, relative: str, entries: int, size: int) -> WorkspaceError | None:
        """Why ``entries`` new entries and ``size`` more bytes do not fit, or None when they do."""
        used = self._usage()
        if used.entries + entries > MAX_ENTRIES:
            return WorkspaceError(
                f"{relative!r} not written: the workspace holds {used.entries} files and directories and may hold "
                f"at most {MAX_ENTRIES}"
            )
        if size > 0 and used.bytes + size > MAX_WORKSPACE_BYTES:
            return WorkspaceError(
                f"{relative!r} not written: {size} more bytes would take the workspace's files over their "
                f"{MAX_WORKSPACE_BYTES}-byte limit ({used.bytes} bytes used)"
            )
        return None

    def _admit(self, relative: str, entries: int, size: int) -> None:
        refused = self._over(relative, entries, size)
        if refused is not None:
            raise refused

    def _open_for_write(self, relative: str, name: str, dir_fd: int, size: int) -> tuple[int, bool]:
        """A write handle on ``name`` and whether it was just created (only when a new file of ``size`` fits)."""
        flags = os.O_WRONLY | _FILE_FLAGS
        refused = self._over(relative, 1, size)
        if refused is None:
            try:
                # O_EXCL tells a new file from an old one (the counts need to know); it never follows a link either.
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise _refusal(relative, exc) from exc
            else:
                self._usage().entries += 1
                return fd, True
        try:
            return os.open(name, flags, dir_fd=dir_fd), False
        except FileNotFoundError as exc:
            raise (refused or _refusal(relative, exc)) from exc
        except OSError as exc:
            raise _refusal(relative, exc) from exc

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
        """Write ``text``; returns the path as written (normalised). Refuses what would break a bound."""
        parts = _components(relative)
        if not parts:
            raise WorkspaceError(f"{relative!r} is a directory")
        if len(parts) > MAX_DEPTH:
            # The reason first and the path cut short: the model that sent a path this deep gets it back.
            raise WorkspaceError(
                f"a workspace path may be at most {MAX_DEPTH} levels deep, not {len(parts)}: {_shown(relative)}"
            )
        data = text.encode("utf-8")
        if len(data) > self.max_bytes:
            raise WorkspaceError(f"{len(data)} bytes is over the {self.max_bytes}-byte limit of write_file")
        used = self._usage()
        with self._directory(relative, parts[:-1], create=True, file_bytes=len(data)) as dir_fd:
            fd, created = self._open_for_write(relative, parts[-1], dir_fd, len(data))
            try:
                st = self._regular(relative, fd)
                if st.st_nlink > 1:
                    raise WorkspaceError(f"{relative!r} has other hard links; not written through")
                growth = len(data) - (0 if created else st.st_size)
                if not created:  # a new file's size was admitted before it was made
                    self._admit(relative, 0, growth)
                os.ftruncate(fd, 0)  # only now: truncating before the checks would empty whatever was opened
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                used.bytes += growth
            finally:
                os.close(fd)
        return "/".join(parts)

    def scan(self, relative: str = ".") -> Scan:
        """A bounded walk below ``relative``: its regular files and what was left unseen (see ``Scan``)."""
        parts = _components(relative)
        with self._directory(relative, parts, create=False) as fd:
            return _scan(fd, parts, MAX_ENTRIES)

    def list_files(self, relative: str) -> list[str]:
        """Regular files under ``relative`` (links are listed by neither name nor target), sorted.

        The walk stops at ``MAX_DEPTH`` and ``MAX_ENTRIES`` (``scan`` says what was cut)."""
        return [path for path, _ in self.scan(relative).files][:MAX_LISTED]


def _shown(relative: str, limit: int = 80) -> str:
    return repr(relative if len(relative) <= limit else relative[:limit] + "…")


def _join(parts: list[str]) -> str:
    return "/".join(parts)


def _scan(top_fd: int, top: list[str], limit: int) -> Scan:
    """Walk below the directory ``top_fd`` (the workspace's ``top``) without recursion, seeing at most ``limit``.

    An explicit stack holds one frame per level, the directory's handle and the subdirectories not yet entered (by
    name), so at most ``MAX_DEPTH`` handles are open however wide or deep the tree is. Each subdirectory is opened
    relative to its parent's handle with ``O_NOFOLLOW``: links are counted, never followed.
    """
    seen = Scan()
    frames: list[tuple[int, list[str], list[str]]] = []
    try:
        frames.append((os.dup(top_fd), top, []))  # a copy: the frames close their handles, the caller keeps its own
        frames[-1][2].extend(_scan_directory(frames[-1][0], top, seen, limit))
        while frames and not seen.too_many:
            fd, parts, pending = frames[-1]
            if not pending:
                os.close(frames.pop()[0])
                continue
            below = [*parts, pending.pop()]
            try:
                child = os.open(below[-1], _DIR_FLAGS, dir_fd=fd)
            except OSError:  # removed or replaced by a link meanwhile, or not ours to read
                seen.unreadable.append(_join(below))
                continue
            frames.append((child, below, []))  # on the stack before it is read, so the finally closes it
            frames[-1][2].extend(_scan_directory(child, below, seen, limit))
    finally:
        for fd, _, _ in frames:
            os.close(fd)
    seen.files.sort()
    return seen


def _scan_directory(fd: int, parts: list[str], seen: Scan, limit: int) -> list[str]:
    """Count and note the entries of one directory into ``seen``; the subdirectories to enter."""
    subdirs: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if seen.entries >= limit:
                    seen.too_many = True
                    break
                seen.entries += 1
                if entry.is_dir(follow_symlinks=False):
                    if len(parts) + 1 < MAX_DEPTH:  # what it holds is at most MAX_DEPTH deep
                        subdirs.append(entry.name)
                    elif _holds_anything(fd, entry.name):
                        seen.too_deep.append(_join([*parts, entry.name]))
                elif entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):  # removed meanwhile: not listed
                        seen.files.append((_join([*parts, entry.name]), entry.stat(follow_symlinks=False).st_size))
    except OSError:
        seen.unreadable.append(_join(parts) or ".")
    return subdirs


def _holds_anything(parent_fd: int, name: str) -> bool:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return True  # it cannot be looked into: say it was cut rather than claim it is empty
    try:
        with os.scandir(fd) as entries:
            return next(entries, None) is not None
    except OSError:
        return True
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove the directory ``path`` and everything below it, however deep, never following a link.

    ``shutil.rmtree`` recurses once per level and dies of RecursionError around a thousand levels, and holding a
    handle per level would run out of descriptors, so this holds one handle at a time: it goes down by name with
    ``O_NOFOLLOW`` and back up through ``..``, checking by device and inode that ``..`` is the directory it came
    from (a directory moved meanwhile cannot lead it out of the tree). Each level keeps the names of the
    subdirectories still to remove, so a wide directory is not re-read once per subdirectory. A missing ``path`` is
    nothing to do.
    """
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        # One frame per level: the directory's identity, its name in its parent, the subdirectories left in it.
        frames = [(_identity(fd), "", _unlink_files(fd))]
        while True:
            pending = frames[-1][2]
            if not pending:
                pending.extend(_unlink_files(fd))  # anything made meanwhile
            if pending:
                name = pending.pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    with contextlib.suppress(FileNotFoundError):  # replaced by a link or a file: that goes
                        os.unlink(name, dir_fd=fd)
                    continue
                os.close(fd)
                fd = child
                frames.append((_identity(fd), name, _unlink_files(fd)))
                continue
            if len(frames) == 1:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            if _identity(parent) != frames[-2][0]:
                os.close(parent)
                raise OSError(errno.ESTALE, f"a directory under {str(path)!r} was moved while it was being removed")
            os.close(fd)
            fd = parent
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(frames.pop()[1], dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _unlink_files(fd: int) -> list[str]:
    """Unlink everything in the directory ``fd`` but its subdirectories; their names."""
    with os.scandir(fd) as entries:
        listed = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    subdirs: list[str] = []
    for name, is_dir in listed:
        if is_dir:
            subdirs.append(name)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    return subdirs


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
