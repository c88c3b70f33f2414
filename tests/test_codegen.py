"""train_autotuned.py: its shape (golden file, ruff), its step (the one truth), and real runs."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from autotune import api, knob_adapters, knobs, step
from autotune.builtin_workloads import (
    TinyGPT,
    causal_lm_label_count,
    default_workload,
    load_workload,
)
from autotune.cli import app
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.names import FLAGS
from autotune.tuned_file import read_tuned
from autotune.usage import Tuned
from autotune.workload import Workload
from tests import one_truth
from tests.fsdp_step import STRATEGIES, ShardedLM
from tests.one_truth import (
    BlockLM,
    GradRecorder,
    StaticGradModel,
    TinyLM,
    assert_same_grads,
    full_batch_grads,
    static_grad_batches,
    token_batches,
)
from tests.tuned_configs import (
    REPO,
    make_tuned,
    my_workload_spec,
    small,
    subprocess_env,
    torchrun,
    write,
)

GOLDEN = Path(__file__).parent / "golden" / "train_autotuned_default.py"
REGEN = "AUTOTUNE_REGEN_GOLDEN"
"""Set to 1 to rewrite the golden file after an intended change: AUTOTUNE_REGEN_GOLDEN=1 pytest
tests/test_codegen.py -k golden, then review its diff."""


def import_script(path: Path) -> ModuleType:
    """Import a generated script by path (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(f"generated_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script_for(config: object, folder: Path) -> ModuleType:
    """The script rendered for ``config``, imported from ``folder``."""
    path = folder / SCRIPT_NAME
    path.write_text(render_train_script(config))  # type: ignore[arg-type]
    return import_script(path)


@pytest.fixture
def default_script(tmp_path: Path) -> ModuleType:
    return script_for(make_tuned(), tmp_path)


@pytest.fixture
def checkpointing_script(tmp_path: Path) -> ModuleType:
    """A config that checkpoints: its script carries find_blocks and checkpoint_blocks."""
    return script_for(make_tuned(checkpointing="blocks"), tmp_path)


# ----------------------------------------------------------------------------------------------
# Shape


def test_golden_default_script() -> None:
    text = render_train_script(make_tuned())
    if os.environ.get(REGEN) == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text, f"generated script changed: rerun with {REGEN}=1"


def test_header_gives_command_and_measured_reasons() -> None:
    text = render_train_script(make_tuned())
    assert "python train_autotuned.py --steps 100" in text
    assert "import autotune" not in text and "from autotune" not in text
    header = text.split("target_batch = 64")[0]
    for expected in ("micro_batch = 16: peak 1.20 GiB of 1.80 GiB usable",
                     "budget 2.00 GiB minus 10% headroom", "was 32",
                     "precision = bf16: 1,210.0 samples/s against 800.0",
                     "(1.51x)", "best other precision: fp32/default 32x2",
                     "accumulate_steps = 4: 64 / (16 per micro-batch x 1 device)",
                     "compiling took 12.3 s", "paid back after 456 optimizer steps"):
        assert expected in " ".join(header.replace("#", " ").split()), expected
    assert 'precision = "bf16"' in text and 'compile_mode = "default"' in text
    assert "torch.compile(model, mode=mode, dynamic=compile_dynamic)" in text
    assert 'getattr(model, "_orig_mod", model)' in text and "inner.no_sync()" in text


def test_every_knob_is_a_literal_the_script_uses() -> None:
    """Each knob of ``autotune.knobs.KNOBS`` is assigned once, as a literal, and read."""
    tuned = Knobs(precision="fp16", compile_mode="max-autotune", checkpointing="alternate",
                  optimizer_impl="fused", memory_format="channels_last",
                  allocator="expandable_segments", strategy="fsdp", shapes="buckets")
    lengths = WorkloadSpec(kind="hf", target="gpt2", lengths=(9, 70, 300))  # shapes: its lines
    tree = ast.parse(render_train_script(make_tuned(knobs=tuned, workload=lengths)))
    assigned = {node.targets[0].id: node.value for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    read = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    for knob in knobs.KNOBS:
        assert ast.literal_eval(assigned[knob.name]) == getattr(tuned, knob.name), knob.name
        assert knob.name in read, f"{knob.name} is set but never applied"


def test_a_huge_workload_name_renders_escaped_in_every_line_that_shows_it() -> None:
    # 4M characters, each escaped (an accent, a backslash, a quote), then a docstring's end:
    # one word of 13M characters for the comment block to cut into lines.
    name = 'é\\"' * 1_300_000 + '""" import os'
    source = render_train_script(make_tuned(workload_name=name))
    tree = ast.parse(compile(source, SCRIPT_NAME, "exec", ast.PyCF_ONLY_AST))
    assert f"Workload: {name}\n" in (ast.get_docstring(tree) or "")  # the name, as typed
    comments = [line for line in source.splitlines() if line.startswith("#")]
    assert all(len(line) <= 96 for line in comments)
    escaped = "".join(json.dumps(name)[1:-1].split())
    assert escaped in "".join("".join(line.lstrip("#") for line in comments).split())


def test_what_stopped_the_search_early_is_said() -> None:
    def header(**fields: object) -> str:
        return " ".join(line.lstrip("# ") for line in render_train_script(
            make_tuned(**fields)).splitlines() if line.startswith("#"))

    signal = header(interrupted=True, stopped_by="interrupted (Ctrl-C)")
    assert "The search stopped early (interrupted (Ctrl-C)): this is the best config" in signal
    limit = header(interrupted=True, stopped_by="--max-trials reached (60 child runs)")
    assert "stopped early (--max-trials reached (60 child runs))" in limit  # not "interrupted"
    assert "interrupted" not in limit
    assert "stopped early" not in header()


@pytest.mark.parametrize("dynamic", [None, True, False])
def test_compile_dynamic_is_a_literal_the_compile_call_reads(dynamic: bool | None) -> None:
    """``TunedConfig.compile_dynamic`` (None: torch's automatic dynamic shapes) is what the
    script compiles with, as ``Tuned.compile`` and the Accelerate plugin do
    (test_compile_shapes), and the header says which."""
    text = render_train_script(replace(make_tuned(), compile_dynamic=dynamic))
    tree = ast.parse(text)
    assigned = {node.targets[0].id: node.value for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    assert ast.literal_eval(assigned["compile_dynamic"]) is dynamic
    assert "torch.compile(model, mode=mode, dynamic=compile_dynamic)" in text
    header = " ".join(text.split("target_batch = 64")[0].replace("#", " ").split())
    assert f"(compile_dynamic = {dynamic}" in header


def test_header_lists_every_knob_with_value_and_measurement() -> None:
    config = make_tuned(checkpointing="blocks", optimizer_impl="fused")
    config = replace(config, memory=replace(config.memory, max_micro_batch={
        **config.memory.max_micro_batch, "bf16/default+ckpt=blocks+opt=fused": 64,
        "bf16/default+opt=fused": 16}))
    text = render_train_script(config)
    header = " ".join(text.split("target_batch = 64")[0].replace("#", " ").split())
    for expected in ("checkpointing = blocks: activation checkpointing of every repeated block; "
                     "the largest micro-batch that fit: 64 with it, 16 without",
                     "optimizer_impl = fused: optimizer rebuilt fused",
                     "memory_format = contiguous: contiguous tensors",
                     "allocator = default: the default CUDA allocator",
                     "strategy = none: one process, no process group"):
        assert expected in header, expected
    for line in ('checkpointing = "blocks"', 'optimizer_impl = "fused"',
                 'memory_format = "contiguous"', 'allocator = "default"', 'strategy = "none"'):
        assert f"\n{line}  # " in text, line


def _variants() -> dict[str, object]:
    hf = dict(workload=WorkloadSpec(kind="hf", target="some/model", seq_len=64))
    return {
        "default_cpu": make_tuned(),
        "default_cuda_fp16": make_tuned(device=replace(make_tuned().device, device="cuda:0"),
                                        precision="fp16", compile_mode="max-autotune"),
        "default_tf32_off": make_tuned(precision="tf32", compile_mode="off"),
        "hf_causal": make_tuned(**hf, workload_name="some/model (causal-lm, seq 64)"),
        "hf_masked": make_tuned(**hf, workload_name="some/model (masked-lm, seq 64)"),
        "hf_classifier_pretrained": make_tuned(
            workload=WorkloadSpec(kind="hf", target="m", pretrained=True),
            workload_name="m (classifier, seq 128)"),
        "hf_unknown_name": make_tuned(**hf, workload_name="renamed"),
        "file": make_tuned(workload=my_workload_spec(), workload_name="mlp-classifier"),
        "every_knob_set": make_tuned(checkpointing="alternate", optimizer_impl="fused",
                                     memory_format="channels_last",
                                     allocator="expandable_segments"),
        "fsdp_two_ranks": make_tuned(strategy="fsdp-no-reshard", world_size=2,
                                     target_batch=128),
        "hf_lengths_buckets": make_tuned(
            workload=WorkloadSpec(kind="hf", target="some/model", seq_len=64,
                                  lengths=tuple(range(1, 65)) * 3), shapes="buckets",
            workload_name="some/model (causal-lm, seq 64)"),
        "file_lengths_dynamic": make_tuned(workload=my_workload_spec(), shapes="dynamic"),
    }


@pytest.mark.subprocess
def test_generated_scripts_pass_ruff(tmp_path: Path) -> None:
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    for name, config in _variants().items():
        (tmp_path / f"{name}.py").write_text(render_train_script(config, script_dir=tmp_path))
    result = subprocess.run([ruff, "check", "--no-cache", "--config", str(REPO / "pyproject.toml"),
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hf_script_builds_the_workload_task() -> None:
    text = render_train_script(make_tuned(
        workload=WorkloadSpec(kind="hf", target="bert", pretrained=True),
        workload_name="bert (masked-lm, seq 128)"))
    assert "AutoModelForMaskedLM.from_pretrained(model_name)" in text
    assert 'model_name = "bert"' in text and "seq_len = 128" in text
    assert '(batch["labels"] != -100).sum()' in text


@pytest.mark.subprocess
@pytest.mark.slow  # 29 s; the default run keeps the default script's runs and the HF
# script's graphs key
def test_an_hf_script_parses_help_and_trains_offline(tmp_path: Path) -> None:
    """With no network (HF_HUB_OFFLINE=1, an empty HF cache) the script of a --model search
    answers --help, trains from a local config directory, and for a model it cannot find says
    what to do: the model's config is read when the model is built, never at import."""
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "tiny-gpt2"
    transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32,
                            n_positions=16).save_pretrained(model_dir)
    env = {**subprocess_env(), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}

    def run(target: str, *args: str) -> subprocess.CompletedProcess[str]:
        config = make_tuned(workload=WorkloadSpec(kind="hf", target=target, seq_len=8),
                            workload_name=f"{target} (causal-lm, seq 8)", micro_batch=2,
                            accumulate_steps=1, target_batch=2,
                            knobs=Knobs())  # eager: offline loading is the point, not compile
        script = tmp_path / SCRIPT_NAME
        script.write_text(render_train_script(config, script_dir=tmp_path))
        return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    shown = run("someone/not-cached", "--help")
    assert shown.returncode == 0 and "--steps" in shown.stdout, shown.stderr
    missing = run("someone/not-cached", "--steps", "1", "--device", "cpu")
    assert missing.returncode != 0
    assert "cannot load the config of 'someone/not-cached'" in missing.stderr, missing.stderr
    assert "a local directory holding its config.json" in missing.stderr
    trained = run(str(model_dir), "--steps", "1", "--device", "cpu")
    assert trained.returncode == 0, trained.stderr
    assert "step 1/1" in trained.stdout
    assert (tmp_path / "train_autotuned_out" / "checkpoint.pt").exists()  # --out's default


def test_an_hf_script_of_a_shipped_model_builds_its_config_offline(tmp_path: Path) -> None:
    """``--model gpt2`` searches offline from the config autotune ships: the script holds the
    same architecture, used when the HF cache does not have the model."""
    script = script_for(make_tuned(workload=WorkloadSpec(kind="hf", target="gpt2", seq_len=16),
                                   workload_name="gpt2 (causal-lm, seq 16)"), tmp_path)
    assert script.shipped_config["n_layer"] == 12 and script.shipped_config["n_embd"] == 768
    config = script.hf_config()
    assert (config.model_type, config.n_layer, config.vocab_size) == ("gpt2", 12, 50257)
    assert script_for(make_tuned(workload=WorkloadSpec(kind="hf", target="my/model"),
                                 workload_name="my/model (causal-lm, seq 8)"),
                      tmp_path).shipped_config is None


def test_file_workload_path_is_relative_beside_the_script(tmp_path: Path) -> None:
    beside = tmp_path / "wl.py"
    config = make_tuned(workload=WorkloadSpec(kind="file", target=f"{beside}:make"))
    assert 'Path(__file__).resolve().parent / "wl.py"' in render_train_script(
        config, script_dir=tmp_path)
    assert f'Path("{beside}")' in render_train_script(config, script_dir=tmp_path / "elsewhere")


def test_default_model_source_matches_the_library(default_script: ModuleType) -> None:
    sizes = dict(vocab_size=64, seq_len=16, dim=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    ours = TinyGPT(**sizes)
    torch.manual_seed(0)
    theirs = default_script.TinyGPT(**sizes)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, theirs.state_dict()[key]), key
    ids = torch.randint(0, 64, (3, 16))
    assert torch.equal(ours(ids, ids), theirs(ids, ids))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_default_model_sizes_match_the_library(tmp_path: Path, device: str) -> None:
    config = make_tuned(device=replace(make_tuned().device, device=device))
    path = tmp_path / SCRIPT_NAME
    path.write_text(render_train_script(config))
    script = import_script(path)
    with torch.device("meta"):
        ours = load_workload(WorkloadSpec(), device).build_model()
        theirs = script.build_model()
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [
        (n, p.shape) for n, p in theirs.named_parameters()]
    assert default_workload(device).tokens_per_sample == script.model_args["seq_len"]


# ----------------------------------------------------------------------------------------------
# One truth: the generated step, the library's step and one big batch give the same gradients.


@pytest.mark.parametrize("padded", [False, True], ids=["full-length", "padded"])
def test_generated_step_equals_library_step_and_one_big_batch(default_script: ModuleType,
                                                              padded: bool) -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    batches = token_batches(padded)
    disabled = torch.amp.GradScaler("cpu", enabled=False)

    generated = GradRecorder(model)
    loss = default_script.train_step(model, generated, disabled, batches, torch.autocast(
        "cpu", enabled=False))
    library = GradRecorder(model)
    workload = Workload(name="t", build_model=lambda: model, make_batch=lambda m: None,
                        loss=lambda m, b: m(**b), count_loss_items=causal_lm_label_count)
    library_loss = step.train_step(model, library, batches, workload, precision="fp32",
                                    device_type="cpu")
    full = full_batch_grads(model, batches, lambda m, b: m(**b))

    assert_same_grads(generated.grads, library.grads)
    assert_same_grads(generated.grads, full, float32_weights=True)
    torch.testing.assert_close(loss, library_loss)
    if padded:  # the case normalization is for: averaging the micro-batch means is wrong
        naive = GradRecorder(model)
        step.train_step(model, naive, batches, replace(workload, count_loss_items=None),
                         precision="fp32", device_type="cpu")
        assert not torch.allclose(naive.grads["tok.weight"], full["tok.weight"], rtol=1e-2)


def test_generated_step_with_a_file_workload(tmp_path: Path) -> None:
    path = tmp_path / SCRIPT_NAME
    path.write_text(render_train_script(make_tuned(workload=my_workload_spec()),
                                        script_dir=tmp_path))
    script = import_script(path)
    torch.manual_seed(0)
    model = script.build_model().double()
    batches = [(x.double(), y) for x, y in (script.get_batch(2) for _ in range(3))]
    generated = GradRecorder(model)
    script.train_step(model, generated, torch.amp.GradScaler("cpu", enabled=False), batches,
                      torch.autocast("cpu", enabled=False))
    library = GradRecorder(model)
    step.train_step(model, library, batches, script.workload, precision="fp32",
                     device_type="cpu")
    full = full_batch_grads(model, batches, script.compute_loss)
    assert_same_grads(generated.grads, library.grads)
    assert_same_grads(generated.grads, full, float32_weights=True)


# slow: two torchrun ranks; the everyday run keeps a job of two gloo ranks (test_ranks.py) and
# the generated step's normalization in one process
# (test_generated_step_equals_library_step_and_one_big_batch)
@pytest.mark.slow
@pytest.mark.subprocess
def test_generated_step_under_ddp_normalizes_over_all_ranks(default_script: ModuleType,
                                                           tmp_path: Path) -> None:
    """Two gloo ranks, two padded micro-batches each, different token counts per rank: the
    gradient is the one of all four micro-batches as one batch."""
    script = Path(default_script.__file__)
    result = torchrun(str(Path(__file__).parent / "ddp_step.py"), str(script), str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    torch.manual_seed(0)
    model = TinyLM().double()
    batches = token_batches(True, num_micro_batches=4)
    full = full_batch_grads(model, batches, lambda m, b: m(**b))
    for rank in range(2):
        assert_same_grads(torch.load(tmp_path / f"rank{rank}.pt"), full, float32_weights=True)
    # Normalizing per rank (each rank's own tokens) would be wrong here: the test has teeth.
    workload = Workload(name="t", build_model=TinyLM, make_batch=lambda m: None,
                        loss=lambda m, b: m(**b), count_loss_items=causal_lm_label_count)
    per_rank = []
    for rank in range(2):
        recorder = GradRecorder(model)
        step.train_step(model, recorder, batches[2 * rank:2 * rank + 2], workload,
                         precision="fp32", device_type="cpu")
        per_rank.append(recorder.grads["head.weight"])
    assert not torch.allclose((per_rank[0] + per_rank[1]) / 2, full["head.weight"], rtol=1e-2)


@pytest.mark.subprocess
@pytest.mark.slow
def test_generated_step_under_fsdp_gives_the_single_process_gradients(tmp_path: Path) -> None:
    """Two gloo ranks, the script's FSDP2 wrap (each block, then the root; resharded after
    forward or not) and its step, two padded micro-batches each, float64: the gradients
    gathered from the shards are the single-process step's over all four micro-batches."""
    script = tmp_path / SCRIPT_NAME  # an FSDP config's script: it carries the FSDP wrap
    script.write_text(render_train_script(make_tuned(strategy="fsdp", world_size=2,
                                                     target_batch=128)))
    result = torchrun(str(Path(__file__).parent / "fsdp_step.py"), str(script), str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    torch.manual_seed(0)
    model = ShardedLM().double()
    batches = token_batches(True, num_micro_batches=4)
    workload = Workload(name="t", build_model=ShardedLM, make_batch=lambda m: None,
                        loss=lambda m, b: m(**b), count_loss_items=causal_lm_label_count)
    single = GradRecorder(model)
    step.train_step(model, single, batches, workload, precision="fp32", device_type="cpu")
    full = full_batch_grads(model, batches, lambda m, b: m(**b))
    for strategy in STRATEGIES:
        for rank in range(2):
            grads = torch.load(tmp_path / f"{strategy}-rank{rank}.pt")
            assert_same_grads(grads, single.grads, float32_weights=True)
            assert_same_grads(grads, full, float32_weights=True)
    # Normalizing per rank (each rank's own tokens) would be wrong here: the test has teeth.
    per_rank = []
    for rank in range(2):
        recorder = GradRecorder(model)
        step.train_step(model, recorder, batches[2 * rank:2 * rank + 2], workload,
                         precision="fp32", device_type="cpu")
        per_rank.append(recorder.grads["head.weight"])
    assert not torch.allclose((per_rank[0] + per_rank[1]) / 2, full["head.weight"], rtol=1e-2)


# ----------------------------------------------------------------------------------------------
# The knobs: the script applies them as autotune.knobs does (the same blocks, gradients,
# optimizer groups, batch layout, allocator setting).


class SmallCNN(nn.Module):
    """Two runs of three same-type modules: conv stages and a (larger) head; the head wins."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
            *(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
              for _ in range(3)),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 64), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def saved_bytes(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes the forward keeps for backward (checkpointed blocks keep only their inputs)."""
    return one_truth.saved_bytes(lambda: model(**batch))


def block_names(model: nn.Module, blocks: list[nn.Module]) -> list[str]:
    names = {id(module): name for name, module in model.named_modules()}
    return [names[id(block)] for block in blocks]


@pytest.mark.parametrize("build", [
    lambda: TinyGPT(vocab_size=64, seq_len=16, dim=32, num_layers=3, num_heads=4), SmallCNN,
    lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)),  # no run of two
], ids=["tiny-gpt", "cnn", "none"])
def test_script_finds_the_library_blocks(checkpointing_script: ModuleType,
                                         build: object) -> None:
    model = build()  # type: ignore[operator]
    expected = {"TinyGPT": ["blocks.0", "blocks.1", "blocks.2"],
                "SmallCNN": ["head.0", "head.1", "head.2"], "Sequential": []}
    ours = block_names(model, step.find_blocks(model))
    assert ours == expected[type(model).__name__]
    assert block_names(model, checkpointing_script.find_blocks(model)) == ours


@pytest.mark.parametrize("tuned", [Knobs(checkpointing="blocks", optimizer_impl="foreach"),
                                   Knobs(checkpointing="alternate", optimizer_impl="for-loop")],
                         ids=Knobs.label)
def test_generated_knobs_equal_library_knobs(tmp_path: Path, tuned: Knobs) -> None:
    """The script's checkpointing and optimizer rebuild against ``autotune.knobs`` on a model
    with blocks: the same blocks checkpointed, the same gradients (as one big batch's), the
    same optimizer groups and the same step."""
    script = script_for(make_tuned(knobs=tuned), tmp_path)
    assert (script.checkpointing, script.optimizer_impl) == (tuned.checkpointing,
                                                             tuned.optimizer_impl)
    batches = token_batches(padded=True)
    workload = Workload(name="t", build_model=BlockLM, make_batch=lambda m: None,
                        loss=lambda m, b: m(**b), count_loss_items=causal_lm_label_count)

    def built() -> nn.Module:
        torch.manual_seed(0)
        return BlockLM().double()

    library, generated, plain = built(), built(), built()
    step.apply_to_model(library, tuned)
    script.checkpoint_blocks(generated, script.checkpointing, script.model_blocks)
    # Checkpointed for real, the same blocks: the forward keeps fewer bytes than without,
    # exactly as many as the library's.
    kept = {name: saved_bytes(model, batches[0]) for name, model in
            (("library", library), ("generated", generated), ("plain", plain))}
    assert kept["generated"] == kept["library"] < kept["plain"], kept

    library_grads, generated_grads = GradRecorder(library), GradRecorder(generated)
    step.train_step(library, library_grads, batches, workload, precision="fp32",
                     device_type="cpu")
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    no_autocast = torch.autocast("cpu", enabled=False)
    script.train_step(generated, generated_grads, disabled, batches, no_autocast)
    full = full_batch_grads(plain, batches, lambda m, b: m(**b))
    assert_same_grads(generated_grads.grads, library_grads.grads)
    assert_same_grads(generated_grads.grads, full, float32_weights=True)

    def adamw(model: nn.Module) -> torch.optim.Optimizer:
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                  {"params": rest, "weight_decay": 0.0, "lr": 3e-3}], lr=1e-3)

    ours = step.rebuild_optimizer(adamw(library), tuned.optimizer_impl)
    theirs = script.rebuild_optimizer(adamw(generated), script.optimizer_impl)
    assert type(theirs) is type(ours) and theirs.defaults == ours.defaults
    assert [{k: v for k, v in g.items() if k != "params"} for g in theirs.param_groups] == [
        {k: v for k, v in g.items() if k != "params"} for g in ours.param_groups]
    assert [g["foreach"] for g in theirs.param_groups] == [tuned.optimizer_impl == "foreach"] * 2
    assert [g["lr"] for g in theirs.param_groups] == [1e-3, 3e-3]
    step.train_step(library, ours, batches, workload, precision="fp32", device_type="cpu")
    script.train_step(generated, theirs, disabled, batches, no_autocast)
    for (name, ours_p), theirs_p in zip(library.named_parameters(), generated.parameters(),
                                        strict=True):
        torch.testing.assert_close(theirs_p, ours_p, rtol=1e-12, atol=1e-15, msg=name)


@pytest.mark.parametrize("setting", ["blocks", "alternate"])
def test_script_checkpoints_hf_layers_as_the_library(checkpointing_script: ModuleType,
                                                     setting: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=32,
                                     n_positions=16)

    def flags(apply: object) -> list[tuple[str, bool]]:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable
            apply(model)  # type: ignore[operator]
        return [(n, m.gradient_checkpointing) for n, m in model.named_modules()
                if hasattr(m, "gradient_checkpointing")]

    ours = flags(lambda m: step.apply_to_model(m, Knobs(checkpointing=setting)))
    assert [on for name, on in ours if name.startswith("transformer.h.")] == (
        [True, True, True] if setting == "blocks" else [True, False, True])
    assert flags(lambda m: checkpointing_script.checkpoint_blocks(m, setting, None)) == ours


def test_script_batches_and_model_channels_last_as_the_library(tmp_path: Path) -> None:
    tuned = Knobs(memory_format="channels_last")
    script = script_for(make_tuned(knobs=tuned), tmp_path)
    images, labels = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])

    def strides(batch: object) -> list[tuple[int, ...]]:
        tensors = (batch.values() if isinstance(batch, dict) else
                   batch if isinstance(batch, tuple) else [batch])
        return [t.stride() for t in tensors]  # type: ignore[union-attr]

    for batch in ((images, labels), {"x": images, "y": labels}, images):
        ours, theirs = step.apply_to_batch(batch, tuned), script.to_device(batch, "cpu")
        assert type(theirs) is type(ours) and strides(theirs) == strides(ours)
    assert script.to_device(images, "cpu").is_contiguous(memory_format=torch.channels_last)
    (tmp_path / "plain").mkdir()
    plain = script_for(make_tuned(), tmp_path / "plain")
    assert plain.to_device(images, "cpu").is_contiguous()


def test_script_sets_the_allocator_before_cuda(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """At import, before any CUDA call: the user's other settings kept, ours replacing theirs."""
    base = "max_split_size_mb:64,expandable_segments:False"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", base)
    script_for(make_tuned(allocator="expandable_segments"), tmp_path)
    tuned = Knobs(allocator="expandable_segments")
    assert {"PYTORCH_CUDA_ALLOC_CONF": os.environ["PYTORCH_CUDA_ALLOC_CONF"]} == (
        knob_adapters.child_environment(tuned, {"PYTORCH_CUDA_ALLOC_CONF": base})) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"}
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", base)
    (tmp_path / "default").mkdir()
    script_for(make_tuned(), tmp_path / "default")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == base  # the default allocator: untouched


# ----------------------------------------------------------------------------------------------
# Real runs, writing, the CLI


@pytest.mark.subprocess
@pytest.mark.parametrize("name", [
    # fp16 runs everyday in test_generated_script_writes_its_checkpoint_where_out_says_..., a
    # file workload in test_file_workload_is_imported_by_path: slow here
    pytest.param("default-fp16", marks=pytest.mark.slow),
    pytest.param("file-fp32", marks=pytest.mark.slow),
    # slow too: the everyday run keeps the default script's run (test_codegen_parts.py) and
    # checkpointing and foreach applied by the library step (test_estimate.py, test_knobs.py)
    pytest.param("default-ckpt-foreach", marks=pytest.mark.slow)])
def test_generated_script_runs(tmp_path: Path, name: str) -> None:
    config = {"default-fp16": small(precision="fp16"),
              "file-fp32": small(workload=my_workload_spec()),
              "default-ckpt-foreach": small(checkpointing="alternate",
                                            optimizer_impl="foreach")}[name]
    script = api.write_train_script(config, tmp_path)
    result = subprocess.run([sys.executable, str(script), "--steps", "2", "--checkpoint",
                             "ck.pt"], cwd=tmp_path, capture_output=True, text=True,
                            env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 2/2" in result.stdout
    saved = torch.load(tmp_path / "ck.pt")
    assert saved["step"] == 2 and saved["model"]
    assert not any(k.startswith("_orig_mod") for k in saved["model"])


@pytest.mark.subprocess
@pytest.mark.slow  # 21 s; the default run keeps the default script's real run (test_codegen_parts)
def test_generated_script_writes_its_checkpoint_where_out_says_not_in_the_working_tree(
        tmp_path: Path) -> None:
    # issue 45 item 8: checkpoint.pt landed in the user's working tree.
    work, out = tmp_path / "work", tmp_path / "runs" / "one"
    for folder in (tmp_path / "tuned", work):
        folder.mkdir()
    script = api.write_train_script(small(precision="fp16"), tmp_path / "tuned")
    result = subprocess.run([sys.executable, str(script), "--steps", "2", "--out", str(out)],
                            cwd=work, capture_output=True, text=True, env=subprocess_env(),
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 2/2" in result.stdout and f"saved {out / 'checkpoint.pt'}" in result.stdout
    saved = torch.load(out / "checkpoint.pt")
    assert saved["step"] == 2 and saved["model"]
    assert not any(k.startswith("_orig_mod") for k in saved["model"])
    assert list(work.iterdir()) == []
    assert sorted(p.name for p in script.parent.iterdir()) == [SCRIPT_NAME]
    # Without --out: a folder named for the script (.gitignore lists it).
    assert "(default: train_autotuned_out)" in " ".join(subprocess.run(
        [sys.executable, str(script), "--help"], cwd=work, capture_output=True, text=True,
        env=subprocess_env(), timeout=300).stdout.split())
    assert "train_autotuned_out/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.subprocess
@pytest.mark.parametrize("strategy", ["fsdp", "ddp-bucket-view"])
@pytest.mark.slow
def test_generated_script_runs_its_strategy_under_torchrun(tmp_path: Path,
                                                          strategy: str) -> None:
    """Two CPU ranks of the tuned strategy train 2 steps and save a full checkpoint that a
    plain model loads (FSDP: gathered from the shards on every rank, saved by rank 0)."""
    config = small(strategy=strategy, world_size=2, target_batch=8)
    script = api.write_train_script(config, tmp_path)
    result = torchrun(str(script), "--steps", "2", "--checkpoint", "ck.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "x 2 device(s), fp32" in result.stdout and f"strategy {strategy}, on cpu" in (
        result.stdout)
    assert "step 2/2" in result.stdout and "saved ck.pt" in result.stdout
    assert "note:" not in result.stdout  # run as tuned: 2 ranks under torchrun
    saved = torch.load(tmp_path / "ck.pt")
    assert saved["step"] == 2
    sizes = dict(vocab_size=1024, seq_len=128, dim=128, num_layers=2, num_heads=4)
    torch.manual_seed(1337)  # the script's seed: its initial weights
    initial = TinyGPT(**sizes).state_dict()
    model = TinyGPT(**sizes)
    model.load_state_dict(saved["model"])  # strict: every key, full shapes, plain tensors
    assert all(type(t) is torch.Tensor for t in saved["model"].values())
    trained = model.state_dict()
    assert all(torch.isfinite(t).all() for t in trained.values())
    assert not torch.equal(trained["blocks.0.fc.weight"], initial["blocks.0.fc.weight"])
    assert len(saved["optimizer"]["state"]) == len(list(model.parameters()))
    if strategy == "fsdp":  # full optimizer state, keyed by parameter name
        exp_avg = saved["optimizer"]["state"]["blocks.0.fc.weight"]["exp_avg"]
        assert exp_avg.shape == trained["blocks.0.fc.weight"].shape


# slow: the everyday run keeps an FSDP job of two ranks (test_ranks.py) and the generated DDP step
# under two ranks
@pytest.mark.slow
@pytest.mark.subprocess
def test_generated_fsdp_script_without_torchrun_says_so_and_runs_one_process(
        tmp_path: Path) -> None:
    script = api.write_train_script(small(strategy="fsdp", world_size=2, target_batch=8),
                                    tmp_path)
    result = subprocess.run([sys.executable, str(script), "--steps", "1", "--checkpoint",
                             "ck.pt"], cwd=tmp_path, capture_output=True, text=True,
                            env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("note: tuned for strategy fsdp over 2 processes; without torchrun this runs one "
            "process without a process group. Run it as: torchrun --nproc_per_node=2 "
            f"{SCRIPT_NAME}") in result.stdout
    assert "strategy none, on cpu" in result.stdout and "saved ck.pt" in result.stdout
    assert not any(k.startswith(("_orig_mod", "module.")) for k in torch.load(
        tmp_path / "ck.pt")["model"])


@pytest.mark.subprocess
@pytest.mark.slow
def test_compiled_script_saves_plain_keys(tmp_path: Path) -> None:
    script = api.write_train_script(small(compile_mode="default"), tmp_path)
    result = subprocess.run([sys.executable, str(script), "--steps", "2", "--checkpoint",
                             "ck.pt"], cwd=tmp_path, capture_output=True, text=True,
                            env=subprocess_env(), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    keys = torch.load(tmp_path / "ck.pt")["model"].keys()
    assert keys == TinyGPT(vocab_size=1024, seq_len=128, dim=128, num_layers=2,
                           num_heads=4).state_dict().keys()


def test_write_train_script_does_not_overwrite(tmp_path: Path) -> None:
    path = api.write_train_script(make_tuned(), tmp_path)
    assert path == tmp_path / SCRIPT_NAME and path.read_text().startswith('"""Train')
    path.write_text("mine")
    with pytest.raises(ConfigError, match="--force"):
        api.write_train_script(make_tuned(), path)
    assert path.read_text() == "mine"
    api.write_train_script(make_tuned(), path, force=True)
    assert path.read_text().startswith('"""Train')
    assert [p.name for p in tmp_path.iterdir()] == [SCRIPT_NAME]  # no temporary file left


runner = CliRunner()


def test_cli_codegen_writes_the_script(tmp_path: Path) -> None:
    config = write(make_tuned(), tmp_path / "autotune.json")
    result = runner.invoke(app, ["codegen", str(config), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / SCRIPT_NAME).is_file()
    again = runner.invoke(app, ["codegen", str(config), "--out", str(tmp_path / "out")])
    assert again.exit_code == 2 and "--force" in again.output
    forced = runner.invoke(app, ["codegen", str(config), "--out", str(tmp_path / "out"),
                                 "--force"])
    assert forced.exit_code == 0, forced.output


def test_cli_codegen_workload_override(tmp_path: Path) -> None:
    config = write(make_tuned(), tmp_path / "autotune.json")
    target = f"{REPO / 'examples' / 'my_workload.py'}:workload"
    result = runner.invoke(app, ["codegen", str(config), "--out", str(tmp_path),
                                 "--workload", target])
    assert result.exit_code == 0, result.output
    assert "my_workload.py" in (tmp_path / SCRIPT_NAME).read_text()
    bad = runner.invoke(app, ["codegen", str(config), "--out", str(tmp_path), "--force",
                              "--workload", "nofactory.py"])
    assert bad.exit_code == 2 and "file.py:factory" in bad.output


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist"), ("{not json", "not valid JSON"),
    ('{"schema": 99}', "upgrade autotune"), ('{"x": 1}', "no 'schema' field")])
def test_cli_codegen_bad_config(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "autotune.json"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["codegen", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / SCRIPT_NAME).exists()


# ----------------------------------------------------------------------------------------------
# Hostile or unusual values: text stays text, files import by path, paths are absolute.

WORKLOAD_FILE = '''
import torch
from torch import nn

from autotune import Workload
{helper_import}


class WideMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, HIDDEN)
        self.down = nn.Linear(HIDDEN, 8)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.down(nn.functional.gelu(self.up(x))), y)


def workload():
    return Workload(name="wide-mlp", build_model=WideMLP,
                    make_batch=lambda m: (torch.randn(m, 16, 8), torch.randn(m, 16, 8)),
                    loss=lambda model, batch: model(*batch))
'''


def _workload_file(folder: Path, name: str, *, helper: bool = False) -> Path:
    """``folder/name`` defining ``workload()`` (a tiny MLP); with ``helper``, it imports a
    module beside it (the generated script keeps the folder on sys.path; the library's import
    does not)."""
    folder.mkdir(parents=True, exist_ok=True)
    module = f"helper_{abs(hash(name))}"
    (folder / f"{module}.py").write_text("HIDDEN = 32\n")
    path = folder / name
    path.write_text(WORKLOAD_FILE.format(helper_import=f"from {module} import HIDDEN" if helper
                                         else "HIDDEN = 32"))
    return path


HOSTILE_NAMES = ['evil"""\nimport os\nos.system("touch PWNED")\n"""', "back\\x slash",
                 "%(prog)d \\N{x} \r#"]


def _script_for_name(tmp_path: Path, name: str) -> str:
    """The script ``autotune codegen`` writes for a config of workload ``name``, checked as
    text: the name only in the docstring, the imports right after it."""
    config = write(make_tuned(workload_name=name), tmp_path / "autotune.json")
    result = runner.invoke(app, ["codegen", str(config), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    source = (tmp_path / SCRIPT_NAME).read_text()
    tree = ast.parse(source)
    stored = read_tuned(config).workload_name  # control characters are escaped on save
    assert f"\nWorkload: {stored}\n" in ast.get_docstring(tree, clean=False)
    assert [type(node).__name__ for node in tree.body[:4]] == ["Expr", "Import", "Import",
                                                                "Import"]
    return source


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_workload_name_stays_text(tmp_path: Path, name: str) -> None:
    _script_for_name(tmp_path, name)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", [
    HOSTILE_NAMES[0],
    # slow: the same script run as the name above (its text checked everyday, above)
    *(pytest.param(name, marks=pytest.mark.slow) for name in HOSTILE_NAMES[1:])])
def test_a_script_for_a_hostile_name_runs_and_runs_nothing_else(tmp_path: Path,
                                                                 name: str) -> None:
    _script_for_name(tmp_path, name)
    run = subprocess.run([sys.executable, SCRIPT_NAME, "--help"], cwd=tmp_path,
                         capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("usage: train_autotuned.py")
    assert not (tmp_path / "PWNED").exists()


def test_hostile_hf_values_stay_literals() -> None:
    target = 'x")\nimport os\nos.system("touch PWNED")  #'
    text = render_train_script(make_tuned(
        workload=WorkloadSpec(kind="hf", target=target, seq_len=7),
        workload_name="m (masked-lm, seq 99999999999999999999)"))
    tree = ast.parse(text)
    assigned = {node.targets[0].id: node.value for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    assert ast.literal_eval(assigned["model_name"]) == target
    assert ast.literal_eval(assigned["seq_len"]) == 7  # the name's seq is no number: the spec's
    assert not any(isinstance(node, ast.Import) and node.names[0].name == "os"
                   for node in tree.body[10:])


@pytest.mark.subprocess
@pytest.mark.parametrize("file_name", [
    # slow, both: a workload file imported by path runs everyday in test_check.py's moved
    # checkout
    pytest.param("model.v2.py", marks=pytest.mark.slow),
    pytest.param("time.py", marks=pytest.mark.slow)])
def test_file_workload_is_imported_by_path(tmp_path: Path, file_name: str) -> None:
    """A dotted stem or a stdlib name broke ``import_module(stem)``; by path they run."""
    workload = _workload_file(tmp_path / "wl", file_name, helper=True)
    config = write(small(workload=api.workload_spec(workload=f"{workload}:workload")),
                   tmp_path / "autotune.json")
    out = tmp_path / "out"
    result = runner.invoke(app, ["codegen", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    run = subprocess.run([sys.executable, SCRIPT_NAME, "--steps", "2", "--checkpoint", "ck.pt"],
                         cwd=out, capture_output=True, text=True, env=subprocess_env(),
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 2/2" in run.stdout and "saved ck.pt" in run.stdout
    assert set(torch.load(out / "ck.pt")["model"]) == {"up.weight", "up.bias", "down.weight",
                                                       "down.bias"}


@pytest.mark.subprocess
def test_relative_workload_is_stored_absolute(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    workload = _workload_file(tmp_path / "project", "wl.py")
    monkeypatch.chdir(tmp_path / "project")
    spec = api.workload_spec(workload="wl.py:workload")
    assert spec == WorkloadSpec(kind="file", target=f"{workload.resolve()}:workload")
    config = write(small(workload=spec), tmp_path / "autotune.json")

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = runner.invoke(app, ["codegen", str(config), "--out", "out"])
    assert result.exit_code == 0, result.output
    assert f'workload_file = Path("{workload.resolve()}")' in (
        tmp_path / "elsewhere" / "out" / SCRIPT_NAME).read_text()
    checked = runner.invoke(app, ["check", str(config)])
    assert checked.exit_code == 0, checked.output

    workload.unlink()
    gone = runner.invoke(app, ["codegen", str(config), "--out", "out2"])
    assert gone.exit_code == 2
    assert (f"workload.target in {config} names the workload file {workload.resolve()}, which "
            "is not here (a relative path there counts from the folder of the autotune.json): "
            "pass --workload path/to/file.py:factory") in " ".join(gone.output.split())

    os.mkfifo(workload)  # never opened: reading it would wait for a writer forever
    fifo = runner.invoke(app, ["codegen", str(config), "--out", "out2"])
    assert fifo.exit_code == 2
    assert (f"names the workload file {workload.resolve()}, which is a FIFO (named pipe), not a "
            "regular file") in " ".join(fifo.output.split())
    assert not (tmp_path / "elsewhere" / "out2").exists()


def test_directory_as_workload_file_is_said(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        api.workload_spec(workload=f"{tmp_path}:workload")
    assert str(info.value).startswith(
        f"workload file '{tmp_path}' is a directory, not a Python file (from workload='")


def test_a_fifo_as_workload_file_is_said_never_opened(tmp_path: Path) -> None:
    """A FIFO named model.py once read "does not exist"; opened, it would wait forever."""
    fifo = tmp_path / "model.py"
    os.mkfifo(fifo)
    expected = (f"workload file '{fifo}' is a FIFO (named pipe), not a regular file (from "
                f"--workload {fifo}:workload): name the .py file that defines workload")
    with pytest.raises(ConfigError) as info:
        api.workload_spec(workload=f"{fifo}:workload", name=FLAGS)
    assert str(info.value) == expected
    with pytest.raises(ConfigError) as info:  # from Python: named as passed there
        api.workload_spec(workload=f"{fifo}:workload")
    assert f"(from workload='{fifo}:workload')" in str(info.value)
    result = CliRunner().invoke(app, ["probe", "--workload", f"{fifo}:workload",
                                      "--target-batch", "1", "--device", "cpu"])
    assert result.exit_code == 2 and expected in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_under_cuda_graphs_every_step_copies_the_first_micro_batchs_gradients(
        tmp_path: Path, mode: str) -> None:
    """A backward that writes its gradient into one reused buffer (what a CUDA graph replay
    does) corrupts accumulation unless the first micro-batch's gradients are copied out: the
    library's step, ``Tuned.train_step`` and the generated loop all copy under a CUDA-graph
    mode, and their gradients equal one big batch's; without the copy they do not."""
    batches = static_grad_batches()
    workload = Workload(name="static", build_model=StaticGradModel,
                        make_batch=lambda m: None, loss=StaticGradModel.loss)
    script = script_for(make_tuned(compile_mode=mode, micro_batch=4, accumulate_steps=3,
                                   target_batch=12, precision="fp32"), tmp_path)
    script.compute_loss, script.count_loss_items = StaticGradModel.loss, None
    torch.manual_seed(0)
    model = StaticGradModel()
    full = full_batch_grads(model, batches, StaticGradModel.loss)
    model.zero_grad(set_to_none=True)  # each step below ends so too

    library, corrupt, generated, tuned = (GradRecorder(model) for _ in range(4))
    step.train_step(model, library, batches, workload, precision="fp32", device_type="cpu",
                    cuda_graphs=True)
    step.train_step(model, corrupt, batches, workload, precision="fp32", device_type="cpu")
    script.train_step(model, generated, torch.amp.GradScaler("cpu", enabled=False), batches,
                      torch.autocast("cpu", enabled=False))
    Tuned(make_tuned(compile_mode=mode, precision="fp32")).train_step(
        model, tuned, batches, workload)

    assert_same_grads(library.grads, full, float32_weights=True)
    assert_same_grads(generated.grads, library.grads)
    assert_same_grads(tuned.grads, library.grads)
    # The hazard is real: without the copy the first micro-batch's gradient is lost.
    assert not torch.allclose(corrupt.grads["weight"], full["weight"], rtol=1e-3)


def test_without_cuda_graphs_the_generated_step_copies_nothing(tmp_path: Path) -> None:
    """The copy is for CUDA graphs only: under another mode the generated loop adopts the
    first gradient as autograd does (so this buffer-reusing model accumulates wrongly)."""
    batches = static_grad_batches()
    script = script_for(make_tuned(compile_mode="max-autotune-no-cudagraphs", micro_batch=4,
                                   accumulate_steps=3, target_batch=12, precision="fp32"),
                        tmp_path)
    script.compute_loss, script.count_loss_items = StaticGradModel.loss, None
    torch.manual_seed(0)
    model = StaticGradModel()
    full = full_batch_grads(model, batches, StaticGradModel.loss)
    model.zero_grad(set_to_none=True)
    generated = GradRecorder(model)
    script.train_step(model, generated, torch.amp.GradScaler("cpu", enabled=False), batches,
                      torch.autocast("cpu", enabled=False))
    assert not torch.allclose(generated.grads["weight"], full["weight"], rtol=1e-3)
