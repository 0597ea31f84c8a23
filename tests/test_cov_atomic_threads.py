"""The atomic writer with two writers of one file at once in one process (the suite and the fleet write from
worker threads): each replacement is whole, none fails, and no temporary file is left. With a temporary name per
process only, the two threads shared one temporary file and about one write in three failed."""

from __future__ import annotations

import threading
from pathlib import Path

from agentload.store.atomic import atomic_file, write_atomic

WRITES = 200


def test_two_threads_replacing_one_file_never_collide(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(fill: str) -> None:
        start.wait()
        for _ in range(WRITES):
            try:
                write_atomic(target, fill * 5000)
            except BaseException as exc:  # collected, so the test reports them rather than a thread dying
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(c,)) for c in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    text = target.read_text(encoding="utf-8")
    assert text in ("a" * 5000, "b" * 5000)  # one writer's whole file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_the_temporary_file_is_hidden_beside_the_target_until_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    with atomic_file(target) as f:
        f.write("{}")
        (hidden,) = list(tmp_path.iterdir())
        assert hidden.name.startswith(".result.json.")
        assert hidden.name.endswith(".tmp")
        assert not target.exists()  # a reader sees no half-written result
    assert target.read_text(encoding="utf-8") == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_newlines_are_written_as_asked(tmp_path: Path) -> None:
    target = tmp_path / "export.csv"
    with atomic_file(target, newline="") as f:
        f.write("a,b\r\n1,2\r\n")  # the csv module's line ends, kept as written
    assert target.read_bytes() == b"a,b\r\n1,2\r\n"
