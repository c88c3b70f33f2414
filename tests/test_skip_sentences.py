"""The skips' sentences (autotune/skip_sentences.py): every rule id has a template or is said in
words, every template renders from figures of its kind, the search's skips render (every skip
of a replay search per table), and a skip read back from autotune.json says the same sentence.

No child runs: the replay searches run on recorded tables.
"""

from __future__ import annotations

import contextlib
import io
import json
import string
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from replay import ReplayDevice, plan_of, settings_of  # noqa: E402
from replay_tables import all_tables  # noqa: E402

from autotune.report_skips import skipped_lines  # noqa: E402
from autotune.schema import SkipRecord  # noqa: E402
from autotune.search import run_search  # noqa: E402
from autotune.search.outcome import skip_records  # noqa: E402
from autotune.search.rules import RULES, Skip, skip  # noqa: E402
from autotune.serialize import to_json_dict  # noqa: E402
from autotune.skip_sentences import CONTEXTS, FREE_TEXT, TEMPLATES, render  # noqa: E402
from autotune.tuned_file import read_tuned  # noqa: E402
from tests.tuned_configs import make_tuned, write  # noqa: E402


def _fields(text: str) -> dict[str, str]:
    """A template's figure names, each with its format spec."""
    found: dict[str, str] = {}
    for _, name, spec, _ in string.Formatter().parse(text):
        if name:
            found[name] = spec or ""
            found.update(_fields(spec or ""))  # a nested one: {share:.{digits}f}
    return found


def test_every_rule_id_has_a_template_or_is_said_in_words() -> None:
    with_template = {key.partition(":")[0] for key in TEMPLATES}
    assert set(RULES) - with_template == set(FREE_TEXT) - {"note"}
    assert with_template <= set(RULES) and not with_template & set(FREE_TEXT)


def _figure(name: str, spec: str) -> st.SearchStrategy[Any]:
    if name == "digits":
        return st.sampled_from([2, 3])
    if spec == "bytes":
        return st.integers(0, 2**40) | st.just("-")
    if spec:  # a number's format: .2f, .0%, ,.1f, g
        return st.floats(0, 1e6, allow_nan=False) | st.integers(0, 10**6)
    return st.integers(1, 4096) | st.text("abcdefg/+=-0123456789 ,", min_size=1, max_size=30)


@settings(max_examples=10, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("key", sorted(TEMPLATES))
def test_every_template_renders_from_figures_of_its_kind(key: str, data: st.DataObject) -> None:
    """Numbers in, a sentence out: every field named gets its format, none is left as ``{``,
    in every context (a context's own figures added)."""
    rule, _, variant = key.partition(":")
    context = data.draw(st.sampled_from(sorted(CONTEXTS)))
    fields = {**_fields(TEMPLATES[key]), **_fields(CONTEXTS[context])}
    fields.pop("target", None)
    figures = {name: data.draw(_figure(name, spec), label=name)
               for name, spec in fields.items()}
    said = skip(rule, "bf16/off", variant, context=context, **figures).text
    assert said and "{" not in said and "}" not in said
    assert said.startswith(string.Formatter().format(CONTEXTS[context], target="bf16/off",
                                                     **figures))


def _replay_skips() -> list[Skip]:
    """Every skip of one replay search per recorded table (seed 0)."""
    found: list[Skip] = []
    for table in all_tables():
        plan, classes, values = plan_of(table)
        device = ReplayDevice(table, 0)
        with contextlib.redirect_stderr(io.StringIO()):
            found += run_search(plan, classes, settings_of(table), values=values, run=device,
                                clock=device.clock).skips
    return found


def test_every_skip_of_the_replay_searches_renders_and_reads_back_the_same(
        tmp_path: Path) -> None:
    """The figures the call sites give fill their templates; written to autotune.json and
    read back (an int figure stays an int: micro-batch 8, not 8.0), each says the same."""
    skips = _replay_skips()
    assert len({(s.rule, s.variant, s.context) for s in skips}) >= 15  # many kinds met
    config = replace(make_tuned(), skips=skip_records((), _outcome(*skips)))
    read = read_tuned(write(config, tmp_path / "autotune.json"))
    assert read.skipped == tuple(s.text for s in skips)
    assert [s.text for s in read.skips] == [s.text for s in skips]  # for jq readers too
    assert all(r.figures == dict(s.figures) for r, s in zip(read.skips, skips, strict=True))


def _outcome(*skips: Skip) -> Any:
    """A SearchOutcome-shaped value for ``skip_records`` (only its ``skips`` are read)."""
    return SimpleNamespace(skips=skips)


def test_a_context_is_part_of_the_record_not_of_a_string(tmp_path: Path) -> None:
    """A value the workload cannot take, said "not tried": the file holds the reason and the
    context apart, and the sentence is made from them (the reason's words once)."""
    why = skip("not-applicable", "bf16/off+ckpt=blocks",
               reason="the workload names no blocks to checkpoint")
    said = why.within("not-tried", "bf16/off+ckpt=blocks")
    assert said.text == ("bf16/off+ckpt=blocks not tried: the workload names no blocks to "
                         "checkpoint")
    config = replace(make_tuned(), skips=skip_records((), _outcome(said)))
    data = json.loads(write(config, tmp_path / "autotune.json").read_text())
    assert data["skips"][0] | {"text": ""} == {
        "rule": "not-applicable", "target": "bf16/off+ckpt=blocks", "variant": "",
        "context": "not-tried", "text": "",
        "figures": {"reason": "the workload names no blocks to checkpoint"}}
    assert data["skips"][0]["text"] == said.text


def test_a_schema_3_file_of_before_the_templates_keeps_its_sentences(tmp_path: Path) -> None:
    """Yesterday's files recorded fewer figures, no variant and no context: each skip says
    the sentence the file holds (its figures do not fill today's template)."""
    old = [
        {"rule": "sibling-ratio", "target": "fp32/off",
         "text": "fp32/off: micro-batches 16, 8 not timed: predicted 270.0 samples/s at 16 "
                 "from bf16/default's own ratio of micro-batch 16 to 32 (0.90x, both timed): "
                 "not faster than 32 by more than the noise (5%)",
         "figures": {"ratio": 0.9, "noise": 0.05}},
        {"rule": "gain-ceiling", "target": "bf16/default", "text": "bf16/default: ...",
         "figures": {"share": 0.5, "ceiling": "inf", "leader": "bf16/off 8"}},
        {"rule": "space", "target": "", "text": "fp16 left out: the device has no fp16"},
    ]
    data = json.loads(json.dumps(to_json_dict(make_tuned())))
    data["skips"] = old
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps(data))
    read = read_tuned(path)
    assert read.skipped == tuple(s["text"] for s in old)
    assert skipped_lines(read.skips)[0].startswith("skipped: fp32/off: micro-batches 16, 8")


