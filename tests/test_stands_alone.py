"""The repository stands on its own: no pointers to notes it does not hold, no bare tracker numbers.

A reader who has only the repository cannot open a private note or an issue tracker, so the code, the docs, the README
and the benchmarks state the fact itself, name its public source, or point to docs/ (docs/background.md holds the
longer facts). The patterns are assembled from pieces so this file never matches them itself.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "docs", "benchmarks", "README.md")
SKIPPED_DIRS = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}

_NOTES = ("dom" + "ain", "sty" + "le", "pl" + "an")
# The first two names are never a real file of the project's: any mention is a pointer to the notes. The third is also
# a file agents write in the example fleets ("Write a plan to <it>."), so it counts only where it reads as a pointer:
# a section sign after it, a possessive, or an opening parenthesis before it.
_PLAN = re.escape(_NOTES[2] + ".md")
NOTE_REFERENCE = re.compile(
    r"\b(?:" + "|".join(_NOTES[:2]) + r")\." + "md" + r"\b" + r"|" + _PLAN + r"(?:\s*\u00a7|'s\b)" + r"|\(\s*" + _PLAN
)
ISSUE_NUMBER = re.compile(r"\b" + "iss" + r"ues?\s+\d", re.IGNORECASE)


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            found.append(top)
        elif top.is_dir():
            found.extend(
                p for p in sorted(top.rglob("*")) if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)
            )
    return found


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None  # binary: no prose to check
    return data.decode("utf-8", errors="replace")


def offenders() -> list[str]:
    """``file:line: text`` for every line that points to a note outside the repository or to an issue number."""
    hits: list[str] = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if NOTE_REFERENCE.search(line) or ISSUE_NUMBER.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_the_patterns_catch_what_they_are_for() -> None:
    # Built here from the same pieces, so the scan below can be trusted to fail when it should.
    assert NOTE_REFERENCE.search("see " + _NOTES[0] + ".md §3")
    assert NOTE_REFERENCE.search("(" + _NOTES[1] + ".md §5)")
    assert NOTE_REFERENCE.search("(" + _NOTES[2] + ".md)")
    assert NOTE_REFERENCE.search(_NOTES[2] + ".md \u00a72 says")
    assert not NOTE_REFERENCE.search("Write a plan to " + _NOTES[2] + ".md.")
    assert not NOTE_REFERENCE.search('"from/plan/' + _NOTES[2] + '.md"')
    assert ISSUE_NUMBER.search("(" + "iss" + "ue 15, item 9)")
    assert ISSUE_NUMBER.search("Iss" + "ues 3 and 16")
    assert not ISSUE_NUMBER.search("an issue with 3 servers")
    assert not NOTE_REFERENCE.search("docs/background.md")


def test_the_scan_covers_the_sources_docs_readme_and_benchmarks() -> None:
    scanned = {p.relative_to(ROOT).parts[0] for p in _files()}
    assert scanned == set(SCANNED)


def test_no_reference_to_notes_or_issue_numbers() -> None:
    hits = offenders()
    assert not hits, "state the fact, its public source or a docs/ page instead of:\n" + "\n".join(hits)
