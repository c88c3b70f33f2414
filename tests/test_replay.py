"""The replay benchmark (benchmarks/replay.py): today's search against a recorded table."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from replay import ReplayDevice, plan_of, quality_of, replay_one, score  # noqa: E402
from replay_device import KeyedDevice  # noqa: E402
from replay_tables import (  # noqa: E402
    STALL_FACTOR,
    Entry,
    Run,
    Table,
    all_tables,
    gpu_oracle_files,
    truth_of,
)

from autotune.config import DeviceInfo, TrialSpec, WorkloadSpec  # noqa: E402
from autotune.knobs import Knobs  # noqa: E402

MIB = 2**20
CPU = DeviceInfo(device="cpu", name="recorded CPU", total_memory_bytes=16000 * MIB,
                 available_memory_bytes=16000 * MIB, supports_bf16=True, supports_fp16=False,
                 supports_tf32=False, native_bf16=True)
SPEED = {"fp32/off": 10.0, "bf16/off": 20.0, "fp32/default": 15.0, "bf16/default": 40.0}
"""Samples/s of each setting at micro-batch 4 (half that at 1, 3/4 at 2)."""


def entry(label: str, micro_batch: int, *, slow: float = 1.0) -> Entry:
    """Two runs of a candidate, the second ``slow`` times the first's step time; target 4;
    peak 100 MiB + 200 MiB a sample (4 peaks 900 MiB: over the 810 MiB usable, not the cap)."""
    sps = SPEED[label] * {1: 0.5, 2: 0.75, 4: 1.0}[micro_batch]
    step_s = 4 / sps
    peak = (100 + 200 * micro_batch) * MIB
    runs = [Run("ok", step_s, 10, 0.0, peak, 20.0 + 10 * step_s),
            Run("ok", step_s * slow, 10, 0.0, peak, 20.0 + 10 * step_s * slow)]
    return Entry(f"{label}/{micro_batch}", 4 // micro_batch, runs=runs)


def table(**changes) -> Table:
    """Every (precision, compile mode) setting at micro-batches 1, 2 and 4 under a 900 MiB
    cap (810 usable): 4 runs (900 MiB) but does not fit, so bf16/default/2 is the best (its
    second run 25% slower: truth the mean of 30 and 24 samples/s, 27)."""
    entries = {e.key: e for label in SPEED for m in (1, 2, 4)
               for e in [entry(label, m, slow=1.25 if label == "bf16/default" else 1.0)]}
    t = Table(name="hand", machine="recorded CPU", workload="hand-built", spec=WorkloadSpec(),
              device=CPU, target=4, budget_bytes=900 * MIB, headroom=0.1, entries=entries,
              sources=[], sigma=0.05, sigma_note="given")
    return replace(t, **changes)


def test_a_hand_built_table_scores_the_known_best_over_three_seeds() -> None:
    t = table()
    assert t.best() == ("bf16/default/2", pytest.approx((30 + 24) / 2))
    assert t.pass_s() == pytest.approx(sum(20.0 + 10 * e.runs[0].median_s
                                           for e in t.entries.values()))
    out = score(t, 3)
    # the search picks bf16/default/2 in every seed: 4 does not fit, the others are slower
    assert out["picks"] == {"bf16/default/2": 3}
    assert out["pick_quality"] == {"median": 1.0, "p10": 1.0, "min": 1.0}
    assert out["within_3pct"] == 1.0
    assert out["over_budget_picks"] == 0 and out["failed_searches"] == 0
    # the search walks the table's own space: knob values its pass did not record (here
    # every value beyond the defaults) are not offered, so nothing is asked that it lacks
    assert plan_of(t)[2]["optimizer_impl"] == ("default",)
    assert out["not_recorded"]["seeds_with_any"] == 0
    assert out["cost"]["median"] > 0 and out["runs"]["median"] >= 4


def test_a_recorded_run_that_stalled_is_left_out_of_the_truth() -> None:
    # The slow CNN Xeon table's fp32 compiled foreach at 8: 32.1 and 7.2 samples/s (target 8)
    assert truth_of(8, [8 / 32.1, 8 / 7.2]) == pytest.approx(32.1)
    # under twice apart (the Xeon's 34.0 and 19.6): a slow sitting as much as a stall
    assert truth_of(8, [8 / 34.0, 8 / 19.6]) == pytest.approx((34.0 + 19.6) / 2)
    # the EPYC deep GPT's fp32 eager at 4 (two sittings, 27.0 the slowest): none left out
    speeds = [36.6, 27.0, 45.3, 48.0]
    assert truth_of(1, [1 / s for s in speeds]) == pytest.approx(sum(speeds) / 4)
    # one of five at under half the others' median: out
    assert truth_of(1, [1 / s for s in (90.0, 88.0, 91.0, 89.0, 40.0)]) == pytest.approx(89.5)
    assert truth_of(1, [1 / 5.0]) == pytest.approx(5.0) and truth_of(1, []) is None
    # a table's truth and its best read it
    slow = replace(table(), entries={**table().entries, "bf16/default/2": entry(
        "bf16/default", 2, slow=2.5)})
    assert slow.truth("bf16/default/2") == pytest.approx(30.0)


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 1000.0), min_size=1, max_size=6))
def test_the_truth_lies_between_the_plain_mean_and_the_fastest_run(speeds: list[float]) -> None:
    truth = truth_of(1, [1 / s for s in speeds])
    assert truth is not None
    assert sum(speeds) / len(speeds) * (1 - 1e-9) <= truth <= max(speeds) * (1 + 1e-9)
    # the mean, where no run is STALL_FACTOR under the fastest
    if min(speeds) * STALL_FACTOR > max(speeds):
        assert truth == pytest.approx(sum(speeds) / len(speeds))


def test_the_pick_quality_is_the_picks_truth_over_the_best() -> None:
    t = table()
    # fp32/default/2: 15 * 0.75 samples/s in both runs, against the best's 27
    assert quality_of(t, "fp32/default/2") == (pytest.approx(11.25 / 27), "")
    # 4 ran (a truth of its own) but over the usable budget: scored, and said
    assert quality_of(t, "bf16/default/4") == (pytest.approx((40 + 32) / 2 / 27),
                                               "over the table's budget")


def test_a_candidate_missing_from_the_table_cannot_score_as_the_best() -> None:
    t = table()
    # recorded without runs (the oracle left it out) and never recorded: neither is a best
    t.entries["bf16/default+opt=fused/2"] = Entry("bf16/default+opt=fused/2", 2,
                                                 excluded="left out")
    assert t.best()[0] == "bf16/default/2"
    assert quality_of(t, "bf16/default+opt=fused/2") == (0.0, "not recorded")
    assert quality_of(t, "bf16/default+opt=foreach/2") == (0.0, "not recorded")
    device = ReplayDevice(t, 0)
    spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=2, accumulate_steps=2,
                     knobs=Knobs(precision="bf16", compile_mode="default",
                                 optimizer_impl="fused"), num_timed_steps=10)
    result = device(spec)
    assert (result.status, result.message) == ("unsupported", "not recorded")
    assert device.missing == {"bf16/default+opt=fused/2": 1}


def test_the_replay_is_deterministic_per_seed() -> None:
    t = table()
    spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=2, accumulate_steps=2,
                     knobs=Knobs(precision="bf16", compile_mode="default"), num_timed_steps=10,
                     memory_budget_bytes=900 * MIB)
    first, again, other = (ReplayDevice(t, s) for s in (7, 7, 8))
    runs = [[device(spec) for _ in range(6)] for device in (first, again, other)]
    assert runs[0] == runs[1] and first.now_s == again.now_s
    assert [r.step_times_s for r in runs[0]] != [r.step_times_s for r in runs[2]]
    a, b = replay_one(t, 3), replay_one(t, 3)
    assert (a.pick, a.quality, a.cost, a.runs) == (b.pick, b.quality, b.cost, b.runs)


def test_keyed_noise_answers_a_candidates_nth_run_alike_whatever_ran_before() -> None:
    # replay.py --noise keyed: a run's draws follow its candidate and how many of its runs
    # came before, so two versions of the search that differ by one run elsewhere draw the
    # same noise for the runs both make (drawn noise reshuffles every later run).
    t = table()
    spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=2, accumulate_steps=2,
                     knobs=Knobs(precision="bf16", compile_mode="default"), num_timed_steps=10,
                     memory_budget_bytes=900 * MIB)
    other = replace(spec, micro_batch=1, accumulate_steps=4)
    plain, after_other = KeyedDevice(t, 7), KeyedDevice(t, 7)
    after_other(other)
    assert [plain(spec).step_times_s for _ in range(3)] == \
        [after_other(spec).step_times_s for _ in range(3)]
    drawn, drawn_after = ReplayDevice(t, 7), ReplayDevice(t, 7)
    drawn_after(other)
    assert drawn(spec).step_times_s != drawn_after(spec).step_times_s
    # the seed still counts: its two recorded runs (one 1.25x slower) are each drawn
    assert len({KeyedDevice(t, seed)(spec).step_times_s for seed in range(10)}) == 2


def test_the_time_budget_runs_on_the_replays_clock() -> None:
    # Each run costs 20 s or more of simulated time, none of the replay's own: a 100 s
    # budget stops the search after a few runs, though it ran for milliseconds; the run the
    # budget's end cuts short is killed at its timeout, as the runner kills a child.
    t = table(search={"time_budget_s": 100.0})
    seed = replay_one(t, 0)
    assert seed.runs < 8 and seed.cost * t.pass_s() <= 100.0 + 1e-9


def test_every_committed_oracle_is_a_table() -> None:
    tables = all_tables()
    sources = {s for t in tables for s in t.sources}
    assert set(gpu_oracle_files()) - {"gpu_suite-search-gpt2-capped-oracle-gpt2-capped-"
                                      "h200-2026-11-26b.json"} <= sources
    assert {"slow_gpt2-xeon", "slow_bert-xeon", "slow_cnn-xeon", "gpt2-h200",
            "gpt2-h200-capped"} <= {t.name for t in tables}
    assert len({t.name for t in tables}) == len(tables)
    for t in tables:
        key, best = t.best()
        assert t.fits(key) and best > 0 and t.sigma > 0


def test_a_compiled_fit_only_from_the_cache_peaks_over_the_budget_when_compiled_afresh() -> None:
    """A graph's first run in a search compiles it afresh (a search on a fresh machine: the
    replay charges its cold compile) and says so as a child does, by inductor's cache
    counters (nothing read, something written): the search takes it as a first launch. So
    the table's verdict that the candidate fits only from the cache holds for that run and
    for every run compiled afresh; a later run loads its graphs: as recorded."""
    t = table()
    t.entries["bf16/default/2"].fits_first_launch = False  # the table's verdict, no peak
    spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=2, accumulate_steps=2,
                     knobs=Knobs(precision="bf16", compile_mode="default"), num_timed_steps=10,
                     memory_budget_bytes=900 * MIB)
    device = ReplayDevice(t, 0)
    first, warm = device(spec), device(spec)
    assert (first.compile_cache_hits, first.compile_cache_misses) == (0, 1)
    assert first.ok and first.peak_bytes is not None and first.peak_bytes > t.usable_bytes()
    assert (warm.compile_cache_hits, warm.compile_cache_misses) == (1, 0)
    assert warm.peak_bytes == 500 * MIB  # loaded from the cache: as recorded
    cold = device(replace(spec, cold_compile=True))
    assert cold.ok and cold.peak_bytes is not None and cold.peak_bytes > t.usable_bytes()
    assert cold.compile_cache_hits == 0
    eager = device(replace(spec, knobs=Knobs(precision="bf16")))
    assert eager.compile_cache_hits is None and eager.compile_cache_misses is None
    assert not t.fits("bf16/default/2") and t.best()[0] != "bf16/default/2"


def test_a_rule_is_charged_only_with_the_micro_batches_its_skip_left_out() -> None:
    # from the skip's own fields (issue 59), its sentence read only where its context has none
    from replay import skipped_of

    from autotune.search.rules import Skip

    label, skipped = skipped_of(Skip("growth-over-budget", "fp32/off+ckpt=alternate",
                                     {"probed_above": 8}, context="above-not-probed"))
    assert label == "fp32/off+ckpt=alternate" and [m for m in (1, 4, 8, 16, 32)
                                                    if skipped(m)] == [16, 32]
    _, named = skipped_of(Skip("behind-refine", "fp32/off", {"untimed": "4, 2, 1"},
                               context="not-timed"))
    assert [m for m in (1, 2, 4, 8) if named(m)] == [1, 2, 4]


def test_the_near_miss_bound_covers_what_a_value_took_off_a_recorded_peak() -> None:
    """``VALUE_PEAK_DROP`` (rule ``near-miss``) covers what an optimizer implementation or a
    memory format took off a CPU run's peak of 10 MiB or more on the recorded tables
    (``benchmarks/value_peaks.py``): at least 95% of those drops, at most 99% (the last
    percent, up to 35%, would open a near miss at 1.5x the usable memory)."""
    from value_peaks import pairs

    from autotune.search.fits import VALUE_PEAK_DROP

    drops = sorted(1 - ratio for ratio, _, _, peak_mib in pairs() if peak_mib >= 10)
    assert len(drops) > 1000
    covered = sum(d <= VALUE_PEAK_DROP for d in drops) / len(drops)
    assert 0.95 <= covered <= 0.99


def _two_sittings() -> Table:
    """``table`` with each candidate's first run from sitting "a" and its second, 25% slower,
    from sitting "b" (no noise beyond the runs: sigma 0)."""
    t = table(sigma=0.0)
    for e in t.entries.values():
        fast = e.runs[0]
        e.runs = [replace(fast, source="a"),
                  replace(fast, median_s=fast.median_s * 1.25, source="b")]
    return t


def _sittings_answered(device: ReplayDevice, t: Table) -> set[str]:
    """Which sitting each of ``t``'s candidates was answered from, timed once each."""
    from autotune.search._records import Candidate

    seen = set()
    for key, e in t.entries.items():
        c = Candidate.from_key(key)
        spec = TrialSpec(workload=WorkloadSpec(), device="cpu", micro_batch=c.micro_batch,
                         accumulate_steps=e.accumulate_steps, knobs=c.knobs, num_timed_steps=5,
                         memory_budget_bytes=900 * MIB)
        step = sorted(device(spec).step_times_s)[2]
        seen.add("a" if step == pytest.approx(e.runs[0].median_s) else
                 "b" if step == pytest.approx(e.runs[1].median_s) else "?")
    return seen


