"""A tuned compiled config survives data of varying length in every delivered path (issue 45).

The delivered config compiles with ``TunedConfig.compile_dynamic`` (None: torch's automatic
dynamic shapes): a real compiled Hugging Face causal LM fed batches of 30 random lengths
recompiles at most twice per frame and never runs a frame eager; where torch does hit its
recompile limit, a warning says so in one line with what to do.
"""

from __future__ import annotations

import collections
import sys
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo

from autotune import step
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.config import WorkloadSpec
from autotune.usage import RecompileLimitWarning, Tuned
from autotune.workload import Workload
from tests.test_codegen import import_script
from tests.tuned_configs import small

transformers = pytest.importorskip("transformers")


class _Compiles:
    """Dynamo's compiles of each frame (code object), counted as they start."""

    def __init__(self) -> None:
        self.per_frame: collections.Counter[str] = collections.Counter()

    def reset(self) -> None:
        """Dynamo reset (its compiled code and callbacks dropped), counting from 0 again."""
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        self.per_frame.clear()
        torch._dynamo.callback_handler.register_start_callback(self)

    def __call__(self, args: Any) -> None:
        from torch._dynamo.callback import CallbackTrigger

        if args.callback_trigger == CallbackTrigger.DYNAMO:  # not a lazy backward compile
            self.per_frame[str(args.compile_id).rpartition("/")[0]] += 1


@pytest.fixture
def compiles() -> Iterator[_Compiles]:
    """Dynamo reset before and after (no cache entries of another test), compiles counted."""
    counted = _Compiles()
    counted.reset()
    try:
        yield counted
    finally:
        torch._dynamo.reset()  # drops the callback too


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64,
                                     vocab_size=128, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.loss_type = "ForCausalLM"  # unset, its loss property warns (a graph break) each call
    return model.train()


def _lm_workload() -> Workload:
    return Workload(name="gpt2-varlen", build_model=_gpt2,
                    make_batch=lambda n: {"input_ids": torch.zeros(n, 8, dtype=torch.long)},
                    build_optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))


@pytest.mark.slow  # the default run keeps a tuned compiled config fed random lengths
# (test_shapes_tuned)
@pytest.mark.subprocess  # inductor compiles its kernels with the C++ compiler
def test_a_tuned_compiled_hf_lm_fed_random_lengths_recompiles_at_most_twice_per_frame(
        compiles: _Compiles) -> None:
    """Issue 45 (1): with ``dynamic=False`` each new length compiled again, the outer frame hit
    ``recompile_limit`` (8) and ran eager from then on, about 9x slower, silently."""
    cfg = Tuned(small(compile_mode="default", micro_batch=2, accumulate_steps=1,
                      target_batch=2))
    assert cfg.config.compile_dynamic is None and cfg.precision == "fp32"
    workload = _lm_workload()
    model = cfg.apply(workload.build_model())
    optimizer = cfg.build_optimizer(workload.make_optimizer(model.parameters()))
    compiled = cfg.compile(model)
    lengths = torch.randint(8, 65, (30,), generator=torch.Generator().manual_seed(45))
    assert len(set(lengths.tolist())) > 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileLimitWarning)
        for length in lengths.tolist():
            ids = torch.randint(0, 128, (cfg.micro_batch, length))
            loss = cfg.train_step(compiled, optimizer, [{"input_ids": ids, "labels": ids}],
                                  workload)
            assert torch.isfinite(loss)
    from torch._dynamo.utils import counters

    assert compiles.per_frame and max(compiles.per_frame.values()) <= 2, compiles.per_frame
    hits = [k for k in counters["unimplemented"] if "recompile limit" in k.lower()]
    assert not hits  # no frame fell back to eager


# slow: inductor compiles until the limit; the everyday run keeps how each entry point compiles
@pytest.mark.slow
@pytest.mark.subprocess
def test_a_recompile_limit_hit_is_said_in_one_line_with_what_to_do(
        compiles: _Compiles) -> None:
    """``compile_dynamic: false`` pins one static graph per shape: past the limit torch runs
    the frame eager, and the delivered path says so."""
    import torch._dynamo

    cfg = Tuned(replace(small(compile_mode="default"), compile_dynamic=False))
    compiled = cfg.compile(torch.nn.Linear(4, 2))
    with torch._dynamo.config.patch(recompile_limit=2), pytest.warns(
            RecompileLimitWarning) as said:
        for n in range(1, 5):
            compiled(torch.randn(n, 4))
    (line,) = [str(w.message) for w in said]
    assert "\n" not in line
    assert line.startswith("torch.compile hit its recompile_limit (2) in '")
    assert "runs eager from now on" in line and '"compile_dynamic": true' in line
    assert "torch._dynamo.config.recompile_limit" in line


@pytest.mark.subprocess
@pytest.mark.parametrize(("dynamic", "expected"), [
    (None, [1, 1, 1, 2, 2]),  # static at one shape (a trial's graphs), dynamic once one changes
    (True, [1, 1, 1, 1, 1]),
    (False, [1, 1, 1, 2, 3]),
])
def test_tuned_compile_and_trials_compile_as_compile_dynamic_says(
        compiles: _Compiles, dynamic: bool | None, expected: list[int]) -> None:
    """``Tuned.compile`` reads ``compile_dynamic``; the trials' ``step.compile_model`` default
    (None) compiles one static graph at their one shape, as ``dynamic=False`` would."""
    cfg = Tuned(replace(small(compile_mode="default"), compile_dynamic=dynamic))
    compiled = (cfg.compile(torch.nn.Linear(4, 2)) if dynamic is not None else
                step.compile_model(torch.nn.Linear(4, 2), "default"))
    seen = []
    with torch.no_grad():
        for n in (2, 2, 2, 3, 4):
            compiled(torch.randn(n, 4))
            seen.append(sum(compiles.per_frame.values()))
    assert seen == expected
    if dynamic is None:  # the delivered path: the same compiles as the trials'
        compiles.reset()
        delivered = Tuned(small(compile_mode="default")).compile(torch.nn.Linear(4, 2))
        with torch.no_grad():
            for n in (2, 2, 2, 3, 4):
                delivered(torch.randn(n, 4))
        assert sum(compiles.per_frame.values()) == 2


