"""benchmarks/replay_compare.py: two replays of the generated families compared per table,
each figure's change with its 95% interval, and the errors for files that cannot be compared.
The end-to-end case replays a tiny generated table in this process (git tells its commit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import replay  # noqa: E402
import replay_compare  # noqa: E402


def table(name: str, w3: float, median: float = 1.0, p10: float = 1.0, cost: float = 0.2,
          which: str = "develop") -> dict:
    return {"name": name, "set": which, "within_3pct": w3, "cost": {"median": cost},
            "pick_quality": {"median": median, "p10": p10, "min": p10}}


def replay_file(tables: list[dict], seeds: int = 30, sets: tuple = ("develop",)) -> dict:
    return {"seeds": seeds, "sets": list(sets), "tables": tables}


def write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_change_every_table_shows_is_better_and_its_counts_are_said() -> None:
    before = replay_file([table(f"t{i}", 0.70, median=0.96, cost=0.20) for i in range(40)])
    after = replay_file([table(f"t{i}", 0.80 + 0.01 * (i % 3), median=0.98, cost=0.18)
                         for i in range(40)])
    got = replay_compare.compare(before, after)["develop"]
    w3 = got["figures"]["within_3pct"]
    assert w3["change"] == pytest.approx(0.1 + 0.01 * 39 / 40)  # (i % 3: 13 ones, 13 twos)
    assert 0 < w3["low"] < w3["change"] < w3["high"] and w3["verdict"] == "better"
    assert got["figures"]["cost"]["verdict"] == "better"  # (lower cost is better)
    assert got["figures"]["median"]["verdict"] == "better"
    assert got["counts"]["before"]["under_0.97"] == 40 and got["counts"]["after"]["under_0.97"] == 0


def test_changes_either_way_are_within_the_noise_though_the_counts_moved() -> None:
    # Half the tables gain 0.04 and half lose 0.05: a mean change of -0.005 within the spread
    # of the changes, though 20 tables crossed 0.97 each way.
    before = replay_file([table(f"t{i}", 0.8, median=0.99 if i % 2 else 0.95)
                          for i in range(40)])
    after = replay_file([table(f"t{i}", 0.8, median=0.94 if i % 2 else 0.99)
                         for i in range(40)])
    got = replay_compare.compare(before, after)["develop"]
    median = got["figures"]["median"]
    assert median["change"] == pytest.approx(-0.005)
    assert median["low"] < 0 < median["high"] and median["verdict"] == "within the replay's noise"
    assert (got["counts"]["before"]["under_0.97"], got["counts"]["after"]["under_0.97"]) \
        == (20, 20)
    assert got["counts"]["after"]["worst"] == "t1" and got["counts"]["after"]["worst_median"] \
        == pytest.approx(0.94)


def test_higher_cost_is_worse() -> None:
    before = replay_file([table(f"t{i}", 0.8, cost=0.20) for i in range(10)])
    after = replay_file([table(f"t{i}", 0.8, cost=0.25 + 0.001 * i) for i in range(10)])
    assert replay_compare.compare(before, after)["develop"]["figures"]["cost"]["verdict"] \
        == "worse"


@hyp_settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.5, 1), st.floats(0, 1)),
                min_size=2, max_size=30))
def test_a_replay_beside_itself_moved_nothing_and_swapping_the_two_flips_each_verdict(
        figures: list[tuple[float, float, float]]) -> None:
    one = replay_file([table(f"t{i}", w3, median=m, cost=c)
                       for i, (w3, m, c) in enumerate(figures)])
    other = replay_file([table(f"t{i}", 1 - w3, median=1.5 - m, cost=1 - c)
                         for i, (w3, m, c) in enumerate(figures)])
    same = replay_compare.compare(one, one)["develop"]["figures"]
    assert all(f["change"] == 0 and f["verdict"] == "within the replay's noise"
               for f in same.values())
    ahead = replay_compare.compare(one, other)["develop"]["figures"]
    back = replay_compare.compare(other, one)["develop"]["figures"]
    flip = {"better": "worse", "worse": "better"}
    for key in ahead:
        assert back[key]["change"] == pytest.approx(-ahead[key]["change"], abs=1e-12)
        assert back[key]["verdict"] == flip.get(ahead[key]["verdict"], ahead[key]["verdict"])


def test_files_that_cannot_be_compared_are_an_error_that_says_what_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "a.json", replay_file([table("t0", 0.8), table("t1", 0.9)]))
    cases = {
        "seeds.json": (replay_file([table("t0", 0.8), table("t1", 0.9)], seeds=10),
                       "the two replays differ in seeds: 30 before, 10 after; replay both "
                       "with the same --families, --seeds and --noise"),
        "sets.json": (replay_file([table("t0", 0.8), table("t1", 0.9)], sets=("judge",)),
                      "the two replays differ in sets: ['develop'] before, ['judge'] after"),
        "noise.json": ({**replay_file([table("t0", 0.8), table("t1", 0.9)]), "noise": "keyed"},
                       "the two replays differ in noise: drawn before, keyed after; replay "
                       "both with the same --families, --seeds and --noise"),
        "tables.json": (replay_file([table("t0", 0.8), table("t2", 0.9)]),
                        "the two replays hold other tables (2 in one only, e.g. t1)"),
        "lacks.json": (replay_file([table("t0", 0.8), {"name": "t1", "within_3pct": 0.9}]),
                       "lacks.json: table t1 lacks a figure (within_3pct, pick_quality, cost)"),
        "plain.json": ({"tables": []}, "plain.json: not a replay of the generated families"),
        "empty.json": (replay_file([]), "empty.json: holds no tables (a replay of nothing"),
    }
    for name, (data, said) in cases.items():
        path = write(tmp_path, name, data)
        assert replay_compare.main([str(good), str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("replay_compare: ") and said in err, (name, err)
    broken = tmp_path / "broken.json"
    broken.write_text('{"seeds": 30,')
    assert replay_compare.main([str(good), str(broken)]) == 2
    assert "broken.json: not JSON (Expecting property name" in capsys.readouterr().err
    assert replay_compare.main([str(good), str(tmp_path / "gone.json")]) == 2
    assert "gone.json: cannot read it (No such file or directory)" in capsys.readouterr().err


@pytest.mark.subprocess  # (replay.py asks git for the commit it replays)
def test_two_real_replays_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A tiny generated table replayed for real (2 seeds each), written as replay.py writes
    # them, read back and compared: the same replay beside itself moved nothing.
    assert replay.main(["--families", "develop", "--seeds", "2", "--no-baseline", "--json",
                        "--only", "noise=0.02#0@tiny_gpt2-xeon"]) == 0
    path = write(tmp_path, "real.json", json.loads(capsys.readouterr().out))
    assert replay_compare.main([str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("develop: 1 tables, 2 replay seeds each")
    assert "share of seeds within 3% of the best" in out
    assert out.count("within the replay's noise") == 4


def test_exclude_leaves_out_the_tables_of_a_base_and_nothing_else() -> None:
    # A rule judged apart from the base it was drawn from: --exclude @BASE leaves out exactly
    # the generated tables of that base (not tiny_cnn-epyc, whose name holds "cnn-epyc").
    from replay_report import replay_set
    from replay_tables import all_tables

    def names(score_calls: list[str]):
        def score(t, seeds, first_seed):
            score_calls.append(t.name)
            return {"name": t.name}
        return score

    every: list[str] = []
    replay_set("develop", 1, all_tables(), names(every), only="noise=")
    kept: list[str] = []
    replay_set("develop", 1, all_tables(), names(kept), only="noise=", exclude=("@cnn-epyc",))
    assert any(n.endswith("@cnn-epyc") for n in every)
    assert any(n.endswith("@tiny_cnn-epyc") for n in kept)
    assert kept == [n for n in every if not n.endswith("@cnn-epyc")]


def test_exclude_without_families_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        replay.main(["--exclude", "@cnn-epyc", "--seeds", "1"])
    assert exit_.value.code == 2
    assert "--exclude @cnn-epyc: it leaves out generated tables; give --families too" \
        in capsys.readouterr().err
