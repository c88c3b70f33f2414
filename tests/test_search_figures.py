"""What a candidate's record shows when it ran more than once (issue 59): the typical of its
runs, not its luckiest, and for the pair of the confirm stage's interleaved rounds, figures
that read as the rounds said."""

from __future__ import annotations

import math
from dataclasses import replace

from autotune.config import Knobs, TrialResult
from autotune.report import short_reason
from autotune.search import run_search, tuned_config
from autotune.search._records import Candidate, as_rounds_said, typical_run
from tests.scripted import CLASSES, SLOW, ScriptedDevice, by_class, plan


def _run(step_s: float, *, steps: int = 10, stop: str = "steps", peak: int = 100
         ) -> TrialResult:
    """A timed run of ``steps`` steps of ``step_s`` seconds (64 samples a step)."""
    return TrialResult(status="ok", step_times_s=(step_s,) * steps, timing_stop=stop,  # type: ignore[arg-type]
                       samples_per_step=64, peak_bytes=peak)


def test_typical_run_is_the_median_of_three_full_runs_and_the_better_of_two() -> None:
    lucky, slow, usual = _run(0.5, peak=300), _run(0.8), _run(0.7, peak=200)
    # Three full runs: the median run (not the lucky one), carrying the largest peak.
    three = typical_run([lucky, slow, usual])
    assert (three.median_step_s(), three.peak_bytes) == (0.7, 300)
    # Four: the faster of the middle two (a slow period only inflates times).
    assert typical_run([lucky, slow, usual, _run(0.75)]).median_step_s() == 0.7
    # Two further apart than the noise: the better (a stall is one-sided; of two runs, the
    # slower may be the stalled one).
    assert typical_run([slow, usual]).median_step_s() == 0.7
    assert typical_run([slow, usual], noise=0.14).median_step_s() == 0.7
    # A run stopped early (behind the leader) is no full run: two full ones, the better.
    assert typical_run([slow, usual, _run(0.6, steps=3, stop="behind")]
                       ).median_step_s() == 0.6
    # A run out of memory puts the candidate out, whatever its other runs timed.
    oom = TrialResult(status="oom", message="CUDA out of memory", samples_per_step=64)
    assert typical_run([lucky, oom, usual, slow]).status == "oom"


def test_two_runs_within_the_measured_noise_read_as_their_geometric_mean() -> None:
    # Two full runs 0.70 and 0.77 s a step (10% apart) on a machine whose other configs' two
    # runs landed 12% apart: two draws of one config, read as their geometric mean (the better
    # of two is the luckier), with the larger peak. On a machine whose runs land 5% apart,
    # 10% says one of them stalled: the better. The order of the runs does not matter.
    usual, slower = _run(0.7, peak=300), _run(0.77, peak=200)
    for runs in ([usual, slower], [slower, usual]):
        mean = typical_run(runs, noise=0.12)
        assert math.isclose(mean.median_step_s() or 0.0, math.sqrt(0.7 * 0.77))
        assert mean.peak_bytes == 300 and mean.ok
        assert typical_run(runs, noise=0.05).median_step_s() == 0.7
    # One full run and one stopped early are not two draws: the better.
    assert typical_run([slower, _run(0.72, steps=3, stop="behind")], noise=0.12
                       ).median_step_s() == 0.72


def test_two_runs_are_judged_by_the_drift_of_the_other_configs_not_their_own() -> None:
    # The leader's two runs land 40% apart (a busy minute on its second); the others' two runs
    # landed 1-2% apart: the leader's gap is judged against theirs (it stalled, and keeps its
    # better run: ``test_a_leader_whose_two_runs_drifted_apart...`` picks it), never against
    # a median its own 40% pulled up.
    from autotune.search.evidence import Evidence
    from autotune.search.plan import Plan

    evidence = Evidence(Plan.of(plan(), CLASSES, {}), SLOW)
    keys = [Candidate(knobs=k, micro_batch=32) for k in CLASSES[:3]]
    evidence.drift.update(zip(keys, (0.02, 0.01, 0.4), strict=True))
    assert [round(evidence.drift_beside(k), 6) for k in keys] == [0.205, 0.21, 0.015]
    # So the leader's figure is its better run, and a pair within 1.5% its mean.
    stalled = [_run(0.5), _run(0.7)]
    assert typical_run(stalled, evidence.drift_beside(keys[2])).median_step_s() == 0.5
    assert typical_run(stalled, evidence.drift_beside(keys[0])).median_step_s() == 0.5
    close = [_run(0.5), _run(0.505)]
    assert math.isclose(typical_run(close, evidence.drift_beside(keys[2])).median_step_s()
                        or 0.0, math.sqrt(0.5 * 0.505))


