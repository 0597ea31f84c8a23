"""The file tools cannot be led out of the agent's workspace: hostile paths, links, races, FIFOs, sizes.

Every call goes through the tool registry, as the agent loop makes it, so a refusal is checked as what the model
would see: a ``ToolResult`` with ``error`` set, never an exception.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.agent.tools import ToolRegistry, ToolResult, workspace_tools
from agentload.agent.workspace import MAX_FILE_BYTES
from tests.fuzzing import fuzz_examples

RACING_WRITES = 3000


def _registry(root: Path) -> ToolRegistry:
    return ToolRegistry.of(workspace_tools(root))


def _call(reg: ToolRegistry, name: str, **args: str) -> ToolResult:
    import json

    return asyncio.run(reg.call(name, json.dumps(args)))


def _all_files(top: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(top) for f in files]


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, Path, ToolRegistry]:
    """(workspace, a directory outside it holding one secret file, the registry)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    root = tmp_path / "ws"
    return root, outside, _registry(root)


def test_normal_paths_behave_as_before(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, _, reg = sandbox
    wrote = _call(reg, "write_file", path="src/pkg/mod.py", content="x = 1\n")
    assert not wrote.error
    assert wrote.text == "wrote 6 characters to src/pkg/mod.py"
    assert (root / "src" / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert _call(reg, "read_file", path="src/pkg/mod.py").text == "x = 1\n"
    # A shorter second write replaces the file rather than leaving the old tail.
    _call(reg, "write_file", path="src/pkg/mod.py", content="y")
    assert _call(reg, "read_file", path="./src/x/../pkg/mod.py").text == "y"
    _call(reg, "write_file", path="notes.txt", content="n")
    assert _call(reg, "list_files", path=".").text == "notes.txt\nsrc/pkg/mod.py"
    assert _call(reg, "list_files", path="src").text == "src/pkg/mod.py"
    assert _call(reg, "read_file", path="missing.txt").error


@pytest.mark.parametrize(
    "path", ["../outside/secret.txt", "/etc/passwd", "a/../../outside/secret.txt", "..", "x\x00y", ""]
)
def test_hostile_paths_are_refused(sandbox: tuple[Path, Path, ToolRegistry], path: str) -> None:
    _, outside, reg = sandbox
    for result in (_call(reg, "read_file", path=path), _call(reg, "write_file", path=path, content="pwned")):
        assert result.error
        assert "secret" not in result.text or "secret.txt" in path  # the message may name the path, not the file
    assert (outside / "secret.txt").read_text() == "secret"
    assert _all_files(outside) == [outside / "secret.txt"]


def test_links_are_never_followed(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, outside, reg = sandbox
    (root / "to-file").symlink_to(outside / "secret.txt")
    (root / "to-dir").symlink_to(outside)
    (root / "inner").mkdir()
    (root / "inner" / "to-dir").symlink_to(outside)
    os.link(outside / "secret.txt", root / "hard")
    for path in ("to-file", "to-dir/secret.txt", "inner/to-dir/secret.txt", "to-dir/new.txt"):
        assert _call(reg, "read_file", path=path).error, path
        assert _call(reg, "write_file", path=path, content="pwned").error, path
    assert _call(reg, "write_file", path="hard", content="pwned").error  # a hard link to a file outside
    assert _call(reg, "list_files", path="to-dir").error
    assert _call(reg, "list_files", path=".").text == "hard"  # links are not listed; the hard link is a file
    assert (outside / "secret.txt").read_text() == "secret"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_a_replaced_workspace_root_is_refused(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, outside, reg = sandbox
    root.rename(root.with_name("ws-old"))
    root.symlink_to(outside)
    assert _call(reg, "write_file", path="new.txt", content="pwned").error
    root.unlink()
    root.mkdir()  # a different directory at the same path is not the workspace either
    assert _call(reg, "write_file", path="new.txt", content="pwned").error
    assert sorted(os.listdir(outside)) == ["secret.txt"]


# Run in its own process: a thread would share the GIL with the writer and almost never land between a check and
# an open, so it could not catch a check-then-open sandbox; a process on the other core does (the old one let
# files out). It swaps ``sub`` between a real directory and a symlink to the outside until the stop file appears.
_SWAPPER = """
import contextlib, os, sys
root, outside, stop = sys.argv[1:]
sub, held = os.path.join(root, "sub"), os.path.join(root, "held")
os.mkdir(held)
swaps = 0
while not os.path.exists(stop):
    # Whatever is at sub (the writer may have made a directory there meanwhile) moves to a fresh name, so no
    # step can fail for good and the swapping never stalls.
    with contextlib.suppress(OSError):
        os.rename(sub, os.path.join(held, f"d{swaps}"))
    with contextlib.suppress(OSError):
        os.symlink(outside, sub, target_is_directory=True)
    swaps += 1
    if swaps == 1:
        print("swapping", flush=True)
    with contextlib.suppress(OSError):
        os.rename(sub, os.path.join(held, f"l{swaps}"))
    with contextlib.suppress(OSError):
        os.mkdir(sub)
print(swaps, flush=True)
"""


def test_racing_symlink_swaps_write_nothing_outside(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, outside, reg = sandbox
    (root / "sub" / "deeper").mkdir(parents=True)
    stop = root.parent / "stop"
    swapper = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(root), str(outside), str(stop)], stdout=subprocess.PIPE, text=True
    )
    results: list[ToolResult] = []

    async def write_all() -> None:
        for i in range(RACING_WRITES):
            path = f"sub/f{i}.txt" if i % 2 else f"sub/deeper/f{i}.txt"
            results.append(await reg.call("write_file", f'{{"path": "{path}", "content": "w{i}"}}'))

    try:
        assert swapper.stdout is not None
        assert swapper.stdout.readline() == "swapping\n"
        asyncio.run(write_all())
    finally:
        stop.touch()
        out, _ = swapper.communicate(timeout=60)
    swaps = int(out.split()[-1])
    escaped = [p for p in _all_files(outside) if p.name != "secret.txt"]
    written = sum(1 for r in results if not r.error)
    print(f"racing writes: {len(results)} attempted, {written} written, {len(escaped)} outside, {swaps} swaps")
    assert len(results) == RACING_WRITES
    assert escaped == []
    # Every write reported as done is a file inside the workspace (os.walk does not follow the links).
    assert len([p for p in _all_files(root) if p.name.startswith("f")]) == written


def test_a_fifo_is_refused_without_blocking(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, _, reg = sandbox
    root.mkdir(exist_ok=True)
    fifo = root / "pipe"
    os.mkfifo(fifo)
    pool = concurrent.futures.ThreadPoolExecutor(2)
    # A plain open() of a FIFO with no peer blocks forever; a generous deadline turns that into a failure.
    futures = [
        pool.submit(_call, reg, "read_file", path="pipe"),
        pool.submit(_call, reg, "write_file", path="pipe", content="x"),
    ]
    try:
        done, _ = concurrent.futures.wait(futures, timeout=60)
    finally:
        # Release blocked opens (if the refusal regressed) so the threads can end.
        while not all(f.done() for f in futures):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
        pool.shutdown()
    assert len(done) == len(futures), "opening the FIFO blocked"
    results = [f.result() for f in futures]
    assert all(r.error and "not a regular file" in r.text for r in results)


def test_a_socket_is_refused(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, _, reg = sandbox
    root.mkdir(exist_ok=True)
    cwd = Path.cwd()
    os.chdir(root)  # a unix socket path must stay under ~108 bytes; bind it by its short relative name
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind("sock")
            assert _call(reg, "read_file", path="sock").error
            assert _call(reg, "write_file", path="sock", content="x").error
    finally:
        os.chdir(cwd)


def test_sizes_are_capped(sandbox: tuple[Path, Path, ToolRegistry]) -> None:
    root, _, reg = sandbox
    assert not _call(reg, "write_file", path="max.txt", content="a" * MAX_FILE_BYTES).error
    over = _call(reg, "write_file", path="over.txt", content="a" * (MAX_FILE_BYTES + 1))
    assert over.error
    assert "limit" in over.text
    assert not (root / "over.txt").exists()
    # The cap is on bytes: a multi-byte character counts for its UTF-8 length.
    assert _call(reg, "write_file", path="wide.txt", content="é" * (MAX_FILE_BYTES // 2 + 1)).error
    assert len(_call(reg, "read_file", path="max.txt").text) == MAX_FILE_BYTES
    (root / "big.txt").write_bytes(b"b" * (MAX_FILE_BYTES + 1))  # made by something other than the tool
    assert _call(reg, "read_file", path="big.txt").error


_PARTS = ["a", "b", "..", ".", "", "to-dir", "to-file", "pipe", "sub", "new.txt", "é", "x\x00", "/"]


@settings(max_examples=fuzz_examples(300))
@given(
    op=st.sampled_from(["read_file", "write_file", "list_files"]),
    absolute=st.booleans(),
    parts=st.lists(st.sampled_from(_PARTS), max_size=8),
)
def test_fuzz_no_path_leaves_the_workspace(op: str, absolute: bool, parts: list[str]) -> None:
    """Any path over links, FIFOs, ``..`` and odd names: a result, never a file touched outside, never a hang."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outside = base / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text("secret")
        root = base / "ws"
        reg = _registry(root)
        (root / "sub").mkdir()
        (root / "to-dir").symlink_to(outside)
        (root / "sub" / "to-dir").symlink_to(outside)
        (root / "to-file").symlink_to(outside / "secret.txt")
        os.mkfifo(root / "pipe")
        path = ("/" if absolute else "") + "/".join(parts)
        result = _call(reg, op, path=path, content="pwned")
        assert isinstance(result.text, str)
        assert sorted(os.listdir(outside)) == ["secret.txt"]
        assert (outside / "secret.txt").read_text() == "secret"
        if op == "write_file" and not result.error:
            written = result.text.rsplit(" to ", 1)[1]
            assert (root / written).read_text() == "pwned"
            assert not (root / written).is_symlink()
