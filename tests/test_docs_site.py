"""The docs site's navigation (mkdocs.yml): each page listed once (``mkdocs build --strict`` in
CI says a missing one)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _pages(nav: list[object]) -> list[str]:
    """Every page the nav lists, in order, sections walked."""
    pages: list[str] = []
    for entry in nav:
        items = entry.values() if isinstance(entry, dict) else [entry]
        for item in items:
            pages += _pages(item) if isinstance(item, list) else [str(item)]
    return pages


def test_the_nav_lists_each_page_once() -> None:
    """Issue 62: compile.md was in the nav twice, under two titles (a reader met one page as
    two). Each page once."""
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = _pages(site["nav"])
    twice = [page for page, n in Counter(pages).items() if n > 1]
    assert not twice, f"listed more than once in mkdocs.yml's nav: {twice}"
    assert "compile.md" in pages and len(pages) > 10


def test_the_knobs_page_says_how_compiles_are_dynamic() -> None:
    """Issue 62: docs/knobs.md still said compiles are ``dynamic=False``; they follow
    ``autotune.json``'s ``compile_dynamic`` (None: torch's automatic dynamic shapes), and only
    ``buckets`` pins it off (``knob_adapters.shapes_dynamic``)."""
    from autotune.knob_adapters import shapes_dynamic
    from autotune.knobs import Knobs
    from autotune.schema import TunedConfig

    row = next(line for line in (ROOT / "docs" / "knobs.md").read_text().splitlines()
               if line.startswith("| compile mode"))
    default = TunedConfig.__dataclass_fields__["compile_dynamic"].default
    assert default is None and shapes_dynamic(Knobs(compile_mode="default")) is None
    assert shapes_dynamic(Knobs(compile_mode="default", shapes="buckets")) is False
    said, _, buckets = row.partition("`buckets`")
    assert "dynamic=compile_dynamic" in said and "`null` by default" in said, row
    assert "dynamic=False" not in said and "dynamic=False" in buckets, row
