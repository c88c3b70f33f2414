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
from autotune import api, knob_adapters, knobs, step
from autotune.builtin_workloads import TinyGPT
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.trial import train_step
from autotune.usage import Tuned
from autotune.workload import Workload
from tests import one_truth
from tests.tuned_configs import make_tuned, write

CKPT = ("activation_checkpointing" if knob_adapters._trainer_has_activation_checkpointing()
        else "gradient_checkpointing")
"""The TrainingArguments name of checkpointing in the installed transformers (renamed in 5)."""


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
    assert "micro_batch=16" in repr(cfg) and "bf16/default" in repr(cfg)
    assert cfg.knobs == Knobs(precision="bf16", compile_mode="default")


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist: run `autotune search`"),
    ("{not json", "is not valid JSON"),
    ('{"schema": 4}', "upgrade autotune"),
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
        step.set_matmul_precision("fp32")


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
                      train_step(model, optimizer, double, workload, precision="fp32",
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say when every knob has a keyword
        kwargs = Tuned(make_tuned(precision=precision, compile_mode=mode, micro_batch=64,
                                  accumulate_steps=1)).training_arguments()
    assert kwargs == {"per_device_train_batch_size": 64, "gradient_accumulation_steps": 1,
                      CKPT: False, "optim": "adamw_torch", **expected}


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("target", ["Trainer", "Accelerate"])
def test_cuda_graphs_with_accumulation_warn_that_trainer_and_accelerate_get_it_wrong(
        mode: str, target: str) -> None:
    cfg = Tuned(make_tuned(compile_mode=mode))  # 16 x 4
    with pytest.warns(UserWarning) as caught:
        if target == "Trainer":
            cfg.training_arguments()
        else:
            cfg.accelerator_kwargs()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"compile_mode={mode} with 4 micro-batches a step: {target}'s gradient " \
        "accumulation under CUDA graphs" in message, message
    assert "pytorch/pytorch#169545" in message and "cfg.train_step(...)" in message


@pytest.mark.parametrize("call", ["training_arguments", "accelerator_kwargs"])
def test_a_framework_warning_points_at_the_users_line(call: str) -> None:
    """The warning for what a framework cannot take names the user's own call, not a line
    inside autotune (``usage_frameworks`` does the work behind ``Tuned``'s methods)."""
    cfg = Tuned(make_tuned(compile_mode="reduce-overhead"))  # 16 x 4: CUDA graphs' warning
    with pytest.warns(UserWarning) as caught:
        getattr(cfg, call)()
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


def test_cuda_graphs_without_accumulation_and_accumulation_without_them_say_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tuned(make_tuned(compile_mode="reduce-overhead", micro_batch=64, accumulate_steps=1)
              ).training_arguments()
        Tuned(make_tuned(compile_mode="max-autotune-no-cudagraphs")).training_arguments()


def test_training_arguments_carry_checkpointing_and_the_fused_optimizer() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kwargs = Tuned(make_tuned(checkpointing="blocks", optimizer_impl="fused")
                       ).training_arguments()
    assert kwargs[CKPT] is True
    assert kwargs[f"{CKPT}_kwargs"]["use_reentrant"] is False
    assert kwargs[f"{CKPT}_kwargs"].get("every_n_layers", 1) == 1
    assert kwargs["optim"] == "adamw_torch_fused"


def test_training_arguments_warn_once_for_what_trainer_cannot_take() -> None:
    cfg = Tuned(make_tuned(checkpointing="alternate", memory_format="channels_last",
                           allocator="expandable_segments"))
    with pytest.warns(UserWarning) as caught:
        kwargs = cfg.training_arguments()
    assert len(caught) == 1
    message = str(caught[0].message)
    for knob in ("memory_format=channels_last", "allocator=expandable_segments"):
        assert knob in message, message
    assert caught[0].filename == __file__  # points at the caller's line
    assert kwargs[CKPT] is True
    if CKPT == "activation_checkpointing":  # Trainer checkpoints every second layer itself
        assert kwargs[f"{CKPT}_kwargs"]["every_n_layers"] == 2
        assert "checkpointing=alternate" not in message
    else:
        assert "checkpointing=alternate" in message


def _impl_trainer_builds(optimizer_kwargs: dict, device_type: str) -> str:
    """The implementation the AdamW that Trainer builds runs on the device: its flags, else
    torch's own choice (foreach with every parameter on CUDA, for-loop otherwise)."""
    if optimizer_kwargs.get("fused"):
        return "fused"
    if optimizer_kwargs.get("foreach") is not None:
        return "foreach" if optimizer_kwargs["foreach"] else "for-loop"
    return "foreach" if device_type == "cuda" else "for-loop"


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("impl", ["default", "for-loop", "foreach", "fused"])
def test_trainer_runs_the_tuned_optimizer_implementation_or_the_adapter_says_so(
        tmp_path: Path, impl: str, device_type: str) -> None:
    """Issue 45 (5): with ``default`` tuned, ``optim`` was left out, and Trainer ran its own
    default, ``adamw_torch_fused``, silently. Now the optimizer Trainer builds from the
    arguments runs the tuned implementation, or one warning names ``optimizer_impl``."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    device = replace(make_tuned().device, device="cuda:0" if device_type == "cuda" else "cpu")
    cfg = Tuned(make_tuned(optimizer_impl=impl, precision="fp32", compile_mode="off",
                           device=device))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = cfg.training_arguments()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          **kwargs)
    cls, optimizer_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args)
    assert cls is torch.optim.AdamW
    built = cls(torch.nn.Linear(2, 2).parameters(), **optimizer_kwargs)  # Trainer's optimizer
    runs = _impl_trainer_builds(optimizer_kwargs, device_type)
    said = [str(w.message) for w in caught if f"optimizer_impl={impl}" in str(w.message)]
    if impl == "default":  # the optimizer as built: no flags, torch's own choice
        assert not said and "fused" not in optimizer_kwargs and "foreach" not in optimizer_kwargs
        if device_type == "cpu":
            assert step.default_impl(built) == runs == "for-loop"
    elif runs == impl:
        assert not said
    else:
        (line,) = said
        assert "\n" not in line and f"optimizer_impl={impl}: Trainer's optim=adamw_torch " \
            f"runs torch's own loop ({runs} on {device_type})" in line
        assert "optimizer_cls_and_kwargs=(torch.optim.AdamW" in line


@pytest.mark.parametrize("tuned", [
    Knobs(), Knobs(precision="bf16", checkpointing="blocks", optimizer_impl="fused"),
    Knobs(precision="bf16", compile_mode="default", checkpointing="alternate",
          optimizer_impl="foreach"),
], ids=Knobs.label)
def test_training_arguments_are_accepted_by_transformers(tmp_path: Path, tuned: Knobs) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="TrainingArguments needs accelerate (pip install "
                        "-e .[dev])")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notes; transformers' renames
        kwargs = Tuned(make_tuned(knobs=tuned)).training_arguments()
        args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                              report_to=[], **kwargs)
    assert args.per_device_train_batch_size == 16 and args.gradient_accumulation_steps == 4
    assert bool(getattr(args, CKPT)) is (tuned.checkpointing != "off")
    assert args.bf16 is (tuned.precision == "bf16")
    assert args.torch_compile is (tuned.compile_mode != "off")
    if tuned.optimizer_impl == "fused":
        assert args.optim == "adamw_torch_fused"


@pytest.mark.parametrize("tuned", [
    Knobs(), Knobs(checkpointing="blocks", optimizer_impl="fused"),
    Knobs(precision="bf16", compile_mode="default", checkpointing="alternate",
          optimizer_impl="foreach", memory_format="channels_last"),
], ids=Knobs.label)
def test_accelerator_kwargs_are_accepted_by_accelerate(tuned: Knobs) -> None:
    accelerate = pytest.importorskip("accelerate")
    cfg = Tuned(make_tuned(knobs=tuned))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = cfg.accelerator_kwargs()
    notes = [str(w.message) for w in caught if "Accelerator keywords" in str(w.message)]
    assert len(notes) == (1 if tuned.changed() else 0)
    for name in tuned.changed():
        assert f"{name}={getattr(tuned, name)}" in notes[0]
    try:
        accelerator = accelerate.Accelerator(**kwargs)
        assert accelerator.gradient_accumulation_steps == 4
        assert accelerator.mixed_precision == {"bf16": "bf16"}.get(tuned.precision, "no")
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


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
        kwargs = Tuned(make_tuned(precision="fp16", compile_mode="max-autotune", micro_batch=64,
                                  accumulate_steps=1)).accelerator_kwargs()
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
        "backend": "inductor", "mode": "max-autotune-no-cudagraphs", "dynamic": None}
    assert "dynamo_backend" not in kwargs


STRATEGIES = ("ddp", "ddp-bucket-view", "fsdp", "fsdp-no-reshard")


def _notes(caught: list[warnings.WarningMessage], target: str) -> str:
    return " ".join(str(w.message) for w in caught if f"{target} keywords" in str(w.message))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_training_arguments_carry_the_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               strategy: str) -> None:
    """A real TrainingArguments takes the keywords on one CPU process, no process group needed
    (Trainer turns them into Accelerate's FSDP plugin only when it builds its Accelerator)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="TrainingArguments needs accelerate (pip install "
                        "-e .[dev])")
    from accelerate.utils import FullyShardedDataParallelPlugin

    # TrainingArguments(fsdp=True) sets FSDP_CPU_RAM_EFFICIENT_LOADING for the process: set
    # here so that monkeypatch restores it.
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    cfg = Tuned(make_tuned(knobs=Knobs(precision="bf16", strategy=strategy)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = cfg.training_arguments()
        args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                              report_to=[], **kwargs)
    notes = _notes(caught, "TrainingArguments")
    assert args.bf16 and args.per_device_train_batch_size == 16
    if strategy.startswith("fsdp"):
        assert args.fsdp is True and args.fsdp_config["version"] == 2
        plugin_args = args.fsdp_plugin_args
        assert plugin_args["fsdp_version"] == 2
        assert plugin_args["reshard_after_forward"] is (strategy == "fsdp")
        assert plugin_args["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"  # per block
        plugin = FullyShardedDataParallelPlugin(**plugin_args)  # as Trainer builds it
        assert plugin.fsdp_version == 2
        assert plugin.reshard_after_forward is (strategy == "fsdp")
        assert f"strategy={strategy} with bf16: Trainer's FSDP2 reduces gradients in bf16" in (
            notes)
    else:
        assert not args.fsdp and "fsdp" not in kwargs
    if strategy == "ddp-bucket-view":
        assert "strategy=ddp-bucket-view: TrainingArguments has no gradient_as_bucket_view" in (
            notes)
    if strategy == "ddp":
        assert notes == ""  # Trainer runs DDP under torchrun by itself


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accelerator_kwargs_carry_the_strategy(monkeypatch: pytest.MonkeyPatch,
                                               strategy: str) -> None:
    """A real Accelerator takes the keywords on one CPU process without a process group: it
    keeps the DDP handler and accepts the FSDP2 plugin (it shards only with several GPU
    ranks, so the plugin's own fields are checked)."""
    accelerate = pytest.importorskip("accelerate")
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    # Accelerator(fsdp_plugin=...) sets ACCELERATE_USE_FSDP=true for the process: set here so
    # that monkeypatch restores it.
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    cfg = Tuned(make_tuned(knobs=Knobs(precision="bf16", strategy=strategy)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = cfg.accelerator_kwargs()
    notes = _notes(caught, "Accelerator")
    assert "apply it with cfg.apply" not in notes  # the strategy is no model change
    try:
        accelerator = accelerate.Accelerator(**kwargs)
        assert accelerator.gradient_accumulation_steps == 4
        assert accelerator.mixed_precision == "bf16"
        bucket_view = accelerator.ddp_handler is not None and (
            accelerator.ddp_handler.gradient_as_bucket_view)
        assert bucket_view is (strategy == "ddp-bucket-view")
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    if strategy.startswith("fsdp"):
        plugin = kwargs["fsdp_plugin"]
        assert plugin.fsdp_version == 2
        assert plugin.reshard_after_forward is (strategy == "fsdp")
        assert plugin.auto_wrap_policy is transformer_auto_wrap_policy  # each block, then root
        assert "_no_split_modules" in notes and "transformer_cls_names_to_wrap" in notes
        assert "reduces gradients in bf16" in notes and "reduce_dtype=torch.float32" in notes
    else:
        assert "fsdp_plugin" not in kwargs
        assert notes == ""  # DDP under torchrun, with its handler where one is needed


def test_accelerator_kwargs_for_a_strategy_without_accelerate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "accelerate.utils", None)
    with pytest.warns(UserWarning, match="strategy=fsdp: accelerate is not installed"):
        kwargs = Tuned(make_tuned(precision="fp32", compile_mode="off", strategy="fsdp")
                       ).accelerator_kwargs()
    assert "fsdp_plugin" not in kwargs


# ----------------------------------------------------------------------------------------------
# The knobs that change the model, the optimizer and the batches


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes the forward keeps for backward (checkpointed blocks keep only their inputs)."""
    return one_truth.saved_bytes(lambda: model(ids, ids).backward())


def _tiny_gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab_size=64, seq_len=16, dim=32, num_layers=4, num_heads=4)


def test_apply_checkpoints_the_blocks() -> None:
    ids = torch.randint(0, 64, (2, 16))
    kept = {}
    grads = {}
    for setting in ("off", "alternate", "blocks"):
        model = _tiny_gpt()
        assert Tuned(make_tuned(checkpointing=setting)).apply(model) is model
        kept[setting] = saved_bytes(model, ids)
        grads[setting] = {n: p.grad for n, p in model.named_parameters()}
    assert kept["blocks"] < kept["alternate"] < kept["off"], kept
    for setting in ("alternate", "blocks"):  # recomputed, not changed
        for name, grad in grads["off"].items():
            torch.testing.assert_close(grads[setting][name], grad, msg=name)
    assert list(model.state_dict()) == list(_tiny_gpt().state_dict())  # names as they were


def test_apply_with_the_workloads_blocks() -> None:
    ids = torch.randint(0, 64, (2, 16))
    cfg = Tuned(make_tuned(checkpointing="blocks"))
    first_two, found = _tiny_gpt(), _tiny_gpt()
    cfg.apply(first_two, blocks=lambda m: list(m.blocks)[:2])
    cfg.apply(found)
    assert saved_bytes(found, ids) < saved_bytes(first_two, ids) < saved_bytes(_tiny_gpt(), ids)


def test_apply_refuses_a_model_without_blocks() -> None:
    with pytest.raises(knobs.KnobUnsupported, match="no repeated blocks"):
        Tuned(make_tuned(checkpointing="blocks")).apply(torch.nn.Linear(2, 2))


def test_apply_and_batch_channels_last() -> None:
    cfg = Tuned(make_tuned(memory_format="channels_last"))
    model = cfg.apply(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()))
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    images, labels = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    moved = cfg.batch((images, labels))
    assert moved[0].is_contiguous(memory_format=torch.channels_last) and moved[1] is labels
    assert Tuned(make_tuned()).batch((images, labels)) == (images, labels)


@pytest.mark.parametrize("impl", ["foreach", "for-loop"])
def test_build_optimizer_keeps_groups_and_hyperparameters(impl: str) -> None:
    model = _tiny_gpt()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    built = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                               {"params": rest, "weight_decay": 0.0, "lr": 3e-3}],
                              lr=1e-3, betas=(0.8, 0.95))
    rebuilt = Tuned(make_tuned(optimizer_impl=impl)).build_optimizer(built)
    assert type(rebuilt) is torch.optim.AdamW and rebuilt is not built
    assert [g["foreach"] for g in rebuilt.param_groups] == [impl == "foreach"] * 2
    assert [g["fused"] for g in rebuilt.param_groups] == [False, False]
    assert [(g["lr"], g["weight_decay"], g["betas"]) for g in rebuilt.param_groups] == [
        (1e-3, 0.1, (0.8, 0.95)), (3e-3, 0.0, (0.8, 0.95))]
    assert [[id(p) for p in g["params"]] for g in rebuilt.param_groups] == [
        [id(p) for p in g["params"]] for g in built.param_groups]
    assert Tuned(make_tuned()).build_optimizer(built) is built  # default: as built


def test_build_optimizer_refuses_what_the_class_lacks() -> None:
    sgd = torch.optim.LBFGS(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(knobs.KnobUnsupported, match="LBFGS cannot be rebuilt as foreach"):
        Tuned(make_tuned(optimizer_impl="foreach")).build_optimizer(sgd)
