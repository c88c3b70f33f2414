"""The sentences of the search's skips: one template per rule id (and per variant where one rule
says different things), rendered from a skip's figures. ``render`` is the one place a skip's
sentence is made: the search's progress and outcome, ``TunedConfig.skipped`` and the report
all say what it returns.

A skip is its rule id (``autotune.search.rules.RULES``), what it is about (``target``), a
variant of the rule's sentence, a context (the wrapper another decision put it in: a setting
"not tried", micro-batches "not timed" or "not probed") and its figures: numbers stay numbers
(the format is the template's: ``{share:.2f}``, ``{noise:.0%}``, ``{peak:bytes}``), strings
only for labels, keys, lists of micro-batches and the reasons other modules say in words (a
knob the workload cannot take, a stop's reason). ``docs/search.md`` states each rule. No torch.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from autotune.units import format_bytes

Context = Literal["", "not-tried", "not-timed", "micro-batch-not-timed", "above-not-probed",
                  "below-not-probed"]
"""The wrapper a skip's sentence is said in ("" none): its own figures are ``untimed`` (the
micro-batches not timed, a list in words), ``micro_batch``, ``probed_above``,
``probed_below``."""

CONTEXTS: Mapping[str, str] = {
    "": "",
    "not-tried": "{target} not tried: ",
    "not-timed": "{target}: micro-batches {untimed} not timed: ",
    "micro-batch-not-timed": "{target}: micro-batch {micro_batch} not timed: ",
    "above-not-probed": "{target}: micro-batches above {probed_above} not probed: ",
    "below-not-probed": "{target}: micro-batches below {probed_below} not probed: ",
}

FREE_TEXT: Mapping[str, str] = {
    "note": "a sentence of a file that recorded no rules (schema 2)",
    "space": "a note on the space (the device or the request left something out), in words",
    "calibration": "the estimator's calibration after the search, in words",
    "probe": "a memory probe's own note, in words",
}
"""Rule ids whose skips are sentences said elsewhere, kept as their ``text``: no template."""

_COMPILE_COST = "a compiled micro-batch costs a compile of its own"
_LINE = "(time per micro-batch linear in its size, plus one update per step)"
_GAIN_CEILING = (
    "at {micro_batch} it runs {sps:,.1f} samples/s, {share:.2f}x the leader's ({leader}); a "
    "larger one gains at most {ceiling:.2f}x (up to {per_device}: the per-micro-batch overhead "
    "{sibling} showed from {small} to {large}, {ratio:.2f}x, spread over more samples), "
    "{reach:,.1f} samples/s: behind by more than the noise ({noise:.0%})")
_BEHIND = ("is {share:.{digits}f}x the leader's ({leader}), under the {refine_within:.2f} that "
           "refinement needs (--refine-within)")
_BEHIND_NOISE = ("is {share:.{digits}f}x the leader's ({leader}), under the {floor:.3f} that "
                 "refinement needs (--refine-within {refine_within:.2f}, less the noise "
                 "measured here, {noise:.0%})")
_LINE_PREDICTS = ("predicted {predicted:,.1f} samples/s from the line through micro-batches "
                  "{sizes} " + _LINE + ", {share:.2f}x micro-batch {best}'s: ")
_RECHECK = "re-check of {target} (stored run): {stored:,.1f} samples/s stored, {now:,.1f} now, "
_NOT_FASTER_RECOMPUTE = ("checkpointing recomputes, so it runs no faster where {twin} fits "
                         "without it")
_FITS_NONE = "{target}: fits no micro-batch above {largest}"
_FITS_NONE_END = ", and is not tried at {largest} or below: " + _NOT_FASTER_RECOMPUTE
_GAINED = ("the most another compiled class gained here, {compiled} over {its_eager}, "
           "{measured:.2f}x, and 1 at least")
_ROUNDS = ("{challenger} and {leader} ran in {rounds} interleaved rounds, back to back, the "
           "order reversed each round: two runs of {config} drifted {drift:.0%} apart here, "
           "wider than their {gap:.0%} gap. {challenger} ran ")
_ROUNDS_END = (" the other's samples/s: ahead in {ahead} of {rounds}; {target} stands as the "
               "pick of the two")
_OUT = ("{target}: fits only when its compiled graphs load from inductor's cache: compiled "
        "afresh, as a first launch does, it ")

TEMPLATES: Mapping[str, str] = {
    # can it still win?
    "gain-ceiling": _GAIN_CEILING,
    "gain-ceiling:probe-note": "{target}: {note}",
    "over-budget-below": (
        "at {micro_batch} it ran {sps:,.1f} samples/s (over the usable budget), {share:.2f}x "
        "the leader's ({leader}), under the {refine_within:.2f} that refinement needs "
        "(--refine-within) by more than the noise ({noise:.0%}); a smaller micro-batch of a "
        "compiled setting only adds accumulation steps " + _LINE + ", at the cost of a compile "
        "of its own"),
    "over-budget-below:probe-note": "{target}: {note}",
    "behind-refine": "its best " + _BEHIND,
    "behind-refine:did-not-run": "its best did not run",
    "behind-refine:class": "{precision}'s best " + _BEHIND,
    "behind-refine:noise": "its best " + _BEHIND_NOISE,
    "behind-refine:class-noise": "{precision}'s best " + _BEHIND_NOISE,
    "behind-refine:class-did-not-run": "{precision}'s best did not run",
    "frees-nothing": (
        "the leader ({leader}) already runs the whole per-device batch {per_device} at peak "
        "{peak:bytes} of {usable:bytes} usable, without allocator retries: freeing memory "
        "cannot raise its micro-batch, and costs time"),
    "recompute-twin": (
        "checkpointing recomputes, so it runs no faster at a micro-batch {setting} fits "
        "without it, and is worth a run only above its largest timed fit {largest}: "
        + _GAIN_CEILING),
    "recompute-twin:whole-batch": (
        "{twin} fits the whole per-device batch {per_device} without it, and checkpointing "
        "recomputes, so it runs no faster there"),
    "recompute-twin:below-fit": (
        "{target}: micro-batches {largest} and below not tried: " + _NOT_FASTER_RECOMPUTE),
    "recompute-twin:fits-none": _FITS_NONE + _FITS_NONE_END,
    "recompute-twin:fits-none-peak": (
        _FITS_NONE + " (at {first}: peak {first_peak:bytes} of {usable:bytes} usable)"
        + _FITS_NONE_END),
    "recompute-twin:fits-none-status": _FITS_NONE + " (at {first}: {status})" + _FITS_NONE_END,
    "recompute-twin:first-launch": (
        "{candidate} not timed (below {out}, out as a first launch): " + _NOT_FASTER_RECOMPUTE
        + " ({twin}/{largest} fits, compiled afresh as a first launch compiles it, without "
        "allocator retries)"),
    "capped-class": (
        "{target} not probed with checkpointing: memory caps it below the per-device batch, "
        "and its best ({micro_batch}) is {share:.2f}x the leader's ({leader}); at the whole "
        "per-device batch ({per_device}), each step no faster than at {micro_batch}, it "
        "reaches {reach:.2f}x: behind by more than the noise ({noise:.0%})"),
    "oom-class-reach": (
        "{target} not probed with checkpointing ({value}): it ran out of memory at every "
        "micro-batch, and its eager class's best ({eager}) is {share:.2f}x the leader's "
        "({leader}); times what compiling can gain ({gain:.2f}x: " + _GAINED + "), and "
        "checkpointing's recompute (no faster), it reaches {reach:,.1f} samples/s: behind by "
        "more than the noise ({noise:.0%})"),
    "oom-class-reach:no-eager": (
        "{target} not probed with checkpointing ({value}): it ran out of memory at every "
        "micro-batch, and its eager class ({eager}) has no timed run to bound its speed"),
    "oom-class-reach:peak-not-below": (
        "{target} not probed with checkpointing ({value}): {other} fit no micro-batch with it, "
        "and {target}'s eager class peaked no lower at every micro-batch both ran (at "
        "{micro_batch}: {peak:bytes} against {other_peak:bytes}): checkpointing frees "
        "activations, not what compiling adds"),
    "oom-class-reach:probed": (
        "{target} ran out of memory at every micro-batch: probed with checkpointing ({value}), "
        "for its eager class's best ({eager}) is {share:.2f}x the leader's ({leader}), and "
        "times what compiling can gain ({gain:.2f}x: " + _GAINED + ") it reaches "
        "{reach:,.1f} samples/s: not behind by more than the noise ({noise:.0%})"),
    "oom-class-reach:unbounded": (
        "{target} ran out of memory at every micro-batch: probed with checkpointing ({value}), "
        "for its eager class's best ({eager}) is {share:.2f}x the leader's ({leader}), and "
        "{why}"),
    "compile-floor": (
        "{target} not probed: {other} fit no micro-batch down to the smallest, and "
        "{target}'s eager class peaked no lower at every micro-batch both ran (at "
        "{micro_batch}: {peak:bytes} against {other_peak:bytes}): what compiling adds was "
        "over, and it needs no less"),
    "compiled-whole-batch": (
        "{largest} (the whole per-device batch) ran without allocator retries, so a smaller "
        "one only adds accumulation steps, each at the cost of a compile (--micro-batches all "
        "times them)"),
    "sibling-ratio": (
        "predicted {predicted:,.1f} samples/s at {micro_batch} from {sibling}'s own ratio of "
        "micro-batch {micro_batch} to {best} ({ratio:.2f}x, both timed): not faster than "
        "{best} by more than the noise ({noise:.0%})"),
    "sibling-ratio:no-sibling": (
        "a smaller micro-batch only adds accumulation steps " + _LINE + " and costs a compile "
        "of its own: {best} ran without allocator retries, and no setting timed at both "
        "{micro_batch} and {best} ran faster at {micro_batch} (--micro-batches all times them)"),
    "line-predicts-loss": _LINE_PREDICTS + "behind by more than the noise ({noise:.0%})",
    "line-predicts-loss:within-interval": (
        _LINE_PREDICTS + "not ahead by more than the prediction's own interval (+-{spread:.0%}: "
        "each timed point known to {known:.0%} or worse, carried from {sizes} to "
        "{micro_batch}), and " + _COMPILE_COST),
    "line-predicts-loss:within-noise": (
        _LINE_PREDICTS + "not ahead by more than the noise ({noise:.0%}), and " + _COMPILE_COST),
    "line-predicts-loss:no-line": (
        "the line through micro-batches {sizes} " + _LINE + " puts its time per micro-batch "
        "at or below zero at {micro_batch}: it predicts no gain there, and " + _COMPILE_COST),
    "walk-not-faster": (
        "{micro_batch} was not faster than {best} by more than the noise ({noise:.0%})"),
    "micro-batch-limit": "the class's {per_class} largest were (--micro-batches)",
    "growth-over-budget": (
        "{target}: micro-batches above {micro_batch} not probed: its peak at {micro_batch} "
        "({peak:bytes}) grows to about {need:bytes} at {above} ({growth:bytes} a sample), over "
        "the {usable:bytes} usable"),
    "peak-not-below": (
        "{target}: micro-batches above {micro_batch} not probed: its peak at {micro_batch} "
        "({peak:bytes}) is not below {other}'s ({other_peak:bytes}), which fits no larger "
        "micro-batch"),
    "peak-line": "{target}: {note}",
    "not-applicable": "{reason}",
    "knob-reach": (
        "{knobs} not screened on {target}: its best is {share:.2f}x the leader's ({leader}), "
        "and the most they can gain ({ceiling:.2f}x: {why}) leaves it behind by more than "
        "the noise ({noise:.0%})"),
    # racing
    "noise": (
        "{target} timed again early: its two runs landed {gap:.0%} apart, so this machine's "
        "run-to-run noise is taken as {noise:.0%} (at least --confirm-within "
        "{confirm_within:g}) in every bound and cut"),
    "re-measure-first": (
        "{target} timed again before its setting is cut: one run at {share:.2f}x the leader "
        "({leader}), and runs of one config here landed up to {stall:.0%} apart, beyond the "
        "{noise:.0%} noise"),
    "re-measure-first:predicted": (
        "{target} timed again before its setting is cut: one run at {share:.2f}x the leader "
        "({leader}), {under:.0%} under the {predicted:,.1f} samples/s the runs of {source} "
        "predict of it (each knob a factor), beyond {noises:g} times the {noise:.0%} noise: "
        "a run that stalled is only slower"),
    "joint": (
        "{knobs} screened on {target} too: its best is {share:.2f}x the leader's ({leader}), "
        "and the most they can gain ({ceiling:.2f}x: {why}) could make it win"),
    "joint:unbounded": (
        "{knobs} screened on {target} too: its best is {share:.2f}x the leader's ({leader}), "
        "and the most they can gain has no bound ({why})"),
    "joint:tie": (
        "{knobs} screened on {target} too: it ran {share:.2f}x its setting's best ({best}), "
        "within the noise ({noise:.0%}): one run does not settle at which micro-batch the "
        "setting runs best"),
    "joint:value-tie": (
        "{knobs} screened on {target} too: it ran {share:.2f}x its setting's best ({best}), "
        "within the noise ({noise:.0%}): one run does not settle which value runs best, and "
        "two values can gain together what neither gains alone"),
    "joint:down": (
        "{target} timed one micro-batch down: at {above} it {how} (a value that needs more "
        "memory can win below where it is pressed)"),
    "joint:over-budget": (
        "{target} timed: {over} ran {share:.2f}x the leader ({leader}), within the noise "
        "({noise:.0%}) or ahead, but peaked {peak:bytes} over the {usable:bytes} usable; "
        "checkpointing frees memory, and another value of a knob moves the peak"),
    "joint:over-budget-gain": (
        "{target} timed: {over} ran {share:.2f}x the leader ({leader}), and {value} ran up "
        "to {gain:.2f}x faster elsewhere, within the noise ({noise:.0%}) or ahead with it, "
        "but peaked {peak:bytes} over the {usable:bytes} usable; checkpointing frees memory, "
        "and another value of a knob moves the peak"),
    "clear-lead": (
        "no re-measurement: the runner-up ({runner_up}) is {share:.2f}x the leader ({target}), "
        "a gap wider than the noise measured ({noise:.0%}: 95% interval of the ratio, at least "
        "--confirm-within {confirm_within:g})"),
    "within-drift": (
        "{target} re-measured: timed once at {share:.2f}x the leader ({leader}), within the "
        "{drift:.0%} two runs of {config} drifted apart here"),
    "rounds": _ROUNDS + "{share_1:.2f}x, {share_2:.2f}x" + _ROUNDS_END,
    "rounds:three": _ROUNDS + "{share_1:.2f}x, {share_2:.2f}x, {share_3:.2f}x" + _ROUNDS_END,
    "rounds:four": _ROUNDS + "{share_1:.2f}x, {share_2:.2f}x, {share_3:.2f}x, {share_4:.2f}x"
    + _ROUNDS_END,
    "rounds:five": _ROUNDS + "{share_1:.2f}x, {share_2:.2f}x, {share_3:.2f}x, {share_4:.2f}x, "
    "{share_5:.2f}x" + _ROUNDS_END,
    "per-class": (
        "{knob} not screened on {target}: that class's best is {share:.2f}x the leader's "
        "({leader}), and the most {knob} can gain ({gain:.2f}x: the worst-case length over "
        "the mean length) leaves it behind by more than the noise ({noise:.0%})"),
    "rescreen": (
        "{knobs} screened again on {target}: the leader changed after it was screened (on "
        "{on}), and a knob's best value can depend on another's"),
    "rescreen:several": (
        "{knobs} screened again on {target}: the leader changed after they were screened (on "
        "{on}), and a knob's best value can depend on another's"),
    "recheck:slower": _RECHECK + "slower beyond the noise ({noise:.0%}): the fresh run counts",
    "recheck:faster": _RECHECK + "faster beyond the noise ({noise:.0%}): the fresh run counts",
    "recheck:within": _RECHECK + "within the noise ({noise:.0%}): the better run counts",
    "recheck:ended": ("re-check of {target} (stored run): it now ends {status}: the fresh run "
                      "counts"),
    "stored-pick": (
        "{target}: picked on its stored timing alone (a search before measured it): this one "
        "stopped before re-checking it"),
    # first launch
    "first-launch-out": _OUT + "peaked at {peak:bytes}, over the {usable:bytes} usable",
    "first-launch-out:ended": _OUT + "ended {status}",
    "first-launch-out:ended-message": _OUT + "ended {status} ({message})",
    "first-launch-sibling": (
        "{target}: not run again compiled afresh: {sibling} compiled the same graphs afresh at "
        "a peak of {sibling_peak:bytes}; compiling adds at most that to its own {own:bytes}: "
        "{peak:bytes}, within the {usable:bytes} usable"),
    "first-launch-reserve": (
        "{target}: its first-launch check needs about {kept:,.0f} s (its own run's compile "
        "from nothing, warm-up and steps): the other runs stopped with {left:,.0f} s of the "
        "time budget left for it"),
    "first-launch-unchecked": (
        "{target}: not checked as a first launch compiles it (its runs loaded its graphs from "
        "inductor's cache, which lowers the peak): {why}"),
    # notes on the space
    "baseline-rescued": (
        "{base} fits no micro-batch in {usable:bytes} usable: the baseline is {target}, the "
        "first setting that frees enough memory"),
    "near-miss": (
        "{target} peaked at {peak:bytes}, over the {usable:bytes} usable but under the "
        "{budget:bytes} cap (the headroom kept for the allocator's noise): {tried} probed from "
        "there too, each a value that frees no memory by design but may land under"),
    "near-miss:oom": (
        "{target} ran out of memory at {peak:bytes}, within {drop:.0%} of a peak over the "
        "{usable:bytes} usable (what a value that frees no memory by design, an optimizer "
        "implementation or a memory format, took off a CPU run's peak): {tried} probed from "
        "there too, each of which may land under"),
    "fsdp-root": (
        "fsdp: no repeated blocks to shard one by one, so FSDP2 shards the root alone (every "
        "parameter gathered at once in forward and backward: less memory saved at the peak); "
        "name them with Workload(blocks=...)"),
}
"""Each rule's sentence (``rule`` or ``rule:variant``), said after its context's words."""


class Said(Protocol):
    """A skip as ``render`` reads it (``rules.Skip``, ``schema.SkipRecord``)."""

    @property
    def rule(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def context(self) -> str: ...
    @property
    def figures(self) -> Mapping[str, float | int | str]: ...


class _Formatter(string.Formatter):
    """``str.format`` with one more spec: ``bytes`` (``units.format_bytes``, e.g. ``1.50 GiB``;
    a string figure, such as ``-`` for a peak not measured, as it is)."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        if format_spec == "bytes":
            return value if isinstance(value, str) else format_bytes(value)
        return super().format_field(value, format_spec)


_FORMAT = _Formatter()


def template(rule: str, variant: str = "") -> str | None:
    """The template of a rule's variant; None for a rule said in words (``FREE_TEXT``)."""
    return TEMPLATES.get(f"{rule}:{variant}" if variant else rule)


def render(record: Said, stored: str | None = None) -> str:
    """The sentence of a skip: its context's words, then its rule's template, from its figures
    and target. ``stored``: the sentence a file holds, said where the record has no template
    (a rule said in words) or its figures do not fill the template (a file written before the
    template, whose figures were fewer); without it such a record is an error (the search's
    skips always render).

    Raises:
        KeyError: a figure the template names is missing, and nothing was stored.
        ValueError: the record's rule has no template, or a figure does not take its format.
    """
    found = template(record.rule, record.variant)
    if found is None:
        if stored is None:
            raise ValueError(f"rule {record.rule!r} variant {record.variant!r}: no template")
        return stored
    try:
        return _FORMAT.format(CONTEXTS[record.context] + found, **{
            **record.figures, "target": record.target})
    except (KeyError, ValueError, TypeError, IndexError):
        if stored is None:
            raise
        return stored
