"""The mid-run out-of-memory fallback: ``Tuned.train_step(oom_fallback=True)`` and the
generated script's ``--oom-fallbacks``, against a real CPU allocator's error and a real cap."""

from __future__ import annotations

import errno
import logging
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune import fallback, step
from autotune.builtin_workloads import causal_lm_label_count
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError, OutOfMemoryFallbackError, WorkloadError
from autotune.oom_text import oom_cause
from autotune.trial_status import _OOM_MESSAGES, is_out_of_memory
from autotune.usage import Tuned
from autotune.workload import Workload
from tests.one_truth import GradRecorder, TinyLM, assert_same_grads, load_script
from tests.tuned_configs import REPO, small, subprocess_env, write

PER_DEVICE = 12
GROWING = WorkloadSpec(kind="file", target=f"{REPO / 'tests' / 'workloads_oom.py'}:workload")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def samples(n: int, seq_len: int = 6, seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    ids = torch.randint(1, 64, (n, seq_len))
    labels = ids.clone()
    labels[::3, seq_len // 2:] = -100  # label counts differ between micro-batches
    return {"input_ids": ids, "labels": labels}


def grows_above(fits: int) -> Workload:
    """TinyLM whose micro-batches above ``fits`` samples need more memory than any machine
    has: the CPU allocator's own error, raised in the forward once activations exist."""

    def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        value = model(**batch)
        if batch["input_ids"].shape[0] > fits:
            torch.empty(1 << 62, dtype=torch.uint8)
        return value

    return Workload(name="grows", build_model=TinyLM, make_batch=lambda m: samples(m),
                    loss=loss, count_loss_items=causal_lm_label_count)


def split(batch: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    return [{k: v[i:i + size] for k, v in batch.items()}
            for i in range(0, batch["input_ids"].shape[0], size)]


# ----------------------------------------------------------------------------------------------
# The pieces: the next micro-batch, the regrouping, the classifier (library = script).


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    path = tmp_path_factory.mktemp("script") / SCRIPT_NAME
    path.write_text(render_train_script(small()))
    return load_script(path)


@given(per_device=st.integers(1, 96), data=st.data())
def test_the_next_micro_batch_is_the_next_smaller_divisor(script: ModuleType, per_device: int,
                                                           data: st.DataObject) -> None:
    current = data.draw(st.sampled_from(divisors(per_device)))
    below = [d for d in divisors(per_device) if d < current]
    expected = below[-1] if below else 0
    assert fallback.smaller_micro_batch(per_device, current) == expected
    assert script.smaller_micro_batch(per_device, current) == expected
    # Ragged micro-batches (lengths differ) are split each on its own: it divides them too.
    assert fallback.smaller_micro_batch(per_device, current, [current]) == next(
        (d for d in reversed(below) if current % d == 0), 0)


@given(per_device=st.integers(1, 24), data=st.data())
def test_regrouped_micro_batches_hold_the_same_samples_in_order(script: ModuleType,
                                                                per_device: int,
                                                                data: st.DataObject) -> None:
    given_size = data.draw(st.sampled_from(divisors(per_device)))
    size = data.draw(st.sampled_from(divisors(per_device)))
    batch = samples(per_device)
    as_tuples = [(b["input_ids"], b["labels"]) for b in split(batch, given_size)]
    for regroup in (fallback.split_micro_batches, script.split_micro_batches):
        out = regroup(split(batch, given_size), size)
        assert [b["input_ids"].shape[0] for b in out] == [size] * (per_device // size)
        for key in batch:
            assert torch.equal(torch.cat([b[key] for b in out]), batch[key])
        tuples = regroup(as_tuples, size)
        assert torch.equal(torch.cat([t[1] for t in tuples]), batch["labels"])


def test_ragged_micro_batches_are_never_joined(script: ModuleType) -> None:
    batches = [samples(4, seq_len=6)["input_ids"], samples(4, seq_len=9)["input_ids"]]
    for regroup in (fallback.split_micro_batches, script.split_micro_batches):
        out = regroup(batches, 2)
        assert [tuple(b.shape) for b in out] == [(2, 6), (2, 6), (2, 9), (2, 9)]
    with pytest.raises(ConfigError, match="different shapes"):
        fallback.split_micro_batches(batches, 3)


_CPU_OOM = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate {} bytes. Error code 12 (Cannot allocate memory)")
_CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "79.19 GiB of which 1.06 GiB is free. Including non-PyTorch memory, ...")
_MESSAGES = st.one_of(
    st.sampled_from([*_OOM_MESSAGES, "CUDA Out Of Memory. Tried", "shape mismatch",
                     "DefaultCPUAllocator: can't allocate memory: you tried", "", _CUDA_OOM,
                     "CUDA out of memory. Tried to allocate 20.00 MiB.", "two\nlines"]),
    st.integers(0, 10**21).map(_CPU_OOM.format), st.text(max_size=300))


@st.composite
def exceptions(draw: st.DrawFn, depth: int = 2) -> BaseException:
    kind = draw(st.sampled_from(["runtime", "value", "memory", "torch_oom", "oserror"]))
    message = draw(_MESSAGES)
    exc: BaseException = {
        "runtime": lambda: RuntimeError(message), "value": lambda: ValueError(message),
        "memory": lambda: MemoryError(message),
        "torch_oom": lambda: torch.OutOfMemoryError(message),
        "oserror": lambda: OSError(draw(st.sampled_from([errno.ENOMEM, errno.ENOENT])), message),
    }[kind]()
    if depth and draw(st.booleans()):
        exc.__cause__ = draw(exceptions(depth - 1))
    return exc


def test_the_script_carries_the_one_classifier(script: ModuleType) -> None:
    assert script.OOM_MESSAGES == _OOM_MESSAGES


@given(exc=exceptions())
def test_the_script_classifies_as_the_library(script: ModuleType, exc: BaseException) -> None:
    assert script.is_out_of_memory(exc) == is_out_of_memory(exc)
    assert script.oom_cause(exc) == oom_cause(exc)


def test_a_fallback_says_what_ran_out_in_one_clause() -> None:
    # The allocator's three lines of source location and error code, said as what it could
    # not allocate (as a probe's progress line says it); another error as raised, one line.
    assert oom_cause(RuntimeError(_CPU_OOM.format(12582912))) == (
        "the CPU allocator could not allocate 12.00 MiB more")
    assert oom_cause(torch.OutOfMemoryError(_CUDA_OOM)) == (
        "CUDA out of memory: could not allocate 2.00 GiB more, 1.06 GiB free of 79.19 GiB")
    assert oom_cause(MemoryError("first\nsecond")) == "MemoryError: first"


# ----------------------------------------------------------------------------------------------
# The step: a real allocator error in the forward, the same gradients as the smaller micro-batch.


@settings(max_examples=6, deadline=None)
@given(data=st.data(), max_in_a_row=st.integers(1, 4))
def test_a_step_that_runs_out_of_memory_gives_the_smaller_micro_batchs_gradients(
        data: st.DataObject, max_in_a_row: int) -> None:
    micro_batch = data.draw(st.sampled_from(divisors(PER_DEVICE)[1:]))
    fits = data.draw(st.integers(1, micro_batch - 1))
    workload = grows_above(fits)
    batch = samples(PER_DEVICE)
    torch.manual_seed(0)
    model = TinyLM().double()
    tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=micro_batch,
                        accumulate_steps=PER_DEVICE // micro_batch))
    falling = [d for d in divisors(PER_DEVICE) if fits < d <= micro_batch]
    recorder = GradRecorder(model)
    if len(falling) > max_in_a_row:
        with pytest.raises(OutOfMemoryFallbackError, match=f"{max_in_a_row} fallbacks? in a row"):
            tuned.train_step(model, recorder, split(batch, micro_batch), workload,
                             oom_fallback=True, max_oom_fallbacks=max_in_a_row)
        assert not recorder.grads and all(p.grad is None for p in model.parameters())
        return
    loss = tuned.train_step(model, recorder, split(batch, micro_batch), workload,
                            oom_fallback=True, max_oom_fallbacks=max_in_a_row)
    smaller = max(d for d in divisors(PER_DEVICE) if d <= fits)
    reference = GradRecorder(model)
    reference_loss = step.train_step(model, reference, split(batch, smaller), workload,
                                     precision="fp32", device_type="cpu")
    assert_same_grads(recorder.grads, reference.grads)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-12, atol=0)
    assert tuned.fallback is not None and tuned.fallback.micro_batch == smaller
    assert tuned.fallback.fallbacks == len(falling)
    # The next step runs the smaller micro-batch at once, the micro-batches given as before.
    again = GradRecorder(model)
    tuned.train_step(model, again, split(batch, micro_batch), workload, oom_fallback=True,
                     max_oom_fallbacks=max_in_a_row)
    assert_same_grads(again.grads, reference.grads)
    assert tuned.fallback.fallbacks == len(falling) and tuned.fallback.in_a_row == 0


class NormedLM(TinyLM):
    """TinyLM with a BatchNorm over its embeddings: a forward changes its running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(16)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.tok(input_ids).transpose(1, 2)).transpose(1, 2)
        previous = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
        logits = self.head(torch.tanh(self.mix(torch.cat([x, previous], dim=-1))))
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100)


def test_a_failed_attempt_leaves_no_running_statistics(script: ModuleType,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed attempt's forwards updated BatchNorm's running statistics: put back, the
    redo updates them as a step at the smaller micro-batch does (library and script)."""
    workload = grows_above(4)
    monkeypatch.setattr(script, "compute_loss", workload.compute_loss)
    monkeypatch.setattr(script, "count_loss_items", causal_lm_label_count)
    monkeypatch.setattr(script, "micro_batch", 6)
    batches = split(samples(PER_DEVICE), 6)
    torch.manual_seed(0)
    start = NormedLM().double().state_dict()
    states = {}
    for name in ("reference", "library", "script"):
        model = NormedLM().double()
        model.load_state_dict(start)
        recorder = GradRecorder(model)
        if name == "reference":
            step.train_step(model, recorder, split(samples(PER_DEVICE), 4), workload,
                            precision="fp32", device_type="cpu")
        elif name == "library":
            Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2)).train_step(
                model, recorder, batches, workload, oom_fallback=True)
        else:
            script.OomFallback(3, "cpu", master=False).train_step(
                model, recorder, torch.amp.GradScaler("cpu", enabled=False), batches,
                torch.autocast("cpu", enabled=False))
        states[name] = {k: v for k, v in model.state_dict().items() if k.startswith("norm.")}
    assert int(states["reference"]["norm.num_batches_tracked"]) == 3
    for name in ("library", "script"):
        for key, value in states["reference"].items():
            torch.testing.assert_close(states[name][key], value, rtol=1e-12, atol=0)


