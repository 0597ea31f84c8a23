"""``agentload.inputs``, the one door every user file comes through: the size limit to the byte, the first bad
byte named, and JSON/TOML problems as one ``ConfigError`` naming the file, never a Python exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.errors import ConfigError
from agentload.inputs import parse_json, parse_toml, read_text


def test_a_file_exactly_at_the_limit_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.toml"
    path.write_bytes(b"a" * 2**20)
    assert len(read_text(path, "fleet file", max_bytes=2**20)) == 2**20
    path.write_bytes(b"a" * (2**20 + 1))
    with pytest.raises(ConfigError, match=r"^fleet file .*f\.toml is larger than 1 MiB, the most agentload reads$"):
        read_text(path, "fleet file", max_bytes=2**20)


def test_the_first_byte_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes('name = "é"\n'.encode() + b"\xff rest")
    with pytest.raises(ConfigError, match=r"profile .*p\.toml is not UTF-8 text \(byte 12: invalid start byte\)"):
        read_text(path, "profile")


def test_a_missing_file_or_a_folder_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cannot read trace .*absent\.jsonl: No such file or directory$"):
        read_text(tmp_path / "absent.jsonl", "trace")
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_text(tmp_path, "trace")


def test_utf8_text_comes_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('prompt = "héllo — 世界"\n', encoding="utf-8")
    assert read_text(path, "fleet file") == 'prompt = "héllo — 世界"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": NaN}', "NaN is not a number agentload accepts"),
        ('{"a": Infinity}', "Infinity is not a number agentload accepts"),
        ("[-Infinity]", "-Infinity is not a number agentload accepts"),
        ('{"a": 1e400}', "1e400 is too large for a number"),
        ('{"a": 1,}', r"not valid JSON \(Expecting property name enclosed in double quotes, line 1 column 9\)"),
        ('{\n  "a": 1\n  "b": 2}', r"line 3 column 3"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
        ("9" * 5000, "Exceeds the limit"),  # Python's int-digit limit: a ValueError, still one ConfigError
    ],
)
def test_json_problems_are_one_error_naming_the_source(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_json(text, "m/config.json")
    assert str(info.value).startswith("m/config.json: ")


def test_finite_json_numbers_pass() -> None:
    assert parse_json('{"a": 1.5e300, "b": -2, "c": [0.0]}', "x") == {"a": 1.5e300, "b": -2, "c": [0.0]}


def test_toml_problems_are_one_error_naming_the_source() -> None:
    with pytest.raises(ConfigError, match=r"^fleet\.toml: not valid TOML: "):
        parse_toml("a = [unclosed", "fleet.toml")
    with pytest.raises(ConfigError, match=r"^fleet\.toml: nested too deeply to read$"):
        parse_toml("a = " + "[" * 50_000 + "]" * 50_000, "fleet.toml")
    assert parse_toml('a = 1\n[b]\nc = "d"\n', "x") == {"a": 1, "b": {"c": "d"}}
