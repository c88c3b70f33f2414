"""benchmarks/replay_parallel_compare.py: two replays of N simulated workers side by side. The
replay is real (one tiny recorded table, one seed, in this process); the second file is the
first with one table's wall changed."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import replay_parallel  # noqa: E402
import replay_parallel_compare  # noqa: E402
from replay_tables import all_tables  # noqa: E402


@pytest.fixture(scope="module")
def replayed() -> dict:
    tables = [t for t in all_tables() if t.name in ("tiny_gpt2-xeon", "tiny_bert-xeon")]
    return {"commit": "abc1234", "tables": [replay_parallel.score(t, 1, [1, 2]) for t in tables]}


def test_a_replay_against_itself_moves_nothing(replayed: dict) -> None:
    text = replay_parallel_compare.compare(replayed, replayed)
    lines = text.splitlines()
    assert lines[0] == "2 tables; before abc1234, after abc1234"
    assert len(lines) == 2 and lines[1].startswith("N=2: wall ")
    assert "wall lower on 0, higher on 0" in lines[1]


def test_a_table_whose_wall_rose_is_counted_and_named(replayed: dict) -> None:
    after = copy.deepcopy(replayed)
    risen = after["tables"][1]
    wall = risen["by_workers"]["2"]["wall_cost"]
    before = wall["median"]
    wall["median"] = before * 2
    line = replay_parallel_compare.compare(replayed, after).splitlines()[1]
    assert f"higher on 1; most risen: {risen['name']} {before:.3f} -> {2 * before:.3f}" in line


def test_a_table_whose_pick_moved_with_n_beyond_its_noise_is_counted_and_named(
        replayed: dict) -> None:
    after = copy.deepcopy(replayed)
    moved = after["tables"][0]
    moved["same_pick_1_other_noise"] = 1.0
    moved["by_workers"]["2"]["same_pick_as_1"] = 0.5
    moved["by_workers"]["2"]["within_3pct"] = 0.0
    line = replay_parallel_compare.compare(replayed, after).splitlines()[1]
    old = replayed["tables"]
    w3 = sum(t["by_workers"]["2"]["within_3pct"] for t in old) / 2
    assert f"within 3% {w3:.4f} -> {old[1]['by_workers']['2']['within_3pct'] / 2:.4f}" in line
    assert f"-0.5 ({moved['name']}), more than 0.2 below 0 -> 1" in line


def test_a_replay_written_before_the_noise_column_compares_its_walls_only(
        replayed: dict) -> None:
    old = copy.deepcopy(replayed)
    for table in old["tables"]:
        del table["same_pick_1_other_noise"]
    line = replay_parallel_compare.compare(old, replayed).splitlines()[1]
    assert "wall lower on 0, higher on 0" in line
    assert line.endswith("picks not compared: a file without the noise column (written before "
                         "2026-11-29b)")


def test_replays_of_other_tables_are_refused(replayed: dict) -> None:
    fewer = {**replayed, "tables": replayed["tables"][:1]}
    with pytest.raises(SystemExit, match=r"other tables \(2 and 1, 1 in both\)"):
        replay_parallel_compare.compare(replayed, fewer)


@pytest.mark.parametrize("content", [None, "", "not json", '["a list"]', '{"tables": 3}'])
def test_a_file_that_is_not_a_replay_exits_2_naming_it(content: str | None, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "we'ird\\name.json"
    if content is not None:
        bad.write_text(content)
    assert replay_parallel_compare.main([str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cannot read {str(bad)!r} as a replay_parallel.py --write JSON file: ")