def test_each_fallback_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2))
    with caplog.at_level(logging.WARNING, logger="autotune.fallback"):
        tuned.train_step(model, GradRecorder(model), split(samples(PER_DEVICE), 6),
                         grows_above(3), oom_fallback=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith(
        "out of memory at micro-batch 6 (the CPU allocator could not allocate ")
    assert "redoing the step with micro-batch 4 x 3 accumulation" in lines[0]
    assert "with micro-batch 3 x 4 accumulation" in lines[1]


def test_without_the_flag_an_out_of_memory_error_ends_the_step() -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2))
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        tuned.train_step(model, GradRecorder(model), split(samples(PER_DEVICE), 6),
                         grows_above(3))
    assert tuned.fallback is None


class StateTooLarge(torch.optim.SGD):
    """SGD whose first step allocates state no machine holds: the update runs out of memory."""

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        torch.empty(1 << 62, dtype=torch.uint8)


def test_an_out_of_memory_error_in_the_update_is_not_retried() -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2))
    with pytest.raises(OutOfMemoryFallbackError, match="out of memory in the optimizer's update"):
        tuned.train_step(model, StateTooLarge(model.parameters(), lr=0.1),
                         split(samples(PER_DEVICE), 6), grows_above(PER_DEVICE),
                         oom_fallback=True)
    assert tuned.fallback is not None and tuned.fallback.fallbacks == 0


