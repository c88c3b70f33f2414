"""What the noise allows (benchmarks/replay_ceiling.py): exhaustive passes on a replayed
table, and the counts beside a search's replay. No child runs."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay_ceiling  # noqa: E402
from replay import write_results  # noqa: E402
from replay_ceiling import beside, exhaustive, score  # noqa: E402
from test_replay_families import hand_table  # noqa: E402


def test_a_noiseless_pass_picks_the_best() -> None:
    t = hand_table()  # every step its run's median: bf16/default/4 the fastest
    assert t.best()[0] == "bf16/default/4"
    assert {exhaustive(t, seed, passes) for seed in range(3) for passes in (1, 2)} == {
        "bf16/default/4"}
    got = score(t, range(2))
    assert got["pass1"] == {"within_3pct": 1.0, "median": 1.0} == got["pass2"]


def test_a_compiled_best_that_does_not_fit_a_first_launch_hands_the_pick_to_the_next() -> None:
    t = hand_table()
    key = "bf16/default/4"
    t = replace(t, entries={**t.entries, key: replace(t.entries[key], fits_first_launch=False)})
    assert exhaustive(t, 0, 1) == "bf16/default/2"  # 1.3 x 0.8 ahead of bf16/off/4's 1.0


def test_noise_makes_one_pass_miss_and_two_passes_miss_less() -> None:
    # 20% noise between runs of a table of one run a candidate: a single pass picks the luckiest
    # draw; the mean of two draws is nearer each truth.
    t = hand_table(sigma=0.2)
    one = score(t, range(60))["pass1"]["within_3pct"]
    two = score(t, range(60))["pass2"]["within_3pct"]
    assert one < 0.9 and two > one


def row(name: str, search: float, p1: float, p2: float) -> tuple[dict, dict]:
    return ({"name": name, "candidates": 4, "pass1": {"within_3pct": p1, "median": 1.0},
             "pass2": {"within_3pct": p2, "median": 1.0}},
            {"within_3pct": search, "cost": {"median": 0.2}})


def test_beside_counts_where_the_search_falls_short_of_what_the_noise_allows() -> None:
    rows, search = zip(*(row("a", 0.5, 0.9, 1.0), row("b", 0.5, 0.5, 0.7),
                         row("c", 0.9, 0.4, 0.6), row("d", 0.7, 0.75, 0.9)), strict=True)
    got = beside(list(rows), {r["name"]: s for r, s in zip(rows, search, strict=True)})
    assert got["search_under_target"] == 3  # a, b, d
    assert got["pass1_under_target_of_those"] == 2  # b, d
    assert got["pass2_under_target_of_those"] == 1  # b
    assert got["search_under_target_pass1_over"] == ["a"]
    assert got["search_below_pass1_beyond_margin"] == ["a"]  # d is 0.05 below: noise
    assert got["search_at_or_above_pass1"] == 2  # b, c


@pytest.mark.parametrize("content", ["{", '{"tables": []}',
                                     '{"tables": [], "noise": "drawn", "seeds": 30}',
                                     '{"tables": [], "noise": "keyed", "seeds": 10}'])
def test_a_search_file_that_is_not_a_keyed_replay_of_those_seeds_is_refused(
        tmp_path: Path, capsys, content: str) -> None:
    bad = tmp_path / "r.json"
    bad.write_text(content)
    assert replay_ceiling.main(["--families", "develop", "--search", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not a keyed families replay of 30 seeds" in err


def test_seeds_under_one_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        replay_ceiling.main(["--families", "develop", "--seeds", "0"])
    assert exc.value.code == 2 and "--seeds must be 1 or more, not 0" in capsys.readouterr().err


def test_the_missing_search_file_is_said(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "none.json"
    assert replay_ceiling.main(["--families", "judge", "--search", str(missing)]) == 2
    assert "No such file" in capsys.readouterr().err


def test_the_results_are_written_whole_and_replace_what_was_there(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text("old")
    write_results("r", {"tables": [1]}, "# md\n", tmp_path)
    assert json.loads((tmp_path / "r.json").read_text()) == {"tables": [1]}
    assert (tmp_path / "r.md").read_text() == "# md\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md"]  # no .tmp left


@pytest.mark.parametrize("name", ["../x", "a/b", 'a"b', "a\\b", "", ".hidden", "a b"])
def test_a_results_name_that_is_not_a_plain_file_name_is_refused(name: str, capsys) -> None:
    # --write names results/NAME.json and .md: a path, a quote or an empty name would write
    # elsewhere or nowhere; refused before anything runs (exit 2, the value said).
    with pytest.raises(SystemExit) as exc:
        replay_ceiling.main(["--families", "develop", "--write", name])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{name!r} is not a results name" in err


def test_a_plain_results_name_is_taken() -> None:
    from replay import results_name

    assert results_name("replay-ceiling_develop-families_replay-2026-12-02") == \
        "replay-ceiling_develop-families_replay-2026-12-02"