def test_a_candidate_reads_the_mean_of_two_runs_within_twice_the_others_typical_gap() -> None:
    # Two configs' two runs landed 10% and 12% apart here. A candidate whose two runs landed
    # 18% apart reads as their geometric mean: the others' typical gap (the median of 10%,
    # 12% and the stalled one's 60%) is 12%, and 18% is within two of them (24%), where a
    # pair of one config lands 82% of the time under normal noise. (At one typical gap it
    # read as its better run, the luckier draw.) One whose runs landed 60% apart (a stall)
    # reads as its better run.
    from autotune.search.evidence import Evidence
    from autotune.search.intervals import SINGLE_RUN_GAPS
    from autotune.search.plan import Plan

    ev = Evidence(Plan.of(plan(), CLASSES, {}), SLOW)
    others = [Candidate(knobs=k, micro_batch=32) for k in CLASSES[:2]]
    for key, gap in zip(others, (1.10, 1.12), strict=True):
        ev.took(key, _run(0.5))
        ev.remeasured(key, _run(0.5 * gap))
    drawn, stalled = (Candidate(knobs=k, micro_batch=32) for k in CLASSES[2:4])
    for key, gap in ((drawn, 1.18), (stalled, 1.6)):
        ev.took(key, _run(0.5))
        ev.remeasured(key, _run(0.5 * gap))
    assert SINGLE_RUN_GAPS == 2.0 and math.isclose(ev.drift_beside(drawn), 0.12)
    assert math.isclose(ev.figure(drawn).median_step_s() or 0.0, 0.5 * math.sqrt(1.18))
    assert ev.figure(stalled).median_step_s() == 0.5


def test_the_noise_s_pair_of_baseline_runs_reads_as_their_mean_short_of_a_stall() -> None:
    # The baseline timed twice to measure the noise: two draws of one config by design, so
    # every cut reads their geometric mean (the better, the luckier draw, put the baseline
    # ahead of what it runs); one 1.5x slower or more stalled: the better. Any other
    # re-measure keeps its better run, and the drift is the gap either way.
    from autotune.search.evidence import Evidence
    from autotune.search.intervals import PAIR_STALL
    from autotune.search.plan import Plan

    assert PAIR_STALL == 1.5
    ev = Evidence(Plan.of(plan(), CLASSES, {}), SLOW)
    paired, stalled, plain = (Candidate(knobs=k, micro_batch=32) for k in CLASSES[:3])
    for key, slow, pair in ((paired, 1.2, True), (stalled, 1.6, True), (plain, 1.2, False)):
        ev.took(key, _run(0.5, peak=300))
        ev.remeasured(key, _run(0.5 * slow, peak=200), paired=pair)
    assert math.isclose(ev.results[paired].median_step_s() or 0.0, 0.5 * math.sqrt(1.2))
    assert ev.results[paired].peak_bytes == 300 and ev.runs[paired] == 2
    assert ev.results[stalled].median_step_s() == 0.5
    assert ev.results[plain].median_step_s() == 0.5
    assert math.isclose(ev.drift[paired], ev.drift[plain])
    # an out-of-memory re-run still puts the candidate out
    ev.took(oom := Candidate(knobs=CLASSES[3], micro_batch=32), _run(0.5))
    ev.remeasured(oom, TrialResult(status="oom", message="out of memory", samples_per_step=64),
                  paired=True)
    assert ev.results[oom].status == "oom"


def test_as_rounds_said_puts_the_pair_in_the_rounds_ratio_about_their_own_figures() -> None:
    # By their own runs the rounds' loser reads faster (its run 0.5 s a step against 0.6 s),
    # but the winner was ahead 1.1x and 1.2x back to back: the pair reads 1.15x apart, the
    # winner ahead (the two rounds' geometric mean), about the geometric mean of the two
    # figures.
    winner, loser = _run(0.6), _run(0.5)
    shares = (1.1, 1.2)
    one = as_rounds_said(winner, loser, shares)
    other = as_rounds_said(loser, winner, tuple(1 / s for s in shares))
    a, b = one.samples_per_s() or 0.0, other.samples_per_s() or 0.0
    assert math.isclose(a / b, math.sqrt(1.1 * 1.2)) and a > b
    assert math.isclose(a * b, (winner.samples_per_s() or 0.0) * (loser.samples_per_s() or 0.0))


def test_a_baseline_with_one_lucky_run_does_not_show_the_rounds_winner_slower() -> None:
    # fp32/off (the baseline) runs 100 samples/s, but its first run drew a quiet minute: 120.
    # fp32/default runs 108. The baseline's two runs drifted 20% apart, wider than the 10% gap
    # its lucky run shows, so the two run in interleaved rounds, and fp32/default is ahead in
    # both: it is picked. Before, the table read the baseline's lucky run: the winner showed
    # 0.90x the baseline and the runner-up 1.11x the winner.
    baseline = Knobs(precision="fp32", compile_mode="off").label()
    settings = replace(SLOW, refine_within=0.0, confirm_within=0.1)
    device = ScriptedDevice(by_class(100, 108, 40, 40, 40, 40), jitter=(0.0, 0.02, -0.02),
                            shape=lambda m: 0.5 ** math.log2(32 / m),
                            between_runs={f"{baseline}/32": (1 / 1.2,)})
    outcome = run_search(plan(), CLASSES, settings, run=device)
    assert "fp32/default/32 stands as the pick of the two" in outcome.skipped[-1]
    config = tuned_config(plan(), outcome, settings)
    winner = next(t for t in config.trials if t.verdict == "winner")
    assert winner.label() == "fp32/default 32x2" and config.runner_up == "rounds"
    assert winner.speedup is not None and winner.speedup >= 1, winner.speedup
    assert config.speedup == winner.speedup
    ratio = float(short_reason(config).split("Runner-up fp32/off 32x2 at ")[1].split("x")[0])
    assert ratio <= 1, short_reason(config)