@pytest.mark.subprocess
def test_the_accelerate_plugin_compiles_with_compile_dynamic(compiles: _Compiles) -> None:
    """The Accelerate adapter's dynamo plugin carries the same field (the generated script's
    ``torch.compile`` call too: test_codegen); a real ``Accelerator(**kwargs)`` compiles the
    model it prepares with automatic dynamic shapes."""
    accelerate = pytest.importorskip("accelerate")
    for dynamic in (None, True, False):
        cfg = Tuned(replace(small(compile_mode="max-autotune-no-cudagraphs"),
                            compile_dynamic=dynamic))
        plugin = cfg.accelerator_kwargs()["dynamo_plugin"]
        # to_kwargs leaves out what is None: torch.compile's own default (automatic)
        assert plugin.to_kwargs().get("dynamic") is dynamic
        assert plugin.to_kwargs()["mode"] == "max-autotune-no-cudagraphs"
    try:
        accelerator = accelerate.Accelerator(**Tuned(small(compile_mode="default"))
                                             .accelerator_kwargs())
        prepared = accelerator.prepare(torch.nn.Linear(4, 2))
        with torch.no_grad():
            for n in (2, 3, 4, 5, 6):
                prepared(torch.randn(n, 4))
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    assert sum(compiles.per_frame.values()) == 2  # static, then one dynamic graph


VARLEN_WORKLOAD = '''
import torch

from autotune.builtin_workloads import TinyGPT
from autotune.workload import Workload


def batch(micro_batch):
    """Padded to the longest sequence of each batch: 8 to 64 tokens."""
    ids = torch.randint(0, 128, (micro_batch, int(torch.randint(8, 65, ()))))
    return {"input_ids": ids, "labels": ids}


def workload():
    return Workload(name="varlen", make_batch=batch, loss=lambda model, b: model(**b),
                    build_model=lambda: TinyGPT(vocab_size=128, seq_len=64, dim=32,
                                                num_layers=2, num_heads=2))
'''


@pytest.mark.subprocess
@pytest.mark.slow  # a minute of compiling; the script's compile call: test_codegen's literal test
def test_the_generated_loop_fed_random_lengths_recompiles_at_most_twice_per_frame(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        compiles: _Compiles) -> None:
    """``train_autotuned.py``'s own loop over a workload whose batches vary in length (its
    data hook: the workload's ``make_batch``), 30 steps in this process."""
    (tmp_path / "varlen.py").write_text(VARLEN_WORKLOAD)
    config = small(compile_mode="default", micro_batch=2, accumulate_steps=1, target_batch=2,
                   workload=WorkloadSpec(kind="file", target=f"{tmp_path / 'varlen.py'}:workload"))
    (tmp_path / SCRIPT_NAME).write_text(render_train_script(config, script_dir=tmp_path))
    script = import_script(tmp_path / SCRIPT_NAME)
    assert script.compile_dynamic is None
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [SCRIPT_NAME, "--steps", "30", "--log-every", "30"])
    script.main()
    out = capsys.readouterr().out
    assert "step 30/30" in out and "recompile limit" not in out
    assert compiles.per_frame and max(compiles.per_frame.values()) <= 2, compiles.per_frame


def test_the_generated_script_says_a_recompile_limit_hit_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The script's filter on torch's own record (the record as convert_frame logs it)."""
    import logging

    (tmp_path / SCRIPT_NAME).write_text(render_train_script(small(compile_mode="default")))
    script = import_script(tmp_path / SCRIPT_NAME)
    record = logging.LogRecord(
        "torch._dynamo.convert_frame", logging.WARNING, __file__, 1,
        "torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s",
        ("recompile_limit", 8, "'forward' (model.py:1)", "size mismatch"), None)
    assert script.RecompileLimitNote().filter(record) is True  # torch's own line stays
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("note: torch.compile hit its recompile limit: that code runs eager")
    assert "compile_dynamic = True" in line
    other = logging.LogRecord("torch._dynamo.convert_frame", logging.WARNING, __file__, 1,
                              "something else", (), None)
    assert script.RecompileLimitNote().filter(other) is True
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("dynamic", [None, True, False])
def test_trainer_is_told_a_pinned_compile_dynamic(dynamic: bool | None) -> None:
    """Trainer compiles with torch's automatic dynamic shapes (``dynamic=None``): a pinned
    ``compile_dynamic`` is named in the adapter's one warning, with the environment switch."""
    cfg = Tuned(replace(small(compile_mode="default", micro_batch=4, accumulate_steps=1),
                        compile_dynamic=dynamic))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg.training_arguments()
    said = [str(w.message) for w in caught if "compile_dynamic" in str(w.message)]
    if dynamic is None:
        assert not said
    else:
        value = str(dynamic).lower()
        (line,) = said
        assert f"compile_dynamic={value}: Trainer compiles with torch's automatic dynamic " \
            f"shapes; set ACCELERATE_DYNAMO_USE_DYNAMIC={value}" in line
