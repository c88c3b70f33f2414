"""benchmarks/replay_misses.py: where the search misses on a replay's tables under 0.97. The
searches are real (a synthetic table and a recorded one, in this process); the file names
which tables and how many seeds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import replay_misses  # noqa: E402
from replay_tables import all_tables  # noqa: E402


def test_each_seed_of_each_table_under_0_97_is_said_once(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    rows = [{"name": "opt-needs-memory=0.45#0@synthetic", "set": "develop",
             "pick_quality": {"median": 0.9}},
            {"name": "tiny_bert-xeon", "pick_quality": {"median": 0.5}},
            {"name": "tiny_gpt2-xeon", "pick_quality": {"median": 1.0}}]  # (not under 0.97)
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"seeds": 2, "tables": rows}))
    assert replay_misses.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:2]] == [rows[0]["name"], "tiny_bert-xeon"]
    *_, summary = lines
    counts = [int(n) for n in summary.split(":")[1].replace(",", " ").split()
              if n.isdigit()]
    assert summary.startswith("2 tables under 0.97") and sum(counts) == 4


def test_the_kinds_follow_the_table_s_truth() -> None:
    # tiny_bert-xeon's search picks its best on every seed (replay -30i): both seeds hit.
    table = next(t for t in all_tables() if t.name == "tiny_bert-xeon")
    assert replay_misses.kinds(table, range(2)) == {"hit": 2}


@pytest.mark.parametrize("text", ["", "{}", '{"seeds": 2}', "[1, 2]"])
def test_a_file_that_is_not_a_families_replay_exits_2(tmp_path: Path, text: str,
                                                      capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "replay.json"
    path.write_text(text)
    assert replay_misses.main([str(path)]) == 2
    assert "not a families replay" in capsys.readouterr().err
