"""Text that fits a terminal's width: lines wrapped between words, knob labels wrapped between
their parts (or long values abbreviated by a legend), never broken inside a word.

The search's every line fits the console it prints to (80 columns where ``COLUMNS=80``):
``wrap`` folds a long line at its spaces (a hanging indent marks the continuation), ``Pieces``
is a table cell that wraps at its own break points (a knob label after ``/``, before ``+``
and after ``=``), ``abbreviate`` shortens the long knob values a narrow table cannot hold.
No torch import here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

INDENT = "  "
"""The continuation of a wrapped line starts here."""


_WORD = re.compile(r"\S+(?: (?:s|B|KiB|MiB|GiB|samples/s|tokens/s|cores)(?=[\s,.;:)]|$)\S*)?\s*")
"""A word with its spaces after it; a figure keeps its unit (``900.00 MiB``, ``3.2 s``)."""


def wrap(line: str, width: int) -> list[str]:
    """``line`` folded at its spaces to ``width`` columns, the continuation indented; a
    figure stays with its unit, a word longer than a line (a path) whole on its own line."""
    if cell_len(line) <= width:
        return [line]
    lines = [""]
    for word in _WORD.findall(line):
        if lines[-1].strip() and cell_len(lines[-1] + word.rstrip()) > width:
            # the continuation indented, unless that alone would take it past the width
            lines.append(INDENT if cell_len(INDENT + word.rstrip()) <= width else "")
        lines[-1] += word
    return [part.rstrip() for part in lines]


def cut(line: str, width: int) -> str:
    """``line`` cut to ``width`` columns at its last space, ``…`` saying it goes on."""
    if len(line) <= width:
        return line
    head = line[:width - 1]
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head).rstrip(" ,;:") + "…"


_BREAKS = re.compile(r"(?<=/)|(?=\+)|(?<==)")
"""Where a knob label may wrap: after ``/``, before ``+``, after ``=``."""


def label_pieces(label: str) -> list[str]:
    """A knob label's parts it may wrap between: ``bf16/``, ``default``, ``+ckpt=``,
    ``blocks``."""
    return [p for p in _BREAKS.split(label) if p]


class Pieces:
    """A table cell that wraps between its pieces, never inside one (a piece wider than the
    cell folds: only where the table cannot give it its widest piece)."""

    def __init__(self, pieces: Iterable[str], style: str = "") -> None:
        self.pieces = list(pieces)
        self.style = style

    def __str__(self) -> str:
        return "".join(self.pieces)

    @property
    def widest(self) -> int:
        """The columns of its widest piece: the narrowest it prints whole."""
        return max((cell_len(p.strip()) for p in self.pieces), default=0)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(self.widest, cell_len(str(self)))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("\n".join(self.lines(options.max_width)), style=self.style, overflow="fold")

    def lines(self, width: int) -> Iterator[str]:
        """The pieces laid out on lines of ``width`` columns."""
        line = ""
        for piece in self.pieces:
            if line and cell_len(line + piece.rstrip()) > width:
                yield line.rstrip()
                piece = piece.lstrip()
                line = ""
            line += piece
        if line:
            yield line.rstrip()


LONG_VALUE = 12
"""A knob value longer than this is abbreviated in a narrow table (``abbreviate``)."""


def abbreviate(labels: Iterable[str]) -> dict[str, str]:
    """Short names for the long knob values in ``labels`` (``max-autotune-no-cudagraphs``:
    ``manc``, the initials of its words), one per value, none taken twice: the legend a
    narrow table prints under itself."""
    legend: dict[str, str] = {}
    for label in labels:
        for piece in label_pieces(label):
            value = piece.strip("/+=")
            if len(value) <= LONG_VALUE or value in legend or "=" in piece:
                continue
            short = "".join(w[0] for w in re.split(r"[-_.]", value) if w)
            while short in legend.values() or short == value:
                short += "'"
            legend[value] = short
    return legend


def shorten(label: str, legend: Mapping[str, str]) -> list[str]:
    """``label``'s pieces with the legend's values replaced by their short names."""
    return [legend.get(p, p) if p not in ("/", "+") else p for p in label_pieces(label)]


def legend_line(legend: Mapping[str, str], width: int) -> str:
    """``manc = max-autotune-no-cudagraphs, es = expandable_segments``, wrapped between its
    entries to ``width`` (a console that does not wrap, ``soft_wrap``, prints it so)."""
    entries = [f"{short} = {value}" for value, short in legend.items()]
    lines = [""]
    for i, entry in enumerate(entries):
        entry += "," if i < len(entries) - 1 else ""
        if lines[-1] and cell_len(f"{lines[-1]} {entry}") > width:
            lines.append("")
        lines[-1] = f"{lines[-1]} {entry}".lstrip()
    return "\n".join(lines)


def column_widths(columns: list[list[str | Pieces]], wraps: list[bool], width: int,
                  widest: int) -> list[int | None]:
    """Widths for a table's columns (header first in each) that fit ``width`` with rich's
    box (``3n + 1`` columns of borders and padding), or all None where they fit as they are.

    Rich narrows only the columns that wrap, the widest first, and evenly once those are
    alike (below a cell's widest word then: a part broken mid-word); here each wrapping
    column but the ``widest``'s index takes its narrowest (its longest word or piece), and
    that column the rest."""
    def natural(cell: str | Pieces) -> int:
        return cell_len(str(cell))

    def narrowest(cell: str | Pieces) -> int:
        return cell.widest if isinstance(cell, Pieces) else max(
            (cell_len(w) for w in str(cell).split()), default=0)

    room = width - 3 * len(columns) - 1
    if sum(max(map(natural, c)) for c in columns) <= room:
        return [None] * len(columns)
    sizes: list[int | None] = [max(map(narrowest if wrap else natural, c))
                               for c, wrap in zip(columns, wraps, strict=True)]
    rest = room - sum(s or 0 for i, s in enumerate(sizes) if i != widest)
    sizes[widest] = max(rest, sizes[widest] or 0)
    return sizes
