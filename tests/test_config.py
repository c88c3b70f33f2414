"""config: sizes, budgets and the JSON round trip of the values passed between stages."""

from __future__ import annotations

import json
import math

import pytest

from autotune.config import (
    DeviceInfo,
    Knobs,
    MemoryProbe,
    ProbeReport,
    ProbeStep,
    TrialResult,
    TrialSpec,
    WorkloadSpec,
)
from autotune.errors import ConfigError
from autotune.serialize import from_json_dict, to_json_dict
from autotune.units import GIB, MIB, format_bytes, parse_budget, parse_bytes


@pytest.mark.parametrize(("text", "expected"), [
    ("1.5GiB", int(1.5 * GIB)),
    ("800MB", 800 * 1000**2),
    ("800MiB", 800 * MIB),
    ("2147483648", 2147483648),
    (" 2 gib ", 2 * GIB),
    ("1k", 1000),
    ("0.5KiB", 512),
    ("24GB", 24 * 1000**3),
    ("1TiB", 1024**4),
    (".5MiB", MIB // 2),
])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("0", "is zero"),
    ("0GiB", "is zero"),
    ("0.1", "is zero"),
    ("abc", "cannot read the memory size 'abc'"),
    ("", "cannot read"),
    ("-1GiB", "cannot read"),
    ("12XB", "cannot read"),
    ("1.5.2G", "cannot read"),
    ("80%", "cannot read"),
])
def test_parse_bytes_rejects(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bytes(text)
    assert says in str(info.value)


def test_parse_budget() -> None:
    total = 16 * GIB
    assert parse_budget("80%", total) == int(total * 0.8)
    assert parse_budget(" 100% ", total) == total
    assert parse_budget("12.5%", total) == total // 8
    assert parse_budget("2GiB", total) == 2 * GIB


@pytest.mark.parametrize("text", ["150%", "0%", "-5%", "abc%", "%", "0", "abc", "garbage"])
def test_parse_budget_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_budget(text, 16 * GIB)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(("value", "expected"), [
    (None, "-"),
    (0, "0 B"),
    (512, "512 B"),
    (1536, "1.50 KiB"),
    (3 * MIB, "3.00 MiB"),
    (3 * GIB, "3.00 GiB"),
    (5000 * GIB, "5000.00 GiB"),
    (-2048, "-2.00 KiB"),
])
def test_format_bytes(value: float | None, expected: str) -> None:
    assert format_bytes(value) == expected


def _round_trip(value: object) -> object:
    return from_json_dict(type(value), json.loads(json.dumps(to_json_dict(value))))


def test_trial_result_round_trip() -> None:
    result = TrialResult(status="ok", peak_bytes=123 * MIB, baseline_bytes=700 * MIB,
                         step_times_s=(0.5, 0.25, 0.75), first_loss=6.9, last_loss=6.8,
                         num_graphs=1, samples_per_step=8, tokens_per_sample=128, wall_s=3.5)
    back = _round_trip(result)
    assert back == result
    assert isinstance(back.step_times_s, tuple)
    assert back.median_step_s() == 0.5
    assert back.samples_per_s() == 16


def test_non_finite_floats_survive_json() -> None:
    result = TrialResult(status="non_finite", first_loss=float("nan"), last_loss=float("inf"))
    text = json.dumps(to_json_dict(result), allow_nan=False)  # strict JSON, no NaN literal
    back = from_json_dict(TrialResult, json.loads(text))
    assert math.isnan(back.first_loss)
    assert back.last_loss == float("inf")


def test_trial_spec_round_trip() -> None:
    spec = TrialSpec(workload=WorkloadSpec(kind="hf", target="gpt2", seq_len=256),
                     device="cpu", micro_batch=4,
                     knobs=Knobs(precision="bf16", compile_mode="default"),
                     memory_budget_bytes=2 * GIB, max_timed_s=None)
    assert _round_trip(spec) == spec


def test_probe_report_round_trip() -> None:
    mc = Knobs(precision="fp32", compile_mode="off")
    probe = MemoryProbe(
        knobs=mc, max_micro_batch=4, peak_bytes=60 * MIB, budget_bytes=100 * MIB,
        usable_bytes=90 * MIB, candidates=(1, 2, 4, 8),
        steps=(ProbeStep(micro_batch=8, status="oom", peak_bytes=None, fits=False),
               ProbeStep(micro_batch=4, status="ok", peak_bytes=60 * MIB, fits=True,
                         wall_s=2.5)),
        notes=("a note",))
    report = ProbeReport(
        workload=WorkloadSpec(), target_batch=8, world_size=1, headroom=0.1,
        budget_bytes=100 * MIB, probes=(probe,), skipped=("fp16 skipped",), allocator="x",
        device=DeviceInfo(device="cpu", name="test cpu", total_memory_bytes=8 * GIB,
                          available_memory_bytes=4 * GIB, supports_bf16=True,
                          supports_fp16=False, supports_tf32=False, notes=("n",)))
    back = _round_trip(report)
    assert back == report
    assert back.probes[0].steps[1].fits
    assert back.pairs(back.probes[0]) == ((1, 8), (2, 4), (4, 2))
    assert back.probes[0].margin_bytes() == 30 * MIB


def test_unknown_fields_are_an_error() -> None:
    data = to_json_dict(TrialResult(status="ok"))
    data["surprise"] = 1
    with pytest.raises(ConfigError, match="surprise"):
        from_json_dict(TrialResult, data)


def test_spread() -> None:
    assert TrialResult(status="ok", step_times_s=(1.0, 1.0)).spread() is None
    assert TrialResult(status="ok", step_times_s=(1.0, 1.0, 1.0)).spread() == 0
    assert TrialResult(status="ok", step_times_s=(1.0, 2.0, 3.0)).spread() == 1.0


def _steps(*mib: float, peak_mib: float | None = None) -> TrialResult:
    return TrialResult(status="oom", step_memory_bytes=tuple(int(m * MIB) for m in mib),
                       peak_bytes=None if peak_mib is None else int(peak_mib * MIB))


def test_leak_note_names_steady_growth_from_the_second_step() -> None:
    note = _steps(20, 24, 28, 32, 36, 40).leak_note()
    assert note == (
        "memory grew by 4.0 MiB every optimizer step (steps 2-6: 24.0 -> 40.0 MiB): the "
        "workload keeps tensors alive across steps (a leak: e.g. losses kept without .item() "
        "or .detach())")


@pytest.mark.parametrize("series", [
    (20, 24, 28),  # fewer than 3 steps after the first
    (20, 20, 20, 20, 20),  # flat
    (10, 30, 30, 30, 30),  # optimizer state at the first step, then flat
    (20, 24, 28, 27, 36),  # fell once: not a leak at every step
    (20, 20.5, 21, 21.5, 22),  # 0.5 MiB a step: under 1 MiB
], ids=["too-few", "flat", "optimizer-state", "fell-once", "small"])
def test_leak_note_is_none_without_steady_growth(series: tuple[float, ...]) -> None:
    assert _steps(*series).leak_note() is None


def test_leak_note_threshold_grows_with_the_peak() -> None:
    growing = (200, 204, 208, 212, 216)  # 4 MiB a step
    assert _steps(*growing, peak_mib=300).leak_note() is not None  # 1% of the peak: 3 MiB
    assert _steps(*growing, peak_mib=500).leak_note() is None  # 5 MiB


def test_step_memory_round_trips() -> None:
    result = _steps(1, 2, 3)
    assert from_json_dict(TrialResult, json.loads(json.dumps(to_json_dict(result)))) == result
