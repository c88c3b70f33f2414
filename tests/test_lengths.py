"""The lengths a workload declares (``autotune.lengths``): the file parser, the one
validation, the bucket lengths and the pad length of each shape policy (issue 48)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.errors import ConfigError
from autotune.lengths import (
    MAX_BUCKETS,
    MAX_LENGTHS_FILE_BYTES,
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


# A --lengths path that is not a small regular file is refused before it is read: a FIFO
# would wait for a writer forever, /dev/zero never ends (issue 61).


@pytest.mark.timeout(20)  # a regression waits on the FIFO: fail, do not hang the suite
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "lengths.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as info:
        read_lengths(fifo)
    assert str(info.value).startswith(
        f"--lengths {fifo}: {fifo} is a FIFO (named pipe), not a regular file; give a text "
        "file with one integer a line, or a JSON list")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("path", "kind"), [
    ("/dev/zero", "a character device"), ("folder", "a directory")])
def test_a_device_or_a_folder_is_refused_naming_what_is_there(tmp_path: Path, path: str,
                                                               kind: str) -> None:
    where = Path(path) if path.startswith("/") else tmp_path / path
    where.mkdir(exist_ok=True) if kind == "a directory" else None
    with pytest.raises(ConfigError, match=f"{where} is {kind}, not a regular file"):
        read_lengths(where)


def test_a_file_over_the_bound_is_refused_with_its_size_the_bound_and_the_fix(
        tmp_path: Path) -> None:
    big = tmp_path / "lengths.txt"
    with open(big, "wb") as file:  # sparse: costs no disk and, refused unread, no memory
        file.truncate(MAX_LENGTHS_FILE_BYTES + 1)
    with pytest.raises(ConfigError) as info:
        read_lengths(big)
    said = str(info.value)
    assert said.startswith(f"--lengths {big}: {big} holds {MAX_LENGTHS_FILE_BYTES + 1:,} "
                           f"bytes, over the limit of {MAX_LENGTHS_FILE_BYTES:,} bytes ")
    assert said.endswith("(128.00 MiB); a random sample of the lengths is enough to stand for "
                         f"their distribution: give one, e.g. shuf -n 1000000 {big} > "
                         "lengths-sample.txt")


def test_the_bound_is_on_the_bytes_read_too(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.lengths.MAX_LENGTHS_FILE_BYTES", 8)
    (tmp_path / "at.txt").write_text("1\n22\n333\n")  # 9 bytes
    with pytest.raises(ConfigError, match="holds 9 bytes, over the limit of 8 bytes"):
        read_lengths(tmp_path / "at.txt")
    (tmp_path / "at.txt").write_text("1\n22\n33\n")  # 8 bytes: read
    assert read_lengths(tmp_path / "at.txt") == (1, 22, 33)
    # A file whose size says 0 (procfs) and holds more: stopped one byte past the bound.
    with pytest.raises(ConfigError, match="status holds more than the limit of 8 bytes"):
        read_lengths("/proc/self/status")


def test_the_bound_holds_ten_million_lengths() -> None:
    assert 10_000_000 * len("12345,\n") <= MAX_LENGTHS_FILE_BYTES


# Integers from numpy are integers (issue 61): a length array read from a dataset's column.

integral_dtypes = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                   np.uint32, np.uint64])


@given(st.lists(st.integers(1, 127), min_size=1, max_size=50), integral_dtypes,
       st.sampled_from(["array", "list of scalars", "tuple of scalars"]))
def test_numpy_integers_are_integers(lengths: list[int], dtype: type, form: str) -> None:
    array = np.array(lengths, dtype=dtype)
    values = {"array": array, "list of scalars": list(array),
              "tuple of scalars": tuple(array)}[form]
    got = check_lengths(values, "Workload.lengths", worst=127)
    assert got == tuple(lengths) and all(type(n) is int for n in got)


@given(st.lists(st.integers(1, 100), min_size=1, max_size=20), st.integers(0, 19),
       st.sampled_from([np.float32(3.5), np.float64(7.25), 2.5, np.bool_(True), True,
                        np.array([5]), "7", np.int64(0), np.int32(-4), -3]))
def test_fractions_bools_and_non_positive_values_are_still_refused(
        lengths: list[int], at: int, bad: object) -> None:
    values: list[object] = list(np.array(lengths, dtype=np.int64))
    values.insert(min(at, len(values)), bad)
    said = (f"length {int(bad)} is not positive" if isinstance(bad, (int, np.integer))
            and not isinstance(bad, bool) else f"({type(bad).__name__}) is not an integer")
    with pytest.raises(ConfigError, match=re.escape(said)):
        check_lengths(values, "Workload.lengths")


@pytest.mark.parametrize(("bad", "said"), [
    (np.array([2.0, 3.5]), "np.float64(2.0) (float64) is not an integer"),
    (np.array([True, False]), "np.True_ (bool) is not an integer"),
    (np.array([[1, 2]]), "got ndarray of shape (1, 2); give a list of integers"),
    (np.array([4, 0], dtype=np.int64), "length 0 is not positive"),
    (np.array([], dtype=np.int64), "no lengths"),
])
def test_arrays_of_fractions_bools_zeros_or_two_dimensions_are_refused(bad: np.ndarray,
                                                                       said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        check_lengths(bad, "Workload.lengths")


def test_whole_floats_stay_refused_as_the_file_parser_refuses_them() -> None:
    with pytest.raises(ConfigError, match=r"np.float64\(4.0\) \(float64\) is not an integer"):
        check_lengths([np.float64(4.0)], "Workload.lengths")


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
