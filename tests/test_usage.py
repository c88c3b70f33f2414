"""autotune.load: errors for bad files and world sizes, helpers that apply the tuned knobs."""

from __future__ import annotations

import contextlib
import json
import sys
import types
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import autotune
from autotune import api, trial
from autotune.errors import ConfigError
from autotune.usage import Tuned
from autotune.workload import Workload
from tests.tuned_configs import make_tuned, write


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write(make_tuned(), tmp_path / "autotune.json")


def test_load_is_exported_lazily(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert autotune.load is api.load and "load" in autotune.__all__
    cfg = autotune.load(config_path)
    assert isinstance(cfg, autotune.Tuned)
    assert (cfg.micro_batch, cfg.accumulate_steps, cfg.precision, cfg.compile_mode) == (
        16, 4, "bf16", "default")
    assert "micro_batch=16" in repr(cfg)


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist: run `autotune search`"),
    ("{not json", "is not valid JSON"),
    ('{"schema": 2}', "upgrade autotune"),
    ('{"schema": 0}', "re-run `autotune search`"),
    ("[1, 2]", "not an autotune.json"),
])
def test_load_bad_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "autotune.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        api.load(path)
    assert info.value.exit_code == 2


def test_load_rejects_unknown_fields(config_path: Path) -> None:
    data = json.loads(config_path.read_text())
    data["micro_batch_size"] = 3
    config_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"micro_batch_size: got 3: unknown field"):
        api.load(config_path)


def test_load_checks_world_size(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"tuned for 1 device.*WORLD_SIZE=4.*--world-size 4"):
        api.load(config_path)
    assert api.load(config_path, world_size=1).micro_batch == 16  # explicit wins
    with pytest.raises(ConfigError, match=r"world_size=2.*effective batch would be 128"):
        api.load(config_path, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two'"):
        api.load(config_path)


def test_load_under_torchrun_world_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(make_tuned(world_size=2, micro_batch=8), tmp_path / "autotune.json")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert api.load(path).micro_batch == 8


def test_autocast_scaler_compile() -> None:
    bf16 = Tuned(make_tuned(precision="bf16", compile_mode="off"))
    assert isinstance(bf16.autocast(), torch.autocast) and bf16.grad_scaler() is None
    fp32 = Tuned(make_tuned(precision="fp32", compile_mode="off"))
    assert isinstance(fp32.autocast(), contextlib.nullcontext)
    fp16 = Tuned(make_tuned(precision="fp16"))
    scaler = fp16.grad_scaler()
    assert isinstance(scaler, torch.amp.GradScaler) and fp16.grad_scaler() is scaler
    model = torch.nn.Linear(2, 2)
    assert fp32.compile(model) is model
    compiled = fp16.compile(model)  # lazy: nothing compiles until it is called
    assert compiled is not model and compiled._orig_mod is model
    assert Tuned(make_tuned(), device_type="cuda").device_type == "cuda"
    assert Tuned(make_tuned(device=replace(make_tuned().device, device="cuda:1"))
                 ).device_type == "cuda"


def test_set_matmul_precision() -> None:
    try:
        Tuned(make_tuned(precision="tf32")).set_matmul_precision()
        assert torch.backends.cuda.matmul.allow_tf32
        Tuned(make_tuned(precision="bf16")).set_matmul_precision()
        assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        trial.set_matmul_precision("fp32")


def test_train_step_is_the_library_step() -> None:
    cfg = Tuned(make_tuned(precision="fp32", compile_mode="off"))
    workload = Workload(name="lin", build_model=lambda: torch.nn.Linear(3, 1),
                        make_batch=lambda m: (torch.randn(m, 3), torch.randn(m, 1)),
                        loss=lambda model, b: torch.nn.functional.mse_loss(model(b[0]), b[1]))
    torch.manual_seed(0)
    batches = [workload.make_batch(2) for _ in range(2)]
    losses, weights = [], []
    for use_cfg in (True, False):
        torch.manual_seed(1)
        model = workload.build_model().double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        double = [(x.double(), y.double()) for x, y in batches]
        losses.append(cfg.train_step(model, optimizer, double, workload) if use_cfg else
                      trial.train_step(model, optimizer, double, workload, precision="fp32",
                                       device_type="cpu"))
        weights.append(model.weight.detach().clone())
    assert torch.equal(losses[0], losses[1]) and torch.equal(weights[0], weights[1])


@pytest.mark.parametrize(("precision", "mode", "expected"), [
    ("fp32", "off", dict(bf16=False, fp16=False, tf32=False, torch_compile=False,
                         torch_compile_mode=None)),
    ("bf16", "default", dict(bf16=True, fp16=False, tf32=False, torch_compile=True,
                             torch_compile_mode=None)),
    ("fp16", "max-autotune", dict(bf16=False, fp16=True, tf32=False, torch_compile=True,
                                  torch_compile_mode="max-autotune")),
    ("tf32", "reduce-overhead", dict(bf16=False, fp16=False, tf32=True, torch_compile=True,
                                     torch_compile_mode="reduce-overhead")),
])
def test_training_arguments(precision: str, mode: str, expected: dict) -> None:
    kwargs = Tuned(make_tuned(precision=precision, compile_mode=mode)).training_arguments()
    assert kwargs == {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4,
                      **expected}


def test_training_arguments_are_accepted_by_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="TrainingArguments needs accelerate (pip install "
                        "-e .[dev])")
    kwargs = Tuned(make_tuned(precision="fp32", compile_mode="off")).training_arguments()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          **kwargs)
    assert args.per_device_train_batch_size == 16 and args.gradient_accumulation_steps == 4


def test_accelerator_kwargs_without_a_dynamo_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)  # as if not installed
    assert Tuned(make_tuned(precision="fp32", compile_mode="off")).accelerator_kwargs() == {
        "gradient_accumulation_steps": 4, "mixed_precision": "no"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Tuned(make_tuned(precision="bf16")).accelerator_kwargs() == {
            "gradient_accumulation_steps": 4, "mixed_precision": "bf16",
            "dynamo_backend": "inductor"}
    with pytest.warns(UserWarning, match="mode 'max-autotune'"):
        kwargs = Tuned(make_tuned(precision="fp16", compile_mode="max-autotune")
                       ).accelerator_kwargs()
    assert kwargs["mixed_precision"] == "fp16" and kwargs["dynamo_backend"] == "inductor"


def test_accelerator_kwargs_with_a_dynamo_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    class Accelerator:
        def __init__(self, gradient_accumulation_steps=1, mixed_precision=None,
                     dynamo_plugin=None) -> None:
            pass

    class TorchDynamoPlugin:
        def __init__(self, **kwargs) -> None:
            self.kwargs = kwargs

    fake = types.ModuleType("accelerate")
    fake.Accelerator = Accelerator
    fake_utils = types.ModuleType("accelerate.utils")
    fake_utils.TorchDynamoPlugin = TorchDynamoPlugin
    fake.utils = fake_utils
    monkeypatch.setitem(sys.modules, "accelerate", fake)
    monkeypatch.setitem(sys.modules, "accelerate.utils", fake_utils)
    kwargs = Tuned(make_tuned(compile_mode="max-autotune-no-cudagraphs")).accelerator_kwargs()
    assert kwargs["dynamo_plugin"].kwargs == {
        "backend": "inductor", "mode": "max-autotune-no-cudagraphs", "dynamic": False}
    assert "dynamo_backend" not in kwargs
