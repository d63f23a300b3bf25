"""What the commands print for people: counts in words, tables that fit 80 columns, and the note
that squares a run's accepted drafts with its MAT.

A pipe, or a terminal whose width rich cannot read, gets 80 columns; a `figures_table` keeps every
header and figure whole there: two spaces between columns, no outer edge, figures never
wrapped, and the first column (names: a drafter, a method, a model path) folded when a name is too
long for what is left. A table's title wraps within the table (`table_title`): one naming a model's
folder or the CPU holds the width on any host, however long the temporary folder or the CPU's name.
"""

from __future__ import annotations

from collections.abc import Sequence


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """The count and its noun, singular for exactly one; `nouns` for an irregular plural (default: noun + "s")."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def past_the_end(stats) -> str:
    """For a run's GenerationStats: why accepted can run ahead of MAT: each pass commits its accepted drafts and one token of the
    target's, unless the text ended (end of sequence, a stop string) partway through the last round's
    tokens; those after the end are not kept. "" when none were dropped."""
    dropped = stats.target_passes + stats.accepted - stats.new_tokens
    if dropped <= 0:
        return ""
    return (f"not kept: {plural(dropped, 'token')} of the last round, after the end of the text (MAT counts the "
            "kept tokens; accepted, every draft the target accepted)")


def table_title(text: str):
    """A table's title that wraps within the table's width, at spaces where it can and folding a word
    longer than the width (a path, a CPU's name), also on the commands' soft-wrapping consoles (where
    a line of prose stays whole, e.g. a path to copy, and a plain title would run past the table)."""
    from rich.text import Text

    return Text(text, style="table.title", justify="default", no_wrap=False, overflow="fold")  # flush left, unpadded, as before


def figures_table(title: str, names: str, figures: Sequence[str]):
    """A rich Table: a left-aligned column of names headed `names`, then right-aligned columns of figures."""
    from rich import box
    from rich.table import Table

    out = Table(title=table_title(title), box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    out.add_column(names, overflow="fold")
    for heading in figures:
        out.add_column(heading, justify="right", no_wrap=True)
    return out
