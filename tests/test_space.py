"""space: micro-batch candidates and the memory classes a device can run."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.config import DeviceInfo, Knobs
from autotune.errors import ConfigError
from autotune.names import FLAGS, KEYWORDS
from autotune.space import (
    divisors,
    exact_target,
    is_cuda_graph_mode,
    memory_classes,
    per_device_batch,
    timed_precisions,
)
from autotune.units import GIB, MAX_BATCH

CPU = DeviceInfo(device="cpu", name="test cpu", total_memory_bytes=8 * GIB,
                 available_memory_bytes=4 * GIB, supports_bf16=True, supports_fp16=False,
                 supports_tf32=False, native_bf16=False)
CUDA = DeviceInfo(device="cuda:0", name="test gpu", total_memory_bytes=80 * GIB,
                  available_memory_bytes=79 * GIB, supports_bf16=True, supports_fp16=True,
                  supports_tf32=True, native_bf16=True)


@pytest.mark.parametrize(("n", "expected"), [
    (1, (1,)),
    (7, (1, 7)),
    (36, (1, 2, 3, 4, 6, 9, 12, 18, 36)),
    (48, (1, 2, 3, 4, 6, 8, 12, 16, 24, 48)),
    (64, (1, 2, 4, 8, 16, 32, 64)),
])
def test_divisors(n: int, expected: tuple[int, ...]) -> None:
    assert divisors(n) == expected


def test_divisors_brute_force() -> None:
    for n in range(1, 200):
        assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)


def test_per_device_batch() -> None:
    assert per_device_batch(64, 1) == 64
    assert per_device_batch(64, 4) == 16


@pytest.mark.parametrize(("target", "world", "says", "from_python"), [
    (0, 1, "--target-batch must be a positive number of samples, got 0",
     "target_batch must be a positive number of samples, got 0"),
    (-8, 1, "got -8", "got -8"),
    (8, 0, "--world-size must be at least 1, got 0", "world_size must be at least 1, got 0"),
    (10, 4, "--target-batch 10 does not split evenly over --world-size 4",
     "target_batch=10 does not split evenly over world_size=4"),
])
def test_per_device_batch_errors(target: int, world: int, says: str, from_python: str) -> None:
    """Each names the setting as the user wrote it: the CLI's flag, the API's keyword."""
    with pytest.raises(ConfigError) as info:
        per_device_batch(target, world, FLAGS)
    assert says in str(info.value)
    with pytest.raises(ConfigError) as info:
        per_device_batch(target, world, KEYWORDS)
    assert from_python in str(info.value) and "--" not in str(info.value)


def _labels(classes: tuple[Knobs, ...]) -> list[str]:
    return [c.label() for c in classes]


def test_cpu_defaults() -> None:
    classes, skipped = memory_classes(CPU)
    assert _labels(classes) == ["fp32/off", "bf16/off", "fp32/default", "bf16/default"]
    text = "\n".join(skipped)
    assert "precision tf32 skipped" in text
    assert "precision fp16 skipped" in text
    assert "max-autotune-no-cudagraphs not tried by default on CPU" in text
    assert "bf16 is emulated" in text


def test_a_search_times_emulated_bf16_only_when_asked() -> None:
    precisions, note = timed_precisions(CPU, None)
    assert precisions == ["fp32"]
    assert note == ("bf16 not timed: this CPU emulates it (many times slower than fp32); ask "
                    "for it with --precisions fp32,bf16",)
    assert timed_precisions(CPU, ["fp32", "bf16"]) == (["fp32", "bf16"], ())
    native = DeviceInfo(**{**CPU.__dict__, "native_bf16": True})
    assert timed_precisions(native, None) == (None, ())
    assert timed_precisions(CUDA, None) == (None, ())


def test_cpu_never_gets_cuda_graph_modes() -> None:
    classes, skipped = memory_classes(CPU, ["fp32"], ["off", "reduce-overhead", "max-autotune"])
    assert _labels(classes) == ["fp32/off"]
    assert sum("CUDA graphs need a CUDA device" in s for s in skipped) == 2
    assert not any(is_cuda_graph_mode(c.compile_mode) for c in classes)


def test_cuda_gets_everything() -> None:
    classes, skipped = memory_classes(CUDA)
    assert len(classes) == 4 * 5
    assert {c.compile_mode for c in classes} >= {"reduce-overhead", "max-autotune"}
    assert {c.precision for c in classes} == {"fp32", "tf32", "bf16", "fp16"}
    assert skipped == ()


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        memory_classes(CPU, ["fp8"], ["turbo"])
    message = str(info.value)
    assert "'fp8'" in message and "'turbo'" in message
    assert "fp32, tf32, bf16, fp16" in message
    assert "off, default, reduce-overhead, max-autotune-no-cudagraphs, max-autotune" in message


def test_nothing_supported_is_an_error() -> None:
    with pytest.raises(ConfigError, match="nothing to run on cpu"):
        memory_classes(CPU, ["fp16"])
    with pytest.raises(ConfigError, match="nothing to run on cpu"):
        memory_classes(CPU, ["fp32"], ["reduce-overhead"])


@pytest.mark.parametrize(("target", "world", "expected"), [
    (64, 1, 64), (64, 4, 64), (8, 3, 9), (10, 4, 8), (2, 4, 4),
])
def test_exact_target_picks_the_nearest_multiple_only_when_allowed(
        target: int, world: int, expected: int) -> None:
    assert exact_target(target, world, allow_inexact=True) == expected
    if target % world:
        with pytest.raises(ConfigError, match="--allow-inexact") as info:
            exact_target(target, world, name=FLAGS)
        assert str(expected) in str(info.value)
        with pytest.raises(ConfigError, match="pass allow_inexact=True to tune the nearest"):
            exact_target(target, world)
    else:
        assert exact_target(target, world) == target


# -- the batch limit: absurd counts refused where they are read, before any sum on them --------

_HUGE = st.one_of(st.integers(MAX_BATCH + 1, 10**40), st.integers(10**40, 10**400))


@settings(max_examples=30, deadline=None)
@given(huge=_HUGE)
def test_a_huge_target_world_or_micro_batch_is_refused_by_the_api(huge: int) -> None:
    """A target of 1e30 once hung search, probe, estimate and check in the parent (its
    divisors): refused at once, the value and the limit named."""
    from autotune import api

    calls = [
        lambda: exact_target(huge, 1),
        lambda: exact_target(huge, 3, allow_inexact=True),
        lambda: per_device_batch(64, huge),
        lambda: api.TuneRequest(target_batch=huge).validate(CPU),
        lambda: api.TuneRequest(target_batch=huge, world_size=huge).validate(CPU),
        lambda: api.estimate(micro_batch=huge, device_memory=GIB),
        lambda: api.estimate(micro_batch=2, target_batch=huge, device_memory=GIB),
    ]
    for call in calls:
        with pytest.raises(ConfigError, match=f"over the limit of {MAX_BATCH}"):
            call()


def test_the_largest_target_is_tuned_and_one_more_is_refused() -> None:
    assert per_device_batch(MAX_BATCH, 1) == MAX_BATCH and divisors(MAX_BATCH)[-1] == MAX_BATCH
    assert exact_target(MAX_BATCH - 1, 4, allow_inexact=True) == MAX_BATCH
    with pytest.raises(ConfigError, match=(
            f"--target-batch {MAX_BATCH + 1} is over the limit of {MAX_BATCH} \\(2\\*\\*20\\) "
            f"samples per optimizer step autotune tunes for; use at most {MAX_BATCH}")):
        per_device_batch(MAX_BATCH + 1, 1, FLAGS)
    with pytest.raises(ConfigError, match="over the limit"):
        exact_target(MAX_BATCH, 7, allow_inexact=True)  # the nearest exact one is over it
    with pytest.raises(ConfigError, match="target_batch a number of 301 digits"):
        per_device_batch(10**300, 1)


@settings(max_examples=8, deadline=None)
@given(huge=_HUGE)
def test_every_command_refuses_a_huge_count_with_exit_2(huge: int, tmp_path_factory:
                                                         pytest.TempPathFactory) -> None:
    from tests.test_cli import _invoke, _words
    from tests.tuned_configs import make_tuned, write

    folder = tmp_path_factory.mktemp("huge")
    config = write(make_tuned(), folder / "autotune.json")
    data = json.loads(config.read_text())
    data.update(target_batch=huge, micro_batch=huge, accumulate_steps=1, world_size=1)
    config.write_text(json.dumps(data))
    out = str(folder / "out")
    for args in (
        ["search", "--target-batch", str(huge), "--device", "cpu", "--out", out],
        ["probe", "--target-batch", str(huge), "--device", "cpu"],
        ["search", "--world-size", str(huge), "--device", "cpu", "--out", out],
        ["estimate", "--target-batch", str(huge)],
        ["estimate", "--micro-batch", str(huge)],
        ["check", str(config)],
    ):
        result = _invoke(*args)
        text = _words(result.output + (getattr(result, "stderr", "") or ""))
        assert result.exit_code == 2, (args, text)
        assert str(MAX_BATCH) in text, (args, text)
