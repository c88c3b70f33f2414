"""README.md and docs/: short, every link there, every command's flags known to its --help, and
README's Python runs as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import autotune
from autotune.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
GENERATED = {ROOT / "docs" / "reference" / "autotune-json.md"}  # by docs/hooks.py, at build


def blocks(path: Path, *languages: str) -> list[str]:
    return [m[2] for m in FENCE.finditer(path.read_text()) if m[1] in languages]


def autotune_commands(path: Path) -> list[list[str]]:
    """Each ``$ autotune ...`` line of a console block, and each ``autotune ...`` of a bash one
    (continuation lines joined, comments cut)."""
    found = []
    for language, block in ((m[1], m[2]) for m in FENCE.finditer(path.read_text())
                            if m[1] in ("console", "bash")):
        for line in block.replace("\\\n", " ").splitlines():
            if language == "console" and not line.startswith("$ "):
                continue  # the command's output
            line = line.removeprefix("$ ").split("  #")[0].strip()
            for part in re.split(r"&&|;", line):
                words = shlex.split(part.split(" #")[0])
                if words[:1] == ["autotune"]:
                    found.append(words[1:])
    return found


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move detail into a page of docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_is_a_file_that_is_there(page: Path):
    broken = [t for t in LINK.findall(page.read_text())
              if "://" not in t and not t.startswith(("mailto:", "/"))
              and not (page.parent / t).exists() and (page.parent / t).resolve() not in GENERATED]
    assert broken == [], f"{page.relative_to(ROOT)} links files that are not there: {broken}"


def _help(command: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, (command, result.output)
    return result.output


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_commands_options_are_in_its_help(page: Path):
    """A renamed or removed option or command fails here, in the README or the page that
    still shows it."""
    helps: dict[tuple[str, ...], str] = {}
    for words in autotune_commands(page):
        command = tuple(w for w in words[:2] if not w.startswith("-") and "." not in w
                        and "/" not in w and w.isidentifier())
        command = command[:1] if command[:1] != ("cache",) else command
        text = helps.setdefault(command, _help(command))
        for word in words:
            if word.startswith("--"):
                option = word.split("=")[0]
                assert re.search(rf"{re.escape(option)}\b", text), (
                    f"{page.relative_to(ROOT)}: `autotune {' '.join(words)}`: "
                    f"{option} is not in `autotune {' '.join(command)} --help`")


def test_readme_shows_the_main_commands():
    commands = [words[0] for words in autotune_commands(README)]
    assert {"search", "check", "estimate"} <= set(commands), commands


def test_readmes_workload_runs_as_written():
    """README's factory, with a small MyModel: its batch and loss make one real step."""
    [code] = blocks(README, "python")
    space = {"MyModel": lambda: torch.nn.Linear(512, 10)}
    exec(compile(code, "README.md", "exec"), space)
    workload = space["workload"]()
    assert isinstance(workload, autotune.Workload)
    model = workload.build_model()
    batch = workload.make_batch(4)
    loss = workload.loss(model, batch)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