def test_a_batch_without_tensors_and_a_bad_limit_are_said() -> None:
    with pytest.raises(WorkloadError, match="a batch of type dict holds none"):
        fallback.batch_size({"text": ["a", "b"]})
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ConfigError, match=re.escape(
                f"max_oom_fallbacks must be a whole number of at least 1, got {bad!r}")):
            fallback.OomFallback(bad)  # type: ignore[arg-type]


def test_the_fallbacks_used_up_are_said_with_the_setting_that_goes_on() -> None:
    """Issue 61: after N fallbacks in a row with smaller micro-batches still left, the error
    blamed the memory ("does not fit; lower the target batch") where raising N would have
    worked. It names the limit, the micro-batches left and the value that tries them all;
    that value does."""
    workload = grows_above(1)  # fits only at micro-batch 1: 6 -> 4 -> 3 -> 2 -> 1
    tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2))
    model = TinyLM().double()
    batches = split(samples(PER_DEVICE), 6)
    with pytest.raises(OutOfMemoryFallbackError) as info:
        tuned.train_step(model, GradRecorder(model), batches, workload, oom_fallback=True,
                         max_oom_fallbacks=1)
    message = str(info.value)
    assert message.startswith(
        "out of memory at micro-batch 4 (the CPU allocator could not allocate ")
    assert message.endswith(
        "1 fallback in a row used up (max_oom_fallbacks=1) with smaller micro-batches left to "
        "try (3, 2, 1): raise max_oom_fallbacks (max_oom_fallbacks=4 tries them all), or lower "
        "the micro-batch you split the batch into"), message
    assert "does not fit" not in message and "--oom-fallbacks" not in message
    tuned.train_step(model, GradRecorder(model), batches, workload, oom_fallback=True,
                     max_oom_fallbacks=4)
    assert tuned.fallback is not None and tuned.fallback.micro_batch == 1


