"""The lengths a workload declares (``autotune.lengths``): the file parser, the one
validation, the bucket lengths and the pad length of each shape policy (issue 48)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.errors import ConfigError
from autotune.lengths import (
    MAX_BUCKETS,
    bucket_lengths,
    check_lengths,
    draw_batches,
    pad_length,
    parse_lengths,
    read_lengths,
)

lengths_st = st.lists(st.integers(1, 4096), min_size=1, max_size=200)


@given(lengths_st, st.booleans(), st.sampled_from(["\n", "\r\n"]))
def test_a_file_of_lengths_reads_back_as_written(lengths: list[int], as_json: bool,
                                                  newline: str) -> None:
    text = json.dumps(lengths) if as_json else newline.join(f" {n} " for n in lengths) + newline
    assert parse_lengths(text, "--lengths f") == tuple(lengths)


@given(lengths_st, st.integers(0, 199),
       st.sampled_from(["abc", "1.5", "1e3", "12 tokens", "0x10"]))
def test_a_line_that_is_not_an_integer_is_named_with_its_line(
        lengths: list[int], at: int, junk: str) -> None:
    lines = [str(n) for n in lengths]
    at = min(at, len(lines))
    lines.insert(at, junk)
    with pytest.raises(ConfigError, match=rf"line {at + 1} is '{junk}', not an integer"):
        parse_lengths("\n".join(lines), "--lengths f")


@pytest.mark.parametrize(("text", "said"), [
    ("", "no lengths"), ("\n\n# a comment\n", "no lengths"), ("[]", "no lengths"),
    ("3\n0\n5", "length 0 is not positive"), ("[4, -2]", "length -2 is not positive"),
    ("[1, 2.5]", "2.5 .float. is not an integer"), ('["7"]', "'7' .str. is not an integer"),
    ("[true]", "True .bool. is not an integer"), ('{"a": 1}', "got dict; give a list of integers"),
    ("[1, 2", "not a JSON list"), ("[1, 2", "line 1"),
])
def test_bad_lengths_are_refused_saying_what_and_the_fix(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as info:
        parse_lengths(text, "--lengths f.txt")
    assert str(info.value).startswith("--lengths f.txt: ")


def test_a_length_over_the_worst_case_names_both_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"length 300 is over the workload's worst case of "
                                          r"256 tokens; truncate"):
        check_lengths([12, 300, 8], "Workload.lengths", worst=256)


def test_an_unreadable_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        read_lengths(tmp_path / "missing.txt")
    (tmp_path / "l.txt").write_text("5\n7\n")
    assert read_lengths(tmp_path / "l.txt") == (5, 7)


@given(lengths_st, st.integers(1, 12), st.integers(1, 64), st.integers(0, 600))
def test_every_length_has_a_bucket_at_least_as_long_and_the_count_is_bounded(
        lengths: list[int], max_count: int, micro_batch: int, extra: int) -> None:
    worst = max(lengths) + extra
    buckets = bucket_lengths(lengths, max_count, micro_batch)
    assert 1 <= len(buckets) <= max_count
    assert list(buckets) == sorted(set(buckets))
    assert buckets[-1] == max(lengths)
    for n in lengths:
        padded = pad_length(n, "buckets", worst, buckets)
        assert padded >= n and padded in buckets
    assert bucket_lengths(list(reversed(lengths)), max_count, micro_batch) == buckets  # pure


@given(lengths_st, st.integers(1, 12), st.integers(1, 32))
def test_larger_micro_batches_move_the_buckets_toward_the_longest(
        lengths: list[int], max_count: int, micro_batch: int) -> None:
    # A micro-batch is padded to its longest sample: the more samples, the longer that is.
    one, more = (bucket_lengths(lengths, max_count, m) for m in (micro_batch, micro_batch + 1))
    assert min(more) >= min(one)


@given(lengths_st)
def test_the_default_bucket_count_stays_under_the_recompile_limit(lengths: list[int]) -> None:
    assert len(bucket_lengths(lengths)) <= MAX_BUCKETS < 8


@given(st.integers(1, 512), st.integers(0, 512))
def test_max_pads_to_the_worst_case_and_dynamic_keeps_the_length(length: int,
                                                                  extra: int) -> None:
    worst = length + extra
    assert pad_length(length, "max", worst) == worst
    assert pad_length(length, "dynamic", worst) == length


@given(lengths_st, st.integers(1, 16), st.integers(0, 10**6))
def test_the_draw_is_a_function_of_its_seed(lengths: list[int], micro_batch: int,
                                            seed: int) -> None:
    first = draw_batches(lengths, micro_batch, 5, seed)
    assert first == draw_batches(lengths, micro_batch, 5, seed)
    assert all(len(b) == micro_batch and set(b) <= set(lengths) for b in first)


@given(lengths_st, st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 10**6))
def test_every_micro_batch_of_one_effective_batch_sees_the_same_samples(
        lengths: list[int], micro_batch: int, seed: int) -> None:
    # A trial draws POOL_STEPS x per-device samples whatever its micro-batch: the candidates of
    # a search all time the same samples, grouped differently (the same real tokens).
    per_device = 16
    whole = [n for b in draw_batches(lengths, 1, per_device, seed) for n in b]
    grouped = draw_batches(lengths, micro_batch, per_device // micro_batch, seed)
    assert [n for b in grouped for n in b] == whole