def test_a_search_is_answered_from_one_sitting_and_the_seeds_visit_each() -> None:
    """With ``one_sitting`` (the what-if, ``replay.py --one-sitting``) every candidate of a
    seed is answered from the same sitting's run, the seeds draw either sitting, and the truth
    stays the mean over both. By default each run comes from either, so one search mixes
    them."""
    t = _two_sittings()
    per_seed = [_sittings_answered(ReplayDevice(t, seed, one_sitting=True), t)
                for seed in range(8)]
    assert all(len(seen) == 1 for seen in per_seed) and {"a", "b"} == set().union(*per_seed)
    mixed = [_sittings_answered(ReplayDevice(t, seed), t) for seed in range(8)]
    assert any(seen == {"a", "b"} for seen in mixed)
    fast = t.entries["bf16/default/2"].runs[0]
    assert t.truth("bf16/default/2") == pytest.approx((4 / fast.median_s
                                                       + 4 / fast.median_s / 1.25) / 2)


def test_a_candidate_its_sitting_lacks_is_answered_from_another() -> None:
    t = _two_sittings()
    e = t.entries["fp32/off/4"]
    e.runs = [r for r in e.runs if r.source == "b"]  # recorded in sitting b alone
    for seed in range(6):
        device = ReplayDevice(t, seed, one_sitting=True)
        assert device.runs_of(e) == e.runs
        assert device.runs_of(t.entries["fp32/off/2"])[0].source == device.sittings[0]


