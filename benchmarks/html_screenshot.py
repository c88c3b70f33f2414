"""Open ``autotune.html`` in headless Chromium: read what the page drew, or take a screenshot.

    python benchmarks/html_screenshot.py autotune.json benchmarks/results/autotune_html.png [HEIGHT]

renders the page from an ``autotune.json`` (as ``autotune report`` does) and screenshots it;
the README's picture is made so. The browser test (tests/test_report_html.py) uses
``browser`` and ``page_state`` from here: the page records, in ``data-`` attributes, each
plot's drawn size and every script error, and Chromium's ``--dump-dom`` hands the DOM back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=10000")
"""Headless, as root in a container, no GPU; 10 s of virtual time for the plots to draw (the
page's own check, 3 s after load, reports a plot that did not)."""


def browser() -> str | None:
    """The first Chromium-like browser on PATH, or None."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@dataclass
class PageState:
    """What the page recorded once it ran: its plots and its errors."""

    plots: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per ``data-plot`` name, its ``data-`` attributes (``data-svg-width``, ...)."""
    error_count: int | None = None
    """``data-error-count`` of the page's error box (None: no box found)."""
    errors: list[str] = field(default_factory=list)
    """The error box's lines."""


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.state = PageState()
        self._in_errors = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if "data-plot" in values:
            self.state.plots[values["data-plot"]] = values
        if values.get("id") == "autotune-errors":
            self.state.error_count = int(values.get("data-error-count", "0"))
            self._in_errors = 1
        elif self._in_errors:
            self._in_errors += 1

    def handle_endtag(self, tag: str) -> None:
        if self._in_errors:
            self._in_errors -= 1

    def handle_data(self, data: str) -> None:
        if self._in_errors and data.strip():
            self.state.errors.append(data.strip())


def page_state(html_path: Path, *, timeout_s: float = 120.0) -> PageState:
    """Open the page headless and read back what it recorded (Chromium's ``--dump-dom``).

    Raises:
        FileNotFoundError: no browser on PATH.
        subprocess.CalledProcessError, subprocess.TimeoutExpired: the browser failed.
    """
    dom = _run([*FLAGS, "--dump-dom", Path(html_path).resolve().as_uri()], timeout_s)
    reader = _Reader()
    reader.feed(dom)
    return reader.state


def screenshot(html_path: Path, png: Path, *, width: int = 1280, height: int = 4000,
               timeout_s: float = 120.0) -> Path:
    """A PNG of the page, ``width`` x ``height`` pixels."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    _run([*FLAGS, f"--screenshot={png}", f"--window-size={width},{height}",
          Path(html_path).resolve().as_uri()], timeout_s)
    return png


def _run(args: list[str], timeout_s: float) -> str:
    exe = browser()
    if exe is None:
        raise FileNotFoundError(f"no browser on PATH (looked for {', '.join(BROWSERS)}): "
                                "apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="autotune-chromium-") as profile:
        done = subprocess.run([exe, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout_s, check=True)
    return done.stdout


def main(argv: list[str]) -> None:
    from autotune.report_html import write_html
    from autotune.tuned_file import read_tuned

    config_path = Path(argv[0]) if argv else Path("autotune.json")
    png = Path(argv[1]) if len(argv) > 1 else Path("autotune_html.png")
    height = int(argv[2]) if len(argv) > 2 else 4000  # pixels, 1280 wide
    with tempfile.TemporaryDirectory() as folder:
        page = write_html(read_tuned(config_path), Path(folder) / "autotune.html")
        state = page_state(page)
        sizes = {name: f"{attrs.get('data-svg-width')}x{attrs.get('data-svg-height')}"
                 for name, attrs in state.plots.items()}
        print(f"plots drawn: {sizes}; errors: {state.errors or 'none'}")
        print(f"wrote {screenshot(page, png, height=height)}")


if __name__ == "__main__":
    main(sys.argv[1:])
