"""The skipped candidates for the terminal: one short line per rule, the runs made again
apart (``skipped_lines``). No torch import here."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.report_width import cut
from autotune.schema import SkipRecord

MAX_SKIPPED_LINES = 4
"""Lines the footer gives the skipped candidates, one per kind (the rest in the page)."""
LINE_WIDTH = 80
"""A skipped line's most columns: cut between words past it (``report_width.cut``)."""
_SETTING = re.compile(r"^[\w.-]+/[\w.+=/-]*(?: \d+(?:x\d+)?)?:? ")
_NUMBERS = re.compile(r"\b\d[\d,.]*(?:x\d+)?%?(?:,? (?=\d))?")
_RUNS_MADE = re.compile(r"^re-check of |screened again on |re-measured: |interleaved rounds")


_MADE_RULES = frozenset(("recheck", "rescreen", "within-drift", "rounds", "noise",
                         "re-measure-first", "joint"))
"""Rules whose note says a run was made (a re-check, a re-measure), not one skipped."""


def runs_made(skip: SkipRecord) -> bool:
    """Whether a skip note says a run was made: by its rule, or, for a note of a file that
    recorded no rules (schema 2), by its words."""
    return skip.rule in _MADE_RULES or (skip.rule == "note"
                                        and bool(_RUNS_MADE.search(skip.text)))


def skipped_lines(skips: tuple[SkipRecord, ...], page: Path | None = None) -> list[str]:
    """``TunedConfig.skips`` for the terminal: one short line per rule (``docs/search.md``;
    a note by its words before the first ``:``, the setting and the numbers left out), with a
    count and the first example; the runs that were made (re-checks, re-measures) under their
    own heading, the calibration's notes under theirs; then where the full sentences are. At
    most ``MAX_SKIPPED_LINES`` + 3 lines of ``LINE_WIDTH``. Each sentence is
    ``SkipRecord.sentence`` (``skip_sentences.render``)."""
    made = [s.sentence() for s in skips if runs_made(s)]
    calibration = [s.sentence() for s in skips if s.rule == "calibration"]
    groups: dict[str, list[str]] = {}  # a note of a file without rules: by its words
    for skip in skips:
        if not runs_made(skip) and skip.rule != "calibration":
            kind = skip.rule if skip.rule != "note" else _kind(skip.text)
            groups.setdefault(kind, []).append(skip.sentence())
    kinds = list(groups.items())
    if len(kinds) > MAX_SKIPPED_LINES:
        rest = kinds[MAX_SKIPPED_LINES - 1:]
        kinds = kinds[:MAX_SKIPPED_LINES - 1]
        lines = [_grouped("skipped", kind, found) for kind, found in kinds]
        lines.append(f"skipped: {sum(len(f) for _, f in rest)} more, of {len(rest)} other "
                     "kinds")
    else:
        lines = [_grouped("skipped", kind, found) for kind, found in kinds]
    if made:
        lines.append(_grouped("measured again", "runs", made))
    if calibration:  # what `check` will lack: said apart, never folded into "more"
        lines.append(_grouped("calibration", "", calibration))
    if lines:
        where = f"{page} and autotune.json" if page is not None else "autotune.json"
        lines.append(f"the full reasons: {where} (skipped)")
    return lines


def _kind(line: str) -> str:
    """A skipped sentence's kind: its words before the first ``:``, without the setting it
    names or the numbers in it (``not tried``, ``micro-batches not timed``)."""
    head = _SETTING.sub("", line, count=1).partition(":")[0]
    return " ".join((_NUMBERS.sub("", head) or line.partition(":")[0]).split())


def _grouped(heading: str, kind: str, found: list[str]) -> str:
    """``skipped (3 not tried): <the first>``, on one line cut between words to
    ``LINE_WIDTH``."""
    kind = kind if len(kind) <= 40 else kind[:39] + "…"
    count = f" ({len(found)}{' ' + kind if kind else ''})" if len(found) > 1 else ""
    return cut(f"{heading}{count}: {' '.join(found[0].split())}", LINE_WIDTH)
