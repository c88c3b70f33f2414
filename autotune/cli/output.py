"""How an ``autotune`` command prints and ends: one kind of console (text printed as typed),
warnings as one line, and the exit code of what ended it (DESIGN.md section 10).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from autotune.errors import AutotuneError
from autotune.report_width import wrap
from autotune.signals import command


def plain_console(**options: object) -> Console:
    """A console that prints text exactly as given: the one kind autotune prints through.

    Markup, emoji codes and highlighting are off, so a workload's name, an exception message,
    a path or a rank's ``[/__w/pytorch/...] Connection closed`` prints as typed (never read as
    ``[tags]`` or ``:emoji:``); autotune's own styling comes only from ``rich.text.Text``
    objects it builds. ``options`` go to ``Console`` (``stderr``, ``width``, ``file``, ...).
    """
    return Console(**{"soft_wrap": True, **options,  # type: ignore[arg-type]
                      "markup": False, "emoji": False, "highlight": False})


out = plain_console()
err = plain_console(stderr=True)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    """A warning as one line on stderr, printed as typed (not Python's two lines naming the
    source line that warned)."""
    err.print(Text.assemble(("warning:", "yellow"), " ", str(message)))


class Done:
    """What a command wrote before a signal ended it (``exits`` says so)."""

    written: Path | None = None


@contextlib.contextmanager
def exits() -> Iterator[Done]:
    """Turn what ends a command into its exit code (DESIGN.md section 10): a library error's
    own (2 bad input or broken workload, 1 does not fit), 130 for Ctrl-C and 143 for SIGTERM
    (saying what was written: the exception's ``written``, else the command's ``Done``), 3
    for a bug of autotune's own (with its traceback). A warning prints as one line. In the
    ``autotune`` process the command's signals are ``signals.command``'s: once it ends, every
    later one is ignored while it says why and exits."""
    done = Done()
    try:
        with warnings.catch_warnings(), command():
            warnings.showwarning = _show_warning
            yield done
    except AutotuneError as exc:
        # The message may quote a file's values or a workload's error: printed as typed.
        _last().print(Text.assemble(("error:", "bold red"), " ", str(exc)))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        written = getattr(exc, "written", None) or done.written
        name = "Ctrl-C" if getattr(exc, "signal_name", "SIGINT") == "SIGINT" else exc.signal_name
        _last().print(f"interrupted ({name}): " + (
            f"wrote {written}, its train_autotuned.py"
            + (" and autotune.html" if Path(written).with_suffix(".html").exists() else "")
            + " first" if written else
            "nothing written"), highlight=False, markup=False)
        raise typer.Exit(getattr(exc, "exit_code", 130)) from None
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except Exception as exc:
        last = _last()
        last.print("".join(traceback.format_exception(exc)), highlight=False, markup=False)
        last.print(f"internal error: {type(exc).__name__}: {exc}. This is a bug in autotune, not "
                   "in your input: please report it with the traceback above",
                   highlight=False, markup=False)
        raise typer.Exit(3) from None


def _last() -> Console:
    """A console for a command's last line, onto ``err``'s file: a new one, as a signal that
    raised inside one of ``err``'s prints (between the halves of rich's buffer bookkeeping)
    leaves ``err`` holding every later print back, and the line would never show."""
    return plain_console(file=err.file)


def out_for_tables() -> Console:
    """Stdout console, wide enough for the results table even when piped, unless ``COLUMNS``
    says how wide (rich reads it)."""
    asked = os.environ.get("COLUMNS", "").strip().isdigit()
    return plain_console(width=None if sys.stdout.isatty() or asked else 160)


def say(console: Console, line: str) -> None:
    """One line of a command's output, wrapped between words to the console's width (the
    continuation indented): no word is cut, and at 80 columns no line is wider."""
    for part in wrap(line, console.width):
        console.print(part, highlight=False)


@contextlib.contextmanager
def progress_bar(console: Console | None = None) -> Iterator[Progress]:
    """The search's progress line on stderr, gone once it ends (its lines stay): one line at
    any width, its description (``run 9/~23, ~1 min 40 s left: ...``) cut with ``…``."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False, table_column=Column(
            no_wrap=True, overflow="ellipsis", ratio=1)),
        BarColumn(bar_width=10), TimeElapsedColumn(), console=console or err,
        transient=True, expand=True)
    with progress:
        yield progress
