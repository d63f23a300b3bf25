"""Every figure in README.md and docs/*.md has a source under docs/bench/ (issue 55).

A figure is a number with a unit: ×, %, s, ms, µs, MB, GB, MiB, GiB, tokens/s. It is backed where the
paragraph or table that holds it, or the block just before or after (a table's caption, its source
line), names a file or folder under docs/bench/ whose text holds the number (commas dropped; a folder:
any text file in it). A figure that is not a measurement (a default, a limit, a test's false-positive
rate) is listed in docs/bench/FIGURES.md, each with what it is; a measurement never is (the kinds
have no place for one). The test fails on a figure neither backed nor listed, and on a listed one no
longer in the docs. Nothing is run: the docs and docs/bench are read as text.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LEDGER = ROOT / "docs" / "bench" / "FIGURES.md"
FIGURE = re.compile(r"(?<![\w.,])(\d+(?:,\d{3})*(?:\.\d+)?)\s?(×|%|s\b|ms\b|µs\b|MB\b|GB\b|MiB\b|GiB\b|tokens/s\b|tok/s\b)")
CITATION = re.compile(r"(?:docs/)?bench/[\w./-]*[\w/]")
TEXT_SUFFIXES = (".md", ".txt", ".json", ".jsonl", ".csv")


@functools.cache
def numbers_in(cited: str) -> frozenset[str]:
    """Every number written in the docs/bench file or folder `cited` (relative to docs/), commas dropped."""
    path = ROOT / "docs" / cited
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    found: set[str] = set()
    for file in files:
        if file.suffix in TEXT_SUFFIXES:
            found |= set(re.findall(r"\d+(?:\.\d+)?", file.read_text(encoding="utf-8", errors="replace").replace(",", "")))
    return frozenset(found)


def blocks(text: str) -> list[tuple[int, str]]:
    """The text's blocks (paragraphs, tables, code), split at blank lines: (first line number, text)."""
    found, lines, start = [], [], 1
    for number, line in enumerate(text.splitlines() + [""], 1):
        if line.strip():
            if not lines:
                start = number
            lines.append(line)
        elif lines:
            found.append((start, "\n".join(lines)))
            lines = []
    return found


def figures(path: Path) -> list[tuple[str, int, str, bool]]:
    """(file name, the block's first line, the figure as written, whether a nearby citation backs it)."""
    found = []
    parts = blocks(path.read_text(encoding="utf-8"))
    for index, (line, text) in enumerate(parts):
        near = "\n".join(block for _, block in parts[max(0, index - 1):index + 2])
        cited = [c.removeprefix("docs/") for c in CITATION.findall(near)]
        for match in FIGURE.finditer(text):
            number = match.group(1).replace(",", "")
            found.append((path.name, line, match.group(0), any(number in numbers_in(c) for c in cited)))
    return found


KINDS = ("setting", "test", "formula", "not a figure")  # no measurement is listed: a measured figure needs its run


def ledger_rows() -> list[list[str]]:
    """FIGURES.md's table rows: [doc, figure, kind, source]."""
    rows = []
    for row in LEDGER.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if row.startswith("|") and len(cells) == 4 and cells[0].endswith(".md"):
            rows.append(cells)
    return rows


def ledger() -> set[tuple[str, str]]:
    """The listed figures: (file name, the figure as written)."""
    return {(doc, figure) for doc, figure, _, _ in ledger_rows()}


def unbacked(paths: list[Path], listed: set[tuple[str, str]]) -> list[str]:
    return [f"{name}:{line} {figure}" for path in paths for name, line, figure, backed in figures(path)
            if not backed and (name, figure) not in listed]


def test_every_figure_in_the_docs_is_backed_by_a_bench_file_or_listed():
    listed = ledger()
    missing = unbacked(DOCS, listed)
    assert not missing, ("figures with no docs/bench source nearby and not in docs/bench/FIGURES.md:\n"
                         + "\n".join(missing))
    present = {(name, figure) for path in DOCS for name, _, figure, _ in figures(path)}
    stale = sorted(listed - present)
    assert not stale, f"docs/bench/FIGURES.md lists figures the docs no longer hold: {stale}"


def test_each_listed_figure_says_what_it_is_and_where():
    """A setting names a file and the name in it that sets it; a test names a test file that exists."""
    wrong = []
    for doc, figure, kind, source in ledger_rows():
        if kind not in KINDS:
            wrong.append(f"{doc} {figure}: kind {kind!r} is none of {KINDS}")
        elif kind in ("setting", "test"):
            path, _, name = source.partition(" ")
            file = ROOT / path.strip("`")
            if not file.is_file() or (kind == "setting" and name not in file.read_text(encoding="utf-8")):
                wrong.append(f"{doc} {figure}: {source} does not hold it")
    assert not wrong, "\n".join(wrong)


def test_a_planted_figure_without_a_source_fails(tmp_path):
    """Control: a figure beside a citation whose files do not hold it, and one with no citation, are
    both caught; the same figure is backed once the cited file holds it."""
    page = tmp_path / "PAGE.md"
    page.write_text("Speed-up 9.87× ([run](bench/twin-sizes/README.md)).\n\nAnother 6.54× with no source.\n")
    assert unbacked([page], set()) == ["PAGE.md:1 9.87×", "PAGE.md:3 6.54×"]
    assert unbacked([page], {("PAGE.md", "9.87×"), ("PAGE.md", "6.54×")}) == []
    page.write_text("Plain decoding: 2.47 tokens/s ([run](bench/twin-sizes/README.md)).\n")
    assert unbacked([page], set()) == []