def test_a_traced_search_says_each_run_with_its_stage_and_its_costs_add_up() -> None:
    from replay_explain import sitting_spread, traced

    t = table()
    found, runs = traced(t, 0)
    assert runs and {r["stage"] for r in runs} <= {"probe", "knobs", "refine", "joint",
                                                     "confirm", "first launch", "stored"}
    assert runs[0]["stage"] == "probe" and len(runs) == found.runs
    assert sum(r["cost"] for r in runs) == pytest.approx(found.cost)
    assert (found.pick, found.quality) == (replay_one(t, 0).pick, replay_one(t, 0).quality)
    # two sittings, the second 25% slower on every candidate: no spread between them
    # beyond that offset, none within (one run each)
    spread = sitting_spread(_two_sittings())
    assert spread is not None and spread["offset"] == pytest.approx(math.log(1.25))
    assert spread["between"] == pytest.approx(0.0, abs=1e-12)
    assert sitting_spread(table()) is None  # one sitting (no source): nothing to say


def test_the_explain_figures_split_wall_and_family_changes_as_they_say() -> None:
    from replay_explain import family_changes, overhead_shares, wall_split

    shares = overhead_shares()
    assert shares and all(0.0 <= s <= 1.0 for s in shares.values())

    def table(cands: int, confirm: float) -> dict:
        stages = {"confirm": {"wall": confirm, "alone": confirm, "runs": 4}}
        if cands > 100:
            stages["probe"] = {"wall": 0.1, "alone": 0.02, "runs": 10}
        return {"candidates": cands, "by_workers": {"8": {"breakdown": {"stages": stages}}}}

    split = wall_split({"tables": [table(480, 0.04), table(672, 0.02), table(28, 0.5)]}, 8)
    assert split["confirm"] == pytest.approx({"wall": 0.03, "alone": 0.03, "runs": 4.0})
    assert split["probe"]["wall"] == pytest.approx(0.1)  # the small table has no say

    def row(name: str, w3: float, p10: float, cost: float) -> dict:
        return {"name": name, "within_3pct": w3, "pick_quality": {"p10": p10},
                "cost": {"median": cost}}

    before = {"tables": [row("stall=0.1#0@a", 0.5, 0.9, 0.2), row("stall=0.1#0@b", 0.7, 0.8, 0.3),
                         row("noise=0.1#0@a", 0.6, 0.9, 0.2)]}
    after = {"tables": [row("stall=0.1#0@a", 0.6, 0.9, 0.1), row("stall=0.1#0@b", 0.7, 1.0, 0.3),
                        row("noise=0.1#0@a", 0.6, 0.8, 0.2)]}
    got = family_changes(before, after)
    assert got["stall"] == pytest.approx({"within_3pct": 0.05, "p10": 0.1, "cost": -0.05,
                                          "tables": 2})
    assert got["noise"]["p10"] == pytest.approx(-0.1)


def test_explain_runs_lists_a_tables_candidates_best_first_with_their_recorded_runs(
        capsys) -> None:
    from replay_explain import main as explain

    assert explain(["runs", "recorded", "slow_gpt2-epyc", "fp32/off"]) == 0
    lines = capsys.readouterr().out.splitlines()
    truths = [float(line.split("truth ")[1].split()[0]) for line in lines]
    assert lines and truths == sorted(truths, reverse=True)
    assert all(line.split()[0].startswith("fp32/off") for line in lines)
    one = next(line for line in lines if line.startswith("fp32/off+opt=fused/2 "))
    assert "runs: 0.217/s (search_quality_slow-gpt2-zen3-full.json)" in one
