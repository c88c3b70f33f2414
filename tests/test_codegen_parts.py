"""train_autotuned.py carries only what its config runs (``autotune.codegen_parts``), and prints
its peak memory counted as the search counts it (``autotune.codegen_memory``)."""

from __future__ import annotations

import ast
import contextlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import api
from autotune.builtin_workloads import TinyGPT
from autotune.codegen import SCRIPT_NAME, render_train_script
from autotune.codegen_parts import select
from autotune.device.cpu import tensor_bytes
from tests.test_codegen import _variants, import_script
from tests.tuned_configs import make_tuned, small, subprocess_env


def variants() -> dict[str, object]:
    """test_codegen's variants and one of each part: compiled and fused, checkpointed, DDP,
    the compiler's budget, regional compilation under FSDP."""
    return {**_variants(),
            "eager_fp32": make_tuned(precision="fp32", compile_mode="off"),
            "compiled_fused": make_tuned(compile_mode="default", optimizer_impl="fused"),
            "ckpt": make_tuned(precision="fp32", compile_mode="off", checkpointing="blocks"),
            "ddp": make_tuned(compile_mode="off", strategy="ddp", world_size=2,
                              target_batch=128),
            "budget": make_tuned(compile_mode="default", checkpointing="budget-0.5"),
            "blocks_fsdp": make_tuned(compile_mode="max-autotune", compile_scope="blocks",
                                      strategy="fsdp", world_size=2, target_batch=128)}


class _Prune(ast.NodeTransformer):
    """Cuts each ``if`` whose test the script's literal values decide (``compile_mode != "off"``
    with ``compile_mode = "off"``): the code a run with these values can never reach."""

    def __init__(self, literals: dict[str, object]) -> None:
        self.literals = literals

    def visit_If(self, node: ast.If) -> object:
        self.generic_visit(node)
        try:
            taken = eval(compile(ast.Expression(node.test), "<test>", "eval"),
                         {"__builtins__": {}}, dict(self.literals))
        except Exception:  # a test of a run-time value: both branches can run
            return node
        return (node.body if taken else node.orelse) or ast.Pass()