def test_the_scripts_fallbacks_used_up_are_said_with_its_flag(script: ModuleType,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The generated script says the same of its own flag, ``--oom-fallbacks``."""
    workload = grows_above(1)
    monkeypatch.setattr(script, "compute_loss", workload.compute_loss)
    monkeypatch.setattr(script, "count_loss_items", causal_lm_label_count)
    monkeypatch.setattr(script, "micro_batch", 6)
    model = TinyLM().double()
    batches = split(samples(PER_DEVICE), 6)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with pytest.raises(SystemExit) as info:
        script.OomFallback(1, "cpu", master=True).train_step(
            model, GradRecorder(model), scaler, batches, torch.autocast("cpu", enabled=False))
    message = str(info.value.code)
    assert message.startswith(
        "out of memory at micro-batch 4 (the CPU allocator could not allocate ")
    assert message.endswith(
        "1 fallback in a row used up (--oom-fallbacks 1) with smaller micro-batches left to "
        "try (3, 2, 1): raise --oom-fallbacks (--oom-fallbacks 4 tries them all), or lower "
        "micro_batch at the top of this script"), message
    enough = script.OomFallback(4, "cpu", master=False)
    enough.train_step(model, GradRecorder(model), scaler, batches,
                      torch.autocast("cpu", enabled=False))
    assert enough.micro_batch == 1


def test_the_script_refuses_a_negative_oom_fallbacks(script: ModuleType,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 61: ``--oom-fallbacks -1`` ran without the fallback, where the library refuses a
    limit under 1: refused by its argument parser (exit 2) before anything starts."""
    monkeypatch.setattr(sys, "argv", ["train_autotuned.py", "--oom-fallbacks", "-1"])
    monkeypatch.setattr(script, "build_model", lambda: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as info:
        script.main()
    assert info.value.code == 2
    assert "--oom-fallbacks must be 0 (off) or more, got -1" in capsys.readouterr().err


def test_the_fallback_refuses_fsdp_at_once() -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2,
                        strategy="fsdp"))
    with pytest.raises(ConfigError, match="does not run under FSDP"):
        tuned.train_step(model, GradRecorder(model), split(samples(PER_DEVICE), 6),
                         grows_above(PER_DEVICE), oom_fallback=True)
    assert all(p.grad is None for p in model.parameters())


