"""The knobs stage (``autotune/search/stages/knobs.py``): each further knob screened on the
leader, checkpointing probed only where memory binds and above its setting's fit without it,
values that lower the peak probed above the leader's micro-batch, and knobs screened again on
a changed leader.

A scripted device (``tests/scripted.py``) stands in for the runner.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune.search import run_search, tuned_config
from tests.scripted import (
    CLASSES,
    CONV,
    SETTINGS,
    VALUES,
    KnobDevice,
    by_class,
    knob_search,
    plan,
)


def test_a_knob_screened_before_a_later_one_changed_the_leader_is_screened_again_on_it(
        ) -> None:
    # foreach runs 5% slower than the default implementation on contiguous tensors, but 1.15x
    # faster beside channels_last (which alone gains 20%): screened first, on the contiguous
    # leader, foreach loses; channels_last then changes the leader, and the optimizer
    # implementations are timed again on it, once: foreach with channels_last wins.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), traits=CONV,
                        impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 0.95,
                                    "fused": 0.9},
                        format_speed=1.2, pair_speed={("foreach", "channels_last"): 1.15})
    outcome, records = knob_search(device)
    leader = "bf16/max-autotune+format=channels_last"
    assert (f"optimizer_impl screened again on {leader}/32: the leader changed after it was "
            "screened (on bf16/max-autotune), and a knob's best value can depend on "
            "another's") in outcome.skipped
    tuned = tuned_config(plan(), outcome, SETTINGS)
    assert (tuned.knobs.label(), tuned.micro_batch) == (
        "bf16/max-autotune+opt=foreach+format=channels_last", 32)
    assert "bf16/max-autotune+opt=fused+format=channels_last/32" in records
    # Without the pair's gain the leader stands; the second screen timed the two on it.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), traits=CONV,
                        impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 0.95,
                                    "fused": 0.9}, format_speed=1.2)
    outcome, records = knob_search(device)
    assert (tuned_config(plan(), outcome, SETTINGS).knobs.label(), leader) == (leader, leader)
    # (the joint screen times channels_last on other settings too: its gain has no bound)
    assert {s.knobs.label() for s in device.specs if s.knobs.memory_format == "channels_last"
            and s.knobs.optimizer_impl != "default"
            and s.knobs.label().startswith("bf16/max-autotune+opt")} == {
        "bf16/max-autotune+opt=foreach+format=channels_last",
        "bf16/max-autotune+opt=fused+format=channels_last"}


def test_checkpointing_is_probed_where_memory_binds_and_wins_by_its_larger_micro_batch() -> None:
    # 64 needs 1380 MiB of 900 usable without checkpointing; with blocks 100 + 1280 x 0.3.
    # Checkpointing costs 20% of the speed, but 64 runs twice as fast per sample as 32 here:
    # the larger micro-batch it allows wins, and becomes the leader the next knobs start from.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330),
                        shape=lambda m: {64: 2.0}.get(m, 1 - 0.1 * math.log2(32 / m)))
    outcome, records = knob_search(device)
    probes = {p.knobs.label(): p.max_micro_batch for p in outcome.probes}
    # Both settings are probed where memory binds; both fit the whole batch (alternate keeps
    # 60%: 100 + 1280 x 0.6 = 868 of 900 MiB), and alternate, with less recompute, leads.
    assert probes["bf16/max-autotune"] == 32
    assert probes["bf16/max-autotune+ckpt=blocks"] == 64
    assert probes["bf16/max-autotune+ckpt=alternate"] == 64
    speed = {k: r.samples_per_s for k, r in records.items() if r.verdict in ("ok", "slower")}
    assert speed["bf16/max-autotune+ckpt=alternate/64"] > speed["bf16/max-autotune+ckpt=blocks/64"]
    assert speed["bf16/max-autotune+ckpt=blocks/64"] > speed["bf16/max-autotune/32"]
    # The optimizer implementations are timed on the new leader at its micro-batch; the one
    # the optimizer already runs (for-loop) is not timed again, and says why.
    leader = "bf16/max-autotune+ckpt=alternate"
    assert f"{leader}+opt=fused/64" in records and f"{leader}+opt=foreach/64" in records
    assert f"{leader}+opt=for-loop/64" not in records
    assert any("opt=for-loop not tried" in s and "already runs for-loop" in s
               for s in outcome.skipped)
    assert any("format=channels_last not tried" in s and "convolutions" in s
               for s in outcome.skipped)
    # Additive: the 5 settings of stages 1-2 (fp32/max-autotune was not tried), then 2
    # checkpointing and 2 optimizer settings: the sum of the knobs' values, not their product.
    assert len({r.knobs for r in outcome.records}) == 5 + 4


def _capped_above_their_fit(device: KnobDevice, records: dict) -> None:
    """Checkpointing runs on a setting other than the leader's only above the largest
    micro-batch its setting without checkpointing fit (rule capped-class, or the joint
    stage's values on such a run): it recomputes, so it is never run where the setting fits
    without it."""
    for spec in device.specs:
        if spec.knobs.checkpointing == "off":
            continue
        twin = spec.knobs.with_(checkpointing="off").label()
        fit = max((r.micro_batch for key, r in records.items()
                   if key.rsplit("/", 1)[0] == twin and r.verdict not in ("oom", "over_budget")),
                  default=0)
        assert spec.micro_batch > fit, (spec.knobs.label(), spec.micro_batch, fit)


def test_checkpointing_is_not_probed_above_the_leader_where_no_larger_micro_batch_can_win(
        ) -> None:
    # fp32 eager fits 8 (80 MiB a sample), the others 16 (40 MiB a sample): bf16/off starts at
    # 8 and times 8 and 16, a 1.12x gain for twice the micro-batch. On the leader
    # (bf16/max-autotune at 16: 32 does not fit), checkpointing is first run at 32, above the
    # leader's fit: every block checkpointed runs 0.8x there, and a larger micro-batch gains
    # at most 1.03x by that pair's overhead (64 would run 0.8x): its boundary is not probed
    # further, and the reason says so. Neither value runs at 16 or below (it recomputes).
    # Alternate (0.95x) leads at 32, so 64 is probed for it (and does not fit).
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 100 + 40 * m,
                        peaks={"fp32/off": lambda m: 100 + 80 * m},
                        ckpt_speed={"off": 1.0, "alternate": 0.95, "blocks": 0.8})
    outcome, records = knob_search(device)
    assert "bf16/off/8" in records and "bf16/off/16" in records
    leader, blocks = "bf16/max-autotune", "bf16/max-autotune+ckpt=blocks"
    assert f"{leader}/16" in records and records[f"{leader}/32"].verdict == "oom"
    assert {(s.knobs.checkpointing, s.micro_batch) for s in device.specs
            if s.knobs.checkpointing != "off" and s.knobs.compile_mode == "max-autotune"
            } == {("blocks", 32), ("alternate", 32), ("alternate", 64)}
    _capped_above_their_fit(device, records)
    probe = next(p for p in outcome.probes if p.knobs.label() == blocks)
    assert probe.max_micro_batch == 32 and [s.micro_batch for s in probe.steps] == [32]
    assert probe.notes[0].startswith("micro-batches above 32 not probed: at 32 it runs")
    assert (f"{blocks}: micro-batches above 32 not probed: at 32 it runs 264.0 samples/s, 0.89x "
            f"the leader's ({leader}/16); a larger one gains at most 1.03x (up to 64: the "
            "per-micro-batch overhead bf16/off showed from 8 to 16, 1.12x, spread over more "
            "samples), 273.1 samples/s: behind by more than the noise (5%)") in outcome.skipped
    for value in ("blocks", "alternate"):
        assert (f"{leader}+ckpt={value}: micro-batches 16 and below not tried: checkpointing "
                f"recomputes, so it runs no faster where {leader} fits without it"
                ) in outcome.skipped
    probes = {p.knobs.label(): p.max_micro_batch for p in outcome.probes}
    assert probes[f"{leader}+ckpt=alternate"] == 32
    assert records[f"{leader}+ckpt=alternate/64"].verdict == "oom"


def test_an_optimizer_that_needs_less_memory_is_probed_above_the_leader() -> None:
    # 600 MiB fixed + 9 a sample: 32 fits (888 of 900 usable), 64 does not (1176). Fused
    # saves 300 MiB: at 32 its peak (588) may fit 64 (its class's growth is not measured, and
    # at least 3.5 MiB a sample by the leader's out-of-memory at 64: 700), so it is probed
    # there; and 64 runs 10% faster per sample. Foreach saves nothing: timed at the leader's
    # micro-batch only.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 600 + 9 * m,
                        impl_saves_mib={"fused": 300},
                        shape=lambda m: 1 + 0.1 * math.log2(m / 32))
    outcome, records = knob_search(device)
    assert "bf16/max-autotune+opt=fused/64" in records
    assert not any(k.startswith("bf16/max-autotune+opt=foreach/") and not k.endswith("/32")
                   for k in records)
    best = max(records.values(), key=lambda r: r.samples_per_s or 0)
    assert (best.knobs.optimizer_impl, best.micro_batch) == ("fused", 64)
    probes = {p.knobs.label(): p.max_micro_batch for p in outcome.probes}
    assert probes["bf16/max-autotune+opt=fused"] == 64 and probes["bf16/max-autotune"] == 32

    # Saving 50 MiB: 838 at 32. No setting of the leader's memory class completed two
    # micro-batches, but its out-of-memory at 64 says it grows at least (1000 - 888) / 32 =
    # 3.5 MiB a sample: 950 at 64, over the 900 usable: not worth a probe (it would only end in
    # an out-of-memory).
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 600 + 9 * m,
                        impl_saves_mib={"fused": 50},
                        shape=lambda m: 1 + 0.1 * math.log2(m / 32))
    outcome = run_search(plan(), CLASSES, replace(SETTINGS, fresh=True), values=VALUES,
                         run=device)
    assert "bf16/max-autotune+opt=fused/32" in {f"{r.knobs.label()}/{r.micro_batch}"
                                                for r in outcome.records}
    assert not any(s.knobs.optimizer_impl == "fused" and s.micro_batch == 64
                   and s.knobs.checkpointing == "off" for s in device.specs)
    assert ("bf16/max-autotune+opt=fused: micro-batches above 32 not probed: its peak at 32 "
            "(838.00 MiB) grows to about 950.00 MiB at 64 (3.50 MiB a sample), over the "
            "900.00 MiB usable") in outcome.skipped


@pytest.mark.parametrize("format_speed", [0.98, 1.02])
def test_two_values_that_each_lower_the_peak_are_probed_above_the_leader_together(
        format_speed: float) -> None:
    # 600 MiB fixed + 9 a sample: the leader (bf16/max-autotune) fits 32 (888 of 900 usable),
    # not 64. Fused saves 120 MiB and channels_last 200: alone neither fits 64 (1056, 976),
    # together they do (856). Fused runs 2% slower at 32 than the leader; channels_last 2%
    # slower (neither leads) or 2% faster (it leads, and fused was timed on the leader before
    # it): either way 64 runs 10% faster per sample, and the two together at 64 win. They are
    # timed together at 32 first and probed above; alone they are not, with the growth the
    # pair's probe measured (9 MiB a sample) as the reason.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 600 + 9 * m,
                        impl_saves_mib={"fused": 120}, format_saves_mib=200,
                        impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 0.97,
                                    "fused": 0.98},
                        format_speed=format_speed, traits=CONV,
                        shape=lambda m: 1 + 0.1 * math.log2(m / 32))
    outcome, records = knob_search(device)
    pair = "bf16/max-autotune+opt=fused+format=channels_last"
    probes = {p.knobs.label(): p.max_micro_batch for p in outcome.probes}
    assert probes[pair] == 64 and probes["bf16/max-autotune"] == 32
    assert f"{pair}/32" in records and f"{pair}/64" in records
    tuned = tuned_config(plan(), outcome, SETTINGS)
    assert (tuned.knobs.label(), tuned.micro_batch) == (pair, 64)
    for alone in ("bf16/max-autotune+opt=fused", "bf16/max-autotune+format=channels_last"):
        assert f"{alone}/32" in records
        assert not any(s.knobs.label() == alone and s.micro_batch > 32 for s in device.specs)
    assert ("bf16/max-autotune+format=channels_last: micro-batches above 32 not probed: its "
            "peak at 32 (688.00 MiB) grows to about 976.00 MiB at 64 (9.00 MiB a sample), over "
            "the 900.00 MiB usable") in outcome.skipped


def test_values_whose_pair_fits_no_larger_micro_batch_are_not_probed_above_alone() -> None:
    # Fused saves 60 MiB and channels_last 100: together 728 MiB at 32, 1016 at 64 (over the
    # budget). The pair's probe is the one out-of-memory paid: each alone peaks higher at 32,
    # so neither is probed above it, and the reason names the pair.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 600 + 9 * m,
                        impl_saves_mib={"fused": 60}, format_saves_mib=100,
                        impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 0.97,
                                    "fused": 0.98},
                        format_speed=0.98, traits=CONV,
                        shape=lambda m: 1 + 0.1 * math.log2(m / 32))
    outcome, _ = knob_search(device)
    pair = "bf16/max-autotune+opt=fused+format=channels_last"
    probes = {p.knobs.label(): p for p in outcome.probes}
    assert probes[pair].max_micro_batch == 32
    assert [(s.micro_batch, s.status) for s in probes[pair].steps] == [(32, "ok"), (64, "oom")]
    for alone, peak in (("bf16/max-autotune+format=channels_last", "788.00 MiB"),
                        ("bf16/max-autotune+opt=fused", "828.00 MiB")):
        assert not any(s.knobs.label() == alone and s.micro_batch > 32 for s in device.specs)
        assert (f"{alone}: micro-batches above 32 not probed: its peak at 32 ({peak}) is not "
                f"below {pair}'s (728.00 MiB), which fits no larger micro-batch"
                ) in outcome.skipped
    tuned = tuned_config(plan(), outcome, SETTINGS)
    assert (tuned.knobs.label(), tuned.micro_batch) == ("bf16/max-autotune", 32)


def test_checkpointing_is_skipped_with_its_measured_reason_where_memory_does_not_bind() -> None:
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 100 + 5 * m)
    outcome, records = knob_search(device)
    assert not any("ckpt=" in key for key in records)
    reason = next(s for s in outcome.skipped if "ckpt=blocks not tried" in s)
    assert "whole per-device batch 64 at peak 420.00 MiB" in reason  # 100 + 5 * 64 MiB


def test_a_lowered_value_is_probed_from_its_run_at_the_leaders_micro_batch() -> None:
    # Memory binds the leader (bf16/max-autotune: 350 + 36 MiB a sample) at 8: 16 peaks at
    # 926 MiB, over the 900 usable. foreach saves 50 MiB: timed on the leader at 8 (588 MiB),
    # it peaks lower, so it is probed above: 876 at 16 fits. The line through its own 8 and 16
    # puts 32 at 1452 MiB, over the 1000 MiB cap: no run ends there in an out-of-memory (a
    # probe that knew only its 16 would run 32).
    shape = {16: 0.99, 32: 0.99, 64: 0.99}
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peak_mib=lambda m: 100 + 90 * m,
                        peaks={"bf16/max-autotune": lambda m: 350 + 36 * m},
                        impl_saves_mib={"foreach": 50},
                        impl_speed={"default": 1.0, "for-loop": 1.0, "foreach": 0.99,
                                    "fused": 0.97},
                        shape=lambda m: shape.get(m, 1 - 0.1 * math.log2(8 / m)))
    outcome, records = knob_search(device)
    foreach = "bf16/max-autotune+opt=foreach"
    assert f"{foreach}/8" in records and f"{foreach}/16" in records
    probe = next(p for p in outcome.probes if p.knobs.label() == foreach)
    assert [(s.micro_batch, s.status, s.fits) for s in probe.steps] == [
        (8, "ok", True), (16, "ok", True)]
    assert probe.max_micro_batch == 16
    assert not any(s.knobs.label() == foreach and s.micro_batch == 32 for s in device.specs)
    assert (f"{foreach}: micro-batches above 16 not probed: the line through the peaks at 8, "
            "16 puts 32 at 1.42 GiB, over the 1000.00 MiB cap") in outcome.skipped


@pytest.mark.parametrize("larger_slower", [True, False])
def test_checkpointing_is_not_screened_where_the_leaders_own_larger_micro_batch_ran_slower(
        larger_slower: bool) -> None:
    # Eager fits 8 (80 MiB a sample), compiled code 16 (40 MiB a sample): each compiled probe
    # times 8 and 16. Where 16 runs 0.85x of 8, the leader (bf16/max-autotune at 8) got
    # slower with the larger micro-batch: a larger one gains at most 1.00x over 16 by that
    # pair, and checkpointing, which recomputes, is no faster than the setting at any
    # micro-batch the setting fits: neither value can win, and neither is run. Where 16 runs
    # faster (10% a doubling), the leader is at 16 and checkpointing is screened above it.
    eager, compiled = (lambda m: 100 + 80 * m), (lambda m: 100 + 40 * m)
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), peaks={
        "fp32/off": eager, "bf16/off": eager, "fp32/default": compiled,
        "bf16/default": compiled, "bf16/max-autotune": compiled},
        shape=(lambda m: 1.0 if m <= 8 else 0.85) if larger_slower
        else (lambda m: 1 - 0.1 * math.log2(32 / m)))
    outcome, records = knob_search(device)
    leader = "bf16/max-autotune"
    ckpt = [s for s in device.specs if s.knobs.checkpointing != "off"
            and (s.knobs.precision, s.knobs.compile_mode) == ("bf16", "max-autotune")]
    _capped_above_their_fit(device, records)  # the other classes: capped-class
    assert f"{leader}/8" in records and f"{leader}/16" in records
    if not larger_slower:
        assert {s.knobs.checkpointing for s in ckpt} == {"blocks", "alternate"}
        assert {s.micro_batch for s in ckpt} == {32, 64}  # above the leader's fit only
        assert not any(s.startswith((f"{leader}+ckpt=blocks not tried: ",
                                     f"{leader}+ckpt=alternate not tried: "))
                       for s in outcome.skipped)
        return
    assert ckpt == []
    for value in ("blocks", "alternate"):
        assert (f"{leader}+ckpt={value} not tried: checkpointing recomputes, so it runs no "
                f"faster at a micro-batch {leader} fits without it, and is worth a run only "
                f"above its largest timed fit 16: at 16 it runs 280.5 samples/s, 0.85x the "
                f"leader's ({leader}/8); a larger one gains at most 1.00x (up to 64: the "
                f"per-micro-batch overhead {leader} showed from 8 to 16, 0.85x, spread over "
                "more samples), 280.5 samples/s: behind by more than the noise (5%)"
                ) in outcome.skipped


def test_checkpointing_is_run_where_its_setting_fits_only_under_memory_pressure() -> None:
    # As in the last test, but the leader's setting reports allocator retries at 32, its
    # largest fit: there, freeing memory can make a step faster, so 32 is no floor, and each
    # checkpointing value's probe starts there (the boundary the setting's probe found).
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330), retries_at=32,
                        ckpt_memory={"off": 1.0, "alternate": 0.9, "blocks": 0.8},
                        ckpt_speed={"off": 1.0, "alternate": 1.05, "blocks": 0.8})
    outcome, _ = knob_search(device)
    assert {(s.knobs.checkpointing, s.micro_batch) for s in device.specs
            if s.knobs.checkpointing != "off" and s.knobs.optimizer_impl == "default"
            } >= {("blocks", 32), ("alternate", 32)}
    assert not any(" and below not tried: checkpointing recomputes" in s
                   for s in outcome.skipped)


def test_checkpointing_is_not_run_where_its_setting_fits_without_it_so_its_noise_leads_nothing(
        ) -> None:
    # Memory binds the leader (bf16/max-autotune fits 32, not 64), and checkpointing frees too
    # little for 64 (each value keeps 80-90% of the per-sample memory: over the cap there).
    # At 32, where the setting fits without it, checkpointing every second block would run 5%
    # faster than without (the run-to-run noise: it recomputes). Neither value runs there: each
    # is tried at 64 only, where it runs out of memory; the optimizer implementations are
    # screened on bf16/max-autotune at 32, and the pick is the fused optimizer without
    # checkpointing. Neither value is left among the probes as fitting nothing (its 32 and
    # below were never tried); the reason says what was seen.
    device = KnobDevice(by_class(100, 150, 160, 200, 300, 330),
                        ckpt_memory={"off": 1.0, "alternate": 0.9, "blocks": 0.8},
                        ckpt_speed={"off": 1.0, "alternate": 1.05, "blocks": 0.8})
    outcome, records = knob_search(device)
    leader = "bf16/max-autotune"
    assert [(s.knobs.checkpointing, s.micro_batch) for s in device.specs
            if s.knobs.checkpointing != "off" and s.knobs.compile_mode == "max-autotune"
            ] == [("blocks", 64), ("alternate", 64)]
    _capped_above_their_fit(device, records)
    assert records[f"{leader}+ckpt=alternate/64"].verdict == "oom"
    assert not any(p.knobs.checkpointing != "off" for p in outcome.probes)
    for value in ("blocks", "alternate"):
        assert (f"{leader}+ckpt={value}: fits no micro-batch above 32 (at 64: oom), and is not "
                f"tried at 32 or below: checkpointing recomputes, so it runs no faster where "
                f"{leader} fits without it") in outcome.skipped
    assert f"{leader}+opt=fused/32" in records and f"{leader}+opt=foreach/32" in records
    assert not any("+ckpt=" in k and "+opt=" in k for k in records)
    tuned = tuned_config(plan(), outcome, SETTINGS)
    assert (tuned.knobs.label(), tuned.micro_batch) == (f"{leader}+opt=fused", 32)