def unreferenced_definitions(source: str) -> list[str]:
    """The script's top-level functions and classes that no code it can run names (outside
    their own bodies), once the branches its literal values decide are cut."""
    tree = ast.parse(source)
    literals = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):
                literals[node.targets[0].id] = ast.literal_eval(node.value)
    tree = _Prune(literals).visit(tree)
    defs = {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    unused = []
    for name, definition in defs.items():
        others = [node for node in tree.body if node is not definition]
        if not any(isinstance(sub, ast.Name) and sub.id == name
                   for node in others for sub in ast.walk(node)):
            unused.append(name)
    return unused


@pytest.mark.parametrize("name", sorted(variants()))
def test_each_variant_compiles_and_defines_only_what_it_runs(name: str, tmp_path: Path) -> None:
    source = render_train_script(variants()[name], script_dir=tmp_path)  # type: ignore[arg-type]
    compile(source, SCRIPT_NAME, "exec")
    assert unreferenced_definitions(source) == [], name


def test_a_plain_eager_script_has_no_compile_checkpointing_or_optimizer_rebuild() -> None:
    """fp32, eager, one device, the workload's optimizer: the knobs' code is the DDP wrap
    (torchrun runs any script as DDP) and the batch move; the fallback and the memory count
    stay (run-time options and output)."""
    source = render_train_script(make_tuned(precision="fp32", compile_mode="off"))
    defined = {node.name for node in ast.parse(source).body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for gone in ("find_blocks", "checkpoint_blocks", "compiler_recompute", "rebuild_optimizer",
                 "compile_model", "RecompileLimitNote", "device_name", "graphs_key",
                 "load_compile_artifacts", "compile_cache_counts"):
        assert gone not in defined, gone
    for kept in ("parallelize", "to_device", "train_step", "OomFallback", "PeakMemory", "main"):
        assert kept in defined, kept
    for unused in ("FSDPModule", "fully_shard", "inspect", "hashlib", "checkpoint"):
        assert not re.search(rf"^(import|from) .*\b{unused}\b", source, re.MULTILINE), unused
    assert "--oom-fallbacks" in source
    assert len(source.splitlines()) < 665  # 792 before issue 62; 658 with oom_cause (a
    # fallback says what the allocator could not allocate, 2026-11-30)


@pytest.mark.parametrize(("edit", "said"), [
    ('compile_mode = "default"', "compile_mode = 'default': this script was generated without"),
    ('checkpointing = "blocks"', "checkpointing = 'blocks': this script was generated without"),
    ('strategy = "fsdp"', "strategy = 'fsdp': this script was generated without"),
])
def test_a_value_whose_code_was_cut_stops_the_script_with_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str, said: str) -> None:
    """Set by hand to a value the script has no code for, a knob would do nothing: it says so."""
    source = render_train_script(small())
    knob = edit.split(" = ")[0]
    source = re.sub(rf"^{knob} = \S+", edit, source, count=1, flags=re.MULTILINE)
    (tmp_path / SCRIPT_NAME).write_text(source)
    script = import_script(tmp_path / SCRIPT_NAME)
    monkeypatch.setattr(sys, "argv", [SCRIPT_NAME, "--steps", "1"])
    with pytest.raises(SystemExit) as stopped:
        script.main()
    assert str(stopped.value).startswith(said)
    assert "re-run `autotune codegen`" in str(stopped.value)


def test_markers_pair_up_or_are_refused() -> None:
    text = "a\n#[if compiled]\nb\n#[else]\nc\n#[end]\nd"
    assert select(text, {"compiled": True}) == "a\nb\nd"
    assert select(text, {"compiled": False}) == "a\nc\nd"
    with pytest.raises(ValueError, match="without #\\[end\\]"):
        select("#[if compiled]\nb", {"compiled": True})
    with pytest.raises(ValueError, match="no such part"):
        select("#[if nothing]\nb\n#[end]", {"compiled": True})


@pytest.mark.subprocess
def test_the_default_script_prints_its_peak_memory_as_the_search_counts_it(
        tmp_path: Path) -> None:
    """A real run, CPU, fp32 eager, 2 steps: the peak with its unit, how it was counted and
    the peak the search measured beside it."""
    config = small()
    script = api.write_train_script(config, tmp_path)

    def run(env: dict[str, str]) -> str:
        result = subprocess.run([sys.executable, str(script), "--steps", "2", "--device", "cpu",
                                 "--out", str(tmp_path / "out")], cwd=tmp_path,
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    plain = {k: v for k, v in subprocess_env().items() if not k.startswith("MALLOC_")}
    # Without the search's allocator settings the line says so: glibc's defaults map more
    # (the default demo's loop: 152 MiB against the 107 MiB its search measured; 106 with
    # them), and a user comparing the two figures must know why they differ.
    assert re.search(
        r"as autotune counts it, but with glibc's default allocator, which maps more: the "
        r"search ran its children with MALLOC_ARENA_MAX=1 MALLOC_TRIM_THRESHOLD_=0, set them "
        r"to compare; autotune measured 1\.20 GiB on cpu\)$", run(plain), re.MULTILINE)
    out = run({**plain, "MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"})
    match = re.search(
        r"^peak memory (\d+\.\d\d) (KiB|MiB|GiB) \(address-space growth over the process's "
        r"baseline plus the model's tensors, as autotune counts it; autotune measured "
        r"1\.20 GiB on cpu\)$", out, re.MULTILINE)
    assert match, out
    peak = float(match.group(1)) * {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}[
        match.group(2)]
    model = TinyGPT(vocab_size=1024, seq_len=128, dim=128, num_layers=2, num_heads=4)
    assert peak > tensor_bytes(model)  # the model's tensors, and the training's growth on top