def test_the_scripts_fallback_gives_the_librarys_gradients(script: ModuleType,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    workload = grows_above(2)
    monkeypatch.setattr(script, "compute_loss", workload.compute_loss)
    monkeypatch.setattr(script, "count_loss_items", causal_lm_label_count)
    monkeypatch.setattr(script, "micro_batch", 6)
    torch.manual_seed(0)
    model = TinyLM().double()
    batches = split(samples(PER_DEVICE), 6)
    generated = GradRecorder(model)
    fall_back = script.OomFallback(3, "cpu", master=True)
    fall_back.train_step(model, generated, torch.amp.GradScaler("cpu", enabled=False), batches,
                         torch.autocast("cpu", enabled=False))
    library = GradRecorder(model)
    Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2)).train_step(
        model, library, batches, workload, oom_fallback=True)
    assert fall_back.micro_batch == 2
    assert_same_grads(generated.grads, library.grads)


# ----------------------------------------------------------------------------------------------
# train_autotuned.py under a real cap (RLIMIT_AS), its sequences growing mid-run.

CAP = {"OOM_CAP_MIB": "70", "MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072",
       "OMP_NUM_THREADS": "1"}
"""At 4096 tokens a micro-batch of 4 samples needs ~89 MiB in its forward, one of 2 ~49 MiB
for its whole step (measured, glibc with the mmap threshold fixed): the cap lies between."""


