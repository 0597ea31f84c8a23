"""JSON Lines files past ``test_store``'s cases: a torn tail longer than the repair's read block, a file that is
only a torn line, blank lines, a missing file, a union of line kinds, and the line numbers errors point at."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field, TypeAdapter

from agentload.errors import CheckpointError
from agentload.store.jsonl import JsonlReader, JsonlWriter, cut_torn_tail


class Ping(BaseModel):
    kind: Literal["ping"] = "ping"
    n: int


class Note(BaseModel):
    kind: Literal["note"] = "note"
    text: str


Line = TypeAdapter(Annotated[Ping | Note, Field(discriminator="kind")])


def test_a_torn_tail_longer_than_the_read_block_is_cut_at_the_last_newline(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    whole = b'{"n": 1}\n{"n": 2}\n'
    torn = b'{"text": "' + b"x" * 200_000  # three 64 KiB blocks back before the newline
    path.write_bytes(whole + torn)
    assert cut_torn_tail(path) == len(torn)
    assert path.read_bytes() == whole
    assert cut_torn_tail(path) == 0  # nothing left to repair: a second call changes nothing
    assert path.read_bytes() == whole


def test_a_file_that_is_only_a_torn_line_is_emptied(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"n": 1')
    assert cut_torn_tail(path) == 7
    assert path.read_bytes() == b""
    assert cut_torn_tail(path) == 0  # empty
    assert cut_torn_tail(tmp_path / "absent.jsonl") == 0


def test_a_writer_continues_after_a_torn_line_without_gluing_to_it(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"n": 0}\n{"n":')
    with JsonlWriter[Ping](path) as w:
        w.write(Ping(n=1))
        w.write_line('{"n": 2}')
        assert w.written == 2
    assert path.read_text("utf-8").splitlines() == ['{"n": 0}', '{"kind":"ping","n":1}', '{"n": 2}']
    assert [p.n for p in JsonlReader(path, Ping)] == [0, 1, 2]


def test_closing_twice_and_releasing_are_harmless(tmp_path: Path) -> None:
    w = JsonlWriter[Ping](tmp_path / "p.jsonl")
    assert not w.closed
    w.release()
    assert w.closed
    w.close()
    w.flush()  # a closed writer has nothing to sync
    with pytest.raises(CheckpointError, match="is closed"):
        w.write_line("{}")


def test_blank_lines_are_skipped_and_line_numbers_stay_the_files(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    path.write_text('{"kind": "ping", "n": 1}\n\n   \n{"kind": "note", "text": "hi"}\n{"kind": "pong"}\n')
    reader = JsonlReader(path, Line, what="log line")
    items = reader.numbered()
    assert next(items) == (1, Ping(n=1))
    assert next(items) == (4, Note(text="hi"))
    with pytest.raises(CheckpointError, match=r"l\.jsonl:5: not a log line \("):
        next(items)


def test_a_reader_of_a_missing_file_yields_nothing(tmp_path: Path) -> None:
    reader = JsonlReader(tmp_path / "never-written.jsonl", Ping)
    assert list(reader) == []
    assert reader.torn_bytes == 0


def test_torn_bytes_is_reset_by_each_pass(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2')
    reader = JsonlReader(path, Ping)
    assert [p.n for p in reader] == [1]
    assert reader.torn_bytes == 7
    cut_torn_tail(path)
    assert [p.n for p in reader] == [1]
    assert reader.torn_bytes == 0


def test_the_schema_name_is_used_when_none_is_given(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"n": "many"}\n')
    with pytest.raises(CheckpointError, match=r"p\.jsonl:1: not a Ping \(n: "):
        list(JsonlReader(path, Ping))


def test_a_writer_on_a_folder_that_does_not_exist_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"cannot open .* for appending"):
        JsonlWriter[Ping](tmp_path / "no" / "such" / "p.jsonl")


def test_a_reader_on_a_directory_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read"):
        list(JsonlReader(tmp_path, Ping))