def test_a_record_renders_from_its_figures_over_its_stored_text() -> None:
    """A file's skip whose figures fill its template says the template's sentence (one
    place makes sentences); a rule said in words says its text; the search's own skip with
    a figure missing is an error, not a silent stale sentence."""
    record = SkipRecord(rule="walk-not-faster", target="bf16/off", context="not-timed",
                        text="stale words",
                        figures={"untimed": "4, 2", "micro_batch": 8, "best": 16,
                                 "noise": 0.05})
    assert record.sentence() == ("bf16/off: micro-batches 4, 2 not timed: 8 was not faster "
                                 "than 16 by more than the noise (5%)")
    assert SkipRecord(rule="calibration", text="no calibration: stopped").sentence() == (
        "no calibration: stopped")
    with pytest.raises(KeyError, match="best"):
        render(skip("walk-not-faster", "bf16/off", micro_batch=8, noise=0.05))


# The words users saw before the templates (the f-strings at each rule's site, branch start
# 8e270fd), for the sentences the replay searches never say: each must stay word for word.
SAID_BEFORE = [
    (skip("behind-refine", "bf16/off", "class", precision="bf16", share=0.8971, digits=3,
          leader="bf16/default 16", refine_within=0.9).within("not-tried", "bf16/off"),
     "bf16/off not tried: bf16's best is 0.897x the leader's (bf16/default 16), under the "
     "0.90 that refinement needs (--refine-within)"),
    (skip("behind-refine", "bf16/off", "class-did-not-run", precision="bf16", share=0.0)
     .within("not-tried", "bf16/off"), "bf16/off not tried: bf16's best did not run"),
    (skip("behind-refine", "bf16/off", "did-not-run", share=0.0)
     .within("not-timed", "bf16/off", untimed="4, 2, 1"),
     "bf16/off: micro-batches 4, 2, 1 not timed: its best did not run"),
    (skip("first-launch-out", "bf16/off 8", "ended", status="timeout"),
     "bf16/off 8: fits only when its compiled graphs load from inductor's cache: compiled "
     "afresh, as a first launch does, it ended timeout"),
    (skip("first-launch-unchecked", "bf16/off 8", why="stopped: --time-budget"),
     "bf16/off 8: not checked as a first launch compiles it (its runs loaded its graphs from "
     "inductor's cache, which lowers the peak): stopped: --time-budget"),
    (skip("fsdp-root", ""),
     "fsdp: no repeated blocks to shard one by one, so FSDP2 shards the root alone (every "
     "parameter gathered at once in forward and backward: less memory saved at the peak); "
     "name them with Workload(blocks=...)"),
    (skip("line-predicts-loss", "bf16/off", "no-line", context="micro-batch-not-timed",
          micro_batch=1, sizes="2, 8"),
     "bf16/off: micro-batch 1 not timed: the line through micro-batches 2, 8 (time per "
     "micro-batch linear in its size, plus one update per step) puts its time per "
     "micro-batch at or below zero at 1: it predicts no gain there, and a compiled "
     "micro-batch costs a compile of its own"),
    (skip("line-predicts-loss", "bf16/off", "within-interval", context="micro-batch-not-timed",
          micro_batch=1, predicted=123.456, sizes="2, 8", share=0.82304, best=8, noise=0.05,
          spread=0.07, known=0.03),
     "bf16/off: micro-batch 1 not timed: predicted 123.5 samples/s from the line through "
     "micro-batches 2, 8 (time per micro-batch linear in its size, plus one update per step), "
     "0.82x micro-batch 8's: not ahead by more than the prediction's own interval (+-7%: each "
     "timed point known to 3% or worse, carried from 2, 8 to 1), and a compiled micro-batch "
     "costs a compile of its own"),
    (skip("micro-batch-limit", "bf16/off", context="not-timed", untimed="4, 2, 1",
          per_class=2),
     "bf16/off: micro-batches 4, 2, 1 not timed: the class's 2 largest were (--micro-batches)"),
    (skip("recheck", "bf16/off 8", "ended", status="oom"),
     "re-check of bf16/off 8 (stored run): it now ends oom: the fresh run counts"),
    (skip("recheck", "bf16/off 8", "slower", stored=1234.5, now=987.6, noise=0.05),
     "re-check of bf16/off 8 (stored run): 1,234.5 samples/s stored, 987.6 now, slower beyond "
     "the noise (5%): the fresh run counts"),
    (skip("recheck", "bf16/off 8", "within", stored=1234.5, now=1230.0, noise=0.05),
     "re-check of bf16/off 8 (stored run): 1,234.5 samples/s stored, 1,230.0 now, within the "
     "noise (5%): the better run counts"),
    (skip("recompute-twin", "bf16/off", micro_batch=16, sps=100.0, share=0.625,
          leader="bf16/default 16", ceiling=1.1, per_device=64, sibling="fp32/off", small=4,
          large=8, ratio=0.95, reach=110.0, noise=0.05, setting="bf16/off", largest=16)
     .within("not-tried", "bf16/off+ckpt=full"),
     "bf16/off+ckpt=full not tried: checkpointing recomputes, so it runs no faster at a "
     "micro-batch bf16/off fits without it, and is worth a run only above its largest timed "
     "fit 16: at 16 it runs 100.0 samples/s, 0.62x the leader's (bf16/default 16); a larger "
     "one gains at most 1.10x (up to 64: the per-micro-batch overhead fp32/off showed from 4 "
     "to 8, 0.95x, spread over more samples), 110.0 samples/s: behind by more than the noise "
     "(5%)"),
    (skip("recompute-twin", "bf16/off+ckpt=full", "whole-batch", context="not-tried",
          twin="bf16/off", per_device=64, largest=64),
     "bf16/off+ckpt=full not tried: bf16/off fits the whole per-device batch 64 without it, "
     "and checkpointing recomputes, so it runs no faster there"),
    (skip("recompute-twin", "bf16/off+ckpt=full", "fits-none", twin="bf16/off", largest=16),
     "bf16/off+ckpt=full: fits no micro-batch above 16, and is not tried at 16 or below: "
     "checkpointing recomputes, so it runs no faster where bf16/off fits without it"),
    (skip("recompute-twin", "bf16/default+ckpt=full", "first-launch",
          candidate="bf16/default+ckpt=full 8", out="bf16/default+ckpt=full 16",
          twin="bf16/default", largest=8),
     "bf16/default+ckpt=full 8 not timed (below bf16/default+ckpt=full 16, out as a first "
     "launch): checkpointing recomputes, so it runs no faster where bf16/default fits without "
     "it (bf16/default/8 fits, compiled afresh as a first launch compiles it, without "
     "allocator retries)"),
    (skip("rescreen", "bf16/off 8", "several", knobs="optimizer, memory_format",
          on="bf16/off"),
     "optimizer, memory_format screened again on bf16/off 8: the leader changed after they "
     "were screened (on bf16/off), and a knob's best value can depend on another's"),
    (skip("stored-pick", "bf16/off 8"),
     "bf16/off 8: picked on its stored timing alone (a search before measured it): this one "
     "stopped before re-checking it"),
    (skip("frees-nothing", "bf16/off 64", leader="bf16/off 64", per_device=64, peak="-",
          usable=2**30).within("not-tried", "bf16/off+ckpt=full"),
     "bf16/off+ckpt=full not tried: the leader (bf16/off 64) already runs the whole "
     "per-device batch 64 at peak - of 1.00 GiB usable, without allocator retries: freeing "
     "memory cannot raise its micro-batch, and costs time"),
]


@pytest.mark.parametrize(("said", "before"), SAID_BEFORE,
                         ids=[f"{s.rule}:{s.variant}" for s, _ in SAID_BEFORE])
def test_a_sentence_the_replay_never_says_is_word_for_word_what_users_saw(
        said: Skip, before: str) -> None:
    assert said.text == before