def run_script(folder: Path, micro_batch: int, *args: str, env: dict[str, str] | None = None,
               ranks: int = 1) -> subprocess.CompletedProcess[str]:
    config = small(workload=GROWING, target_batch=8 * ranks, world_size=ranks,
                   micro_batch=micro_batch, accumulate_steps=8 // micro_batch)
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SCRIPT_NAME
    script.write_text(render_train_script(config))
    argv = [str(script), "--steps", "4", "--checkpoint", str(folder / "ck.pt"), *args]
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    return subprocess.run([sys.executable, *(launch if ranks > 1 else []), *argv], cwd=folder,
                          capture_output=True, text=True, env={**subprocess_env(), **(env or {})},
                          timeout=300)


def same_model(a: Path, b: Path) -> None:
    first, second = torch.load(a)["model"], torch.load(b)["model"]
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # the default run keeps the library's step under the same cap
@pytest.mark.subprocess
def test_the_script_survives_a_longer_sequence_under_a_real_cap(tmp_path: Path) -> None:
    long = {**CAP, "OOM_LONG": "4096"}
    capped = run_script(tmp_path / "capped", 4, env=long)
    assert capped.returncode == 0, capped.stdout + capped.stderr
    said = [line for line in capped.stdout.splitlines() if line.startswith("out of memory")]
    assert len(said) == 1, capped.stdout
    assert said[0].startswith(
        "out of memory at micro-batch 4 (the CPU allocator could not allocate ")
    assert "redoing the step with micro-batch 2 x 4 accumulation" in said[0]
    assert "training 4 steps of 8 samples" in capped.stdout
    # The same samples at micro-batch 2 from the start, uncapped: the same model at the end.
    smaller = run_script(tmp_path / "smaller", 2, env={"OOM_LONG": "4096"})
    assert smaller.returncode == 0, smaller.stdout + smaller.stderr
    same_model(tmp_path / "capped" / "ck.pt", tmp_path / "smaller" / "ck.pt")
    # Without the fallback the same run ends at the cap: the test has teeth.
    off = run_script(tmp_path / "off", 4, "--oom-fallbacks", "0", env=long)
    assert off.returncode != 0 and "can't allocate memory" in off.stderr


# slow: the script's fallbacks used up are said in this process
# (test_the_scripts_fallbacks_used_up_are_said_with_its_flag)
@pytest.mark.slow
@pytest.mark.subprocess
def test_the_script_stops_after_its_fallbacks_in_a_row(tmp_path: Path) -> None:
    result = run_script(tmp_path, 4, "--oom-fallbacks", "1",
                        env={**CAP, "OOM_LONG": "16384"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("out of memory at micro-batch 2 (the CPU allocator could not allocate "
            in result.stderr), result.stderr
    assert ("1 fallback in a row used up (--oom-fallbacks 1) with smaller micro-batches left to "
            "try (1): raise --oom-fallbacks (--oom-fallbacks 2 tries them all)"
            in " ".join(result.stderr.split())), result.stderr
    assert not (tmp_path / "ck.pt").exists()


@pytest.mark.subprocess
def test_the_script_says_what_to_do_when_the_update_runs_out_of_memory(tmp_path: Path) -> None:
    """Out of memory in the optimizer's update: a smaller micro-batch does not shrink it, so
    the script stops at once, exit 1 with the library's message (``OutOfMemoryFallbackError``),
    never a traceback, nothing half-written (issue 61)."""
    result = run_script(tmp_path, 4, env={"OOM_IN_UPDATE": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    said = result.stderr.strip().splitlines()[-1]
    assert said.startswith(
        "out of memory in the optimizer's update, which a smaller micro-batch does not shrink "
        "(the CPU allocator could not allocate "), said
    assert said.endswith("): free memory elsewhere, or shard the optimizer state (strategy "
                         "fsdp)"), said
    assert "redoing the step" not in result.stdout and not (tmp_path / "ck.pt").exists()


@pytest.mark.slow  # two gloo ranks: about 15 s each on a 2-core machine
@pytest.mark.parametrize("grow_from", ["16", "20"], ids=["first-micro-batch", "last-micro-batch"])
def test_two_ranks_move_together_when_one_runs_out_of_memory(tmp_path: Path,
                                                             grow_from: str) -> None:
    """Two gloo ranks under DDP, each capped; only rank 1's sequences grow, from its third
    step's first micro-batch (under no_sync) or its last (whose forward readies DDP's
    all-reduce on rank 0, which must not fire in the redo): both move to micro-batch 2, and
    the model is the one of a job at micro-batch 2 from the start."""
    long = {"OOM_LONG": "4096", "OOM_GROW_RANKS": "1", "OOM_GROW_FROM": grow_from}
    capped = run_script(tmp_path / "capped", 4, env={**CAP, **long}, ranks=2)
    assert capped.returncode == 0, capped.stdout + capped.stderr
    said = [line for line in capped.stdout.splitlines() if line.startswith("out of memory")]
    assert len(said) == 1, capped.stdout  # rank 0 says it, for both
    assert "another rank ran out of memory" in said[0]
    assert "redoing the step with micro-batch 2 x 4 accumulation" in said[0]
    smaller = run_script(tmp_path / "smaller", 2, env=long, ranks=2)
    assert smaller.returncode == 0, smaller.stdout + smaller.stderr
    same_model(tmp_path / "capped" / "ck.pt", tmp_path / "smaller" / "ck.pt")


# ----------------------------------------------------------------------------------------------
# docs/oom-fallback.md: its snippet runs.


def test_the_docs_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "docs" / "oom-fallback.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(snippets) == 1
    write(small(), tmp_path / "autotune.json")
    monkeypatch.chdir(tmp_path)
    exec(compile(snippets[0], "docs/oom-fallback.md", "exec"), {"__name__": "snippet"})
    assert capsys.readouterr().out.count("loss") == 3


# ----------------------------------------------------------------------------------------------
# Tuned.train_step(oom_fallback=True) under the same real cap, alone and on 2 DDP ranks.


# slow: two scripts, one under a real cap; the everyday run keeps the library's fallback and its
# gradients in this process and a real cap's out of memory in the generated script
# (test_the_script_says_what_to_do_when_the_update_runs_out_of_memory)
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_library_step_survives_a_longer_sequence_under_a_real_cap(tmp_path: Path,
                                                                      ranks: int) -> None:
    """Alone, every sequence grows at the third step; on 2 ranks only rank 1's, from its last
    micro-batch of that step. The model equals a run at micro-batch 2 from the start."""
    long = {"OOM_LONG": "4096", "OOM_GROW_RANKS": "1", "OOM_GROW_FROM": "20"} if ranks > 1 \
        else {"OOM_LONG": "4096"}
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    runs = {}
    for name, micro_batch, env in (("capped", 4, {**CAP, **long}), ("smaller", 2, long)):
        config = write(small(workload=GROWING, target_batch=8 * ranks, world_size=ranks,
                             micro_batch=micro_batch, accumulate_steps=8 // micro_batch,
                             strategy="ddp" if ranks > 1 else "none"),
                       tmp_path / f"{name}.json")
        runs[name] = subprocess.run(
            [sys.executable, *(launch if ranks > 1 else []), str(REPO / "tests" / "oom_tuned.py"),
             str(config), str(tmp_path / f"{name}.pt")], cwd=tmp_path, capture_output=True,
            text=True, env={**subprocess_env(), **env}, timeout=300)
        assert runs[name].returncode == 0, runs[name].stdout + runs[name].stderr
    assert "fallbacks 1, micro-batch 2" in runs["capped"].stdout
    assert "fallbacks 0, micro-batch 2" in runs["smaller"].stdout
    assert "redoing the step with micro-batch 2 x 4 accumulation" in runs["capped"].stderr
    same_model(tmp_path / "capped.pt", tmp_path / "smaller.pt")


@pytest.mark.slow  # two gloo ranks
def test_out_of_memory_in_ddps_last_backward_ends_the_job_with_what_happened(
        tmp_path: Path) -> None:
    """Rank 1 runs out of memory in its last micro-batch's backward, while rank 0 is inside
    DDP's gradient all-reduce: no rank can be told, so it says why and ends (rather than
    checking in with a collective rank 0 is not in: an abort on gloo, a hang on NCCL)."""
    env = {"OOM_LONG": "16", "OOM_GROW_RANKS": "1", "OOM_GROW_FROM": "20",
           "OOM_IN_BACKWARD": "1"}
    result = run_script(tmp_path, 4, env=env, ranks=2)
    assert result.returncode != 0
    assert "Received data size doesn't match" not in result.stdout + result.stderr
    assert "can't allocate memory" in result.stderr
    config = write(small(workload=GROWING, target_batch=16, world_size=2, micro_batch=4,
                         accumulate_steps=2, strategy="ddp"), tmp_path / "autotune.json")
    library = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(REPO / "tests" / "oom_tuned.py"), str(config), str(tmp_path / "model.pt")],
        cwd=tmp_path, capture_output=True, text=True, env={**subprocess_env(), **env},
        timeout=300)
    assert library.returncode != 0
    assert "Received data size doesn't match" not in library.stdout + library.stderr
    assert ("OutOfMemoryFallbackError: out of memory in the last micro-batch's backward "
            "(the CPU allocator could not allocate " in library.stderr), library.stderr
    assert "where DDP all-reduces the gradients" in library.stderr


def test_the_fallback_refuses_a_model_the_user_sharded_under_a_ddp_config() -> None:
    """A model sharded by ``fully_shard`` is found as sharded whatever the config says (the
    check reads the modules, no longer importing FSDP to do so: no module is sharded before
    FSDP is imported)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autotune.fallback import is_sharded

    model = TinyLM().double()
    assert not is_sharded(model)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        fully_shard(model)
        assert is_sharded(model)
        tuned = Tuned(small(target_batch=PER_DEVICE, micro_batch=6, accumulate_steps=2))
        with pytest.raises(ConfigError, match="does not run under FSDP"):
            tuned.train_step(model, GradRecorder(model), split(samples(PER_DEVICE), 6),
                             grows_above(PER_DEVICE), oom_fallback=True)
    finally:
        dist.destroy_process_group()
