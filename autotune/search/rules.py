"""The search's rules by stable id, and a decision not to run something as a typed value.

Every skip, re-measure and race note of a search is a ``Skip``: the rule that made it (an id
of ``RULES``), what it is about (a setting's label or a candidate's key), the micro-batches it
left out where it names some, and its figures; its sentence is made from them by
``autotune.skip_sentences.render`` (the one place skip sentences are made). The ids are
shared with ``benchmarks/rule_checks.py`` (the check that backs a rule's bound) and with the
replay benchmark (which counts, per id, whether a skipped setting could have won).
``docs/search.md`` states each rule once. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from autotune.skip_sentences import Context, render

RULES: Mapping[str, str] = {
    # can it still win? (bounds: a predicted or measured ceiling under the leader's floor)
    "gain-ceiling": "a larger micro-batch gains at most the sibling pair's overhead ratio "
                    "(rule_checks 9)",
    "over-budget-below": "a compiled run over the budget, far behind: smaller only adds "
                         "accumulation at a compile each (rule_checks 10)",
    "behind-refine": "a class or precision behind --refine-within, less the noise measured, is "
                     "not refined",
    "knob-reach": "knobs are not screened on a setting whose best, times the most they can "
                  "gain, stays behind the leader",
    "frees-nothing": "the leader runs the whole per-device batch without retries",
    "recompute-twin": "checkpointing runs no faster where its setting fits without it "
                      "(rule_checks 2, 9)",
    "capped-class": "checkpointing is probed on a class memory caps only where a larger "
                    "micro-batch could make it win (a step no faster than a smaller one's)",
    "oom-class-reach": "a compiled class out of memory everywhere is probed with checkpointing "
                       "only where its eager class times the compile gain seen reaches the "
                       "leader (rule_checks 12)",
    "compile-floor": "a compiled class is not probed after another precision's fit nothing "
                     "down to the smallest micro-batch, where its eager class peaked no lower "
                     "at every micro-batch both ran",
    "compiled-whole-batch": "a compiled class at the whole per-device batch is not walked "
                            "down",
    "sibling-ratio": "a sibling timed at both micro-batches says a smaller one gains "
                     "nothing (rule_checks 8)",
    "line-predicts-loss": "the line through a setting's timed micro-batches predicts its "
                          "other end loses (rule_checks 1, 5)",
    "walk-not-faster": "a walk down stops at a micro-batch not faster than the best",
    "micro-batch-limit": "--micro-batches timed per class reached",
    "growth-over-budget": "the growth per sample puts the next micro-batch over the budget "
                          "(rule_checks 3)",
    "peak-not-below": "a peak not below one that fit nothing larger",
    "peak-line": "the line through the fitting peaks puts a failure over the cap "
                 "(rule_checks 3)",
    "not-applicable": "the workload cannot take the knob value",
    # racing (who is re-measured, and when a race stops)
    "noise": "the machine's run-to-run noise, measured early by timing the baseline again",
    "re-measure-first": "a single run within the widest drift seen, or far under what the "
                        "other runs at its micro-batch predict of it, is timed again before "
                        "a cut excludes its setting",
    "joint": "knobs screened jointly: on each setting that could win with them, at a "
             "micro-batch or on a value tied with its best, one divisor down where a value "
             "tied or did not fit, and with checkpointing where a run over the budget could "
             "win",
    "clear-lead": "a lead wider than the noise stands without a re-measure",
    "within-drift": "timed once within the drift two runs of one config showed",
    "rounds": "interleaved rounds decide a gap within the drift",
    "rescreen": "knobs screened again after the leader changed",
    "per-class": "a knob whose best value depends on the class is screened on another class's "
                 "best only where the most it can gain could make that class win",
    "recheck": "a stored timing is re-checked before it picks",
    "stored-pick": "picked on a stored timing alone (stopped before its re-check)",
    # first launch (a compiled winner must fit compiled afresh)
    "first-launch-out": "a compiled winner that does not fit compiled afresh is out",
    "first-launch-sibling": "a sibling's run afresh bounds the first launch within budget",
    "first-launch-unchecked": "the first launch was not checked",
    "first-launch-reserve": "the time budget keeps what the pick's first-launch check takes",
    # notes on the space
    "baseline-rescued": "fp32 eager fits nothing: the first value that frees memory is the "
                        "baseline",
    "near-miss": "a class whose smallest micro-batch peaked inside the headroom (fp32 eager: "
                 "or ran out of memory within what a value may take off a peak) has the "
                 "values that free no memory by design probed there too",
    "fsdp-root": "FSDP2 without repeated blocks shards the root alone",
    "probe": "a memory probe's own note",
    "space": "a class or knob value the device or the request leaves out of the space",
    "calibration": "the estimator's calibration after the search: why there is none",
}
"""Each rule's id and, in a line, what it says (``docs/search.md`` says why)."""


@dataclass(frozen=True)
class Skip:
    """A decision of the search, said with its rule and figures."""

    rule: str
    target: str
    """The setting's label or the candidate's key it is about ("" for the search)."""
    figures: Mapping[str, float | int | str] = field(default_factory=dict)
    variant: str = ""
    """Which of the rule's sentences (``skip_sentences.TEMPLATES``; "" its first)."""
    context: Context = ""
    """The words another decision said it in (``skip_sentences.CONTEXTS``: "not tried")."""

    def __post_init__(self) -> None:
        assert self.rule in RULES, f"unknown rule id {self.rule!r}"

    @property
    def text(self) -> str:
        """The sentence said to the user (``skip_sentences.render``)."""
        return render(self)

    def within(self, context: Context, target: str, **figures: float | int | str) -> Skip:
        """This skip said in another decision's words (``context``), about ``target``."""
        return replace(self, target=target, context=context,
                       figures={**self.figures, **figures})


def skip(rule: str, target: str, variant: str = "", /, *, context: Context = "",
         **figures: float | int | str) -> Skip:
    """A skip of ``rule`` about ``target``, said by its template (``variant``) from ``figures``."""
    return Skip(rule, target, figures, variant, context)
