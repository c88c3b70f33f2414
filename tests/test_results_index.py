"""benchmarks/results/INDEX.md: current, complete, and each line's facts from the file itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import results_index  # noqa: E402


def _whole_history() -> bool:
    if shutil.which("git") is None or not (BENCH.parent / ".git").exists():
        return False
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=BENCH,
                             capture_output=True, text=True).stdout.strip()
    return shallow == "false"


pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(  # git log, about a second
    not _whole_history(),
    reason="the index's fallback commits come from git history: needs a checkout with all of it "
           "(not a shallow clone)")]


def test_committed_index_is_current():
    """Adding, moving or changing a results file without running the script fails here."""
    assert results_index.INDEX.read_text() == results_index.render(), (
        "benchmarks/results/INDEX.md is stale: run python benchmarks/results_index.py")


def test_every_results_file_has_a_line():
    text = results_index.INDEX.read_text()
    for path in results_index.RESULTS.rglob("*"):
        rel = path.relative_to(results_index.RESULTS).as_posix()
        if path.is_file() and rel not in results_index.NOT_INDEXED:
            assert f"({rel.rsplit('.', 1)[0]}." in text, rel


def test_check_says_stale_and_writes_nothing(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "INDEX.md"
    stale.write_text("# Results index\n")
    monkeypatch.setattr(results_index, "INDEX", stale)
    assert results_index.main(["--check"]) == 1
    assert "stale: run python benchmarks/results_index.py" in capsys.readouterr().err
    assert stale.read_text() == "# Results index\n"


def test_a_line_reads_date_machine_commit_command_and_headline_from_the_file(tmp_path,
                                                                          monkeypatch):
    """A new results file, not committed yet: its recorded facts, and HEAD for no commit."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "search_quality_tiny-xeon-2026-11-28.json").write_text(json.dumps({
        "machine": {"date": "2026-11-28 01:02 UTC", "cpu_model": "Intel(R) Xeon(R) Processor"},
        "command": "python benchmarks/search_quality.py --workloads cnn | tee x",
        "rows": [{"short": "cnn", "search": {"tuned": "bf16/default/64"}, "pick_quality": 0.981,
                  "cost_ratio": 0.2, "speedup_vs_naive": 1.5}]}))
    (results / "notes-2026-11-28.md").write_text(
        "# Notes\n\nTree `abcdef1`; ran `python benchmarks/replay.py --seeds 3` on an H200.\n")
    monkeypatch.setattr(results_index, "RESULTS", results)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True,
                          text=True, check=True).stdout.strip()[:7]
    first, second = results_index.entries()
    assert first == {
        "file": "notes-2026-11-28.md", "link": "notes-2026-11-28.md", "date": "2026-11-28",
        "machine": "NVIDIA H200", "commit": "abcdef1",
        "command": "python benchmarks/replay.py --seeds 3", "headline": "Notes"}
    assert second["date"] == "2026-11-28 01:02 UTC" and second["machine"] == "Intel Xeon"
    assert second["commit"] == f"~{head}"
    assert second["headline"] == ("cnn: tuned bf16/default/64, pick quality 0.98, cost 0.20, "
                                  "1.50x fp32 eager")
    assert "\\|" in results_index._cell(second["command"])  # a pipe cannot break the table


def test_the_machine_is_the_one_a_file_was_measured_on_not_another_it_names():
    """A file measured here that names another machine's oracle (a side by side with a Xeon's
    best configs) is this machine's: its recorded ``machine`` first, then the machine its
    name carries, then its first lines; with neither, the first lines (GPU before CPU)."""
    compared = "the two best configs of the Xeon oracle, timed here"
    assert results_index._machine_of({"machine": {"cpu_model": "AMD EPYC"},
                                      "concurrency": compared}, compared,
                                     "side_by_side_slow-cnn-epyc-2026-11-28") == "AMD EPYC"
    text = f"# A live search, AMD EPYC 2 CPUs\n# {compared}\n"
    assert results_index._machine_of(None, text, "search_slow-cnn-epyc-2026-11-28-live") == \
        "AMD EPYC"
    assert results_index._machine_of(None, text, "search_slow-cnn-2026-11-28") == "Intel Xeon"
    assert results_index._machine_of({"machine": {"cpu_model": "Intel Xeon"},
                                      "device": {"name": "NVIDIA H200"}}, "",
                                     "gpu_suite-x") == "NVIDIA H200"
