"""autotune export: DeepSpeed's, torchtitan's and Accelerate's own config files, each read back
by the tool's own parser where it installs here, every tuned value carried or said."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import (
    Any,
    get_args,
)

import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import ConfigError
from autotune.export import TARGETS, export_config, render
from autotune.knob_rules import skip_reason
from autotune.knobs import Allocator, Checkpointing, CompileMode, Knobs, MemoryFormat, OptimizerImpl
from autotune.schema import TunedConfig
from autotune.traits import BLOCK_CHECKPOINTING
from tests.tuned_configs import make_tuned, write

JOBS = {"none": dict(micro_batch=16, accumulate_steps=4, target_batch=64, world_size=1),
        "ddp": dict(micro_batch=2, accumulate_steps=4, target_batch=64, world_size=8,
                    nproc_per_node=4)}


def job(strategy: str = "none", **knobs: str) -> TunedConfig:
    shape = JOBS["none" if strategy == "none" else "ddp"]
    return make_tuned(**shape, strategy=strategy, **{"precision": "fp32",
                                                      "compile_mode": "off", **knobs})


KNOBS = st.fixed_dictionaries({
    "precision": st.sampled_from(["fp32", "tf32", "bf16", "fp16"]),
    "compile_mode": st.sampled_from(get_args(CompileMode)),
    "checkpointing": st.sampled_from(get_args(Checkpointing)),
    "optimizer_impl": st.sampled_from(get_args(OptimizerImpl)),
    "memory_format": st.sampled_from(get_args(MemoryFormat)),
    "allocator": st.sampled_from(get_args(Allocator)),
    "strategy": st.sampled_from(["none", "ddp", "ddp-bucket-view", "fsdp", "fsdp-no-reshard"]),
}).filter(lambda k: skip_reason(Knobs(**k), None) is None)  # budget-F: compiled only

CARRIED = {
    # Knob values each file carries in a field of its own (everything else must be a note).
    "deepspeed": lambda k: {"strategy"} if k.strategy in ("ddp", "fsdp") else set(),
    "torchtitan": lambda k: ({"optimizer_impl"}
                             | ({"checkpointing"} if k.checkpointing in BLOCK_CHECKPOINTING
                                else set())
                             | ({"precision"} if k.precision == "bf16" else set())
                             | ({"compile_mode"} if k.compile_mode == "default" else set())
                             | ({"strategy"} if k.strategy in ("ddp", "fsdp", "fsdp-no-reshard")
                                else set())),
    "accelerate": lambda k: ({"compile_mode"}
                             | ({"precision"} if k.precision in ("bf16", "fp16") else set())
                             | ({"strategy"} if k.strategy in ("ddp", "fsdp", "fsdp-no-reshard")
                                else set())
                             | ({"checkpointing"} if k.strategy.startswith("fsdp")
                                and k.checkpointing == "blocks" else set())),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=KNOBS, target=st.sampled_from(sorted(TARGETS)))
def test_every_tuned_knob_is_carried_or_said(knobs: dict[str, str], target: str) -> None:
    """Never dropped silently: each knob value beyond the default is in a field of the file
    or in a note naming it (and the notes are in the TOML/YAML file as comments)."""
    config = job(**knobs)
    result = render(config, target)
    carried = CARRIED[target](config.knobs)
    for name in config.knobs.changed():
        if name not in carried:
            assert any(note.startswith(f"{name}=") for note in result.notes), (name, result)
    if target != "deepspeed":
        assert all(f"# - {note}\n" in result.text for note in result.notes)


# --- DeepSpeed: its own config class -------------------------------------------------------

def deepspeed_reads(data: dict[str, Any]) -> Any:
    """``DeepSpeedConfig`` of the file. Without a process group it takes the world as 1, so a
    job's file is read without ``train_batch_size`` (DeepSpeed derives it) and that one is
    checked by DeepSpeed's own rule (micro x accumulation x world)."""
    config_cls = pytest.importorskip("deepspeed.runtime.config").DeepSpeedConfig
    return config_cls({k: v for k, v in data.items() if k != "train_batch_size"})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=KNOBS)
def test_deepspeed_reads_the_exported_json(knobs: dict[str, str]) -> None:
    config = job(**knobs)
    data = json.loads(render(config, "deepspeed").text)
    read = deepspeed_reads(data)
    assert (read.train_micro_batch_size_per_gpu, read.gradient_accumulation_steps) == (
        config.micro_batch, config.accumulate_steps)
    assert data["train_batch_size"] == config.target_batch == (
        config.micro_batch * config.accumulate_steps * config.world_size)
    assert read.bfloat16_config.enabled == (config.precision == "bf16")
    assert read.float16_config.enabled == (config.precision == "fp16")
    assert read.zero_optimization_stage == (3 if config.knobs.strategy.startswith("fsdp") else 0)
    assert ("activation_checkpointing" in data) == (
        config.knobs.checkpointing in BLOCK_CHECKPOINTING)


# --- Accelerate: its config loader and `accelerate launch`'s reading of it -----------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=KNOBS)
def test_accelerate_loads_the_exported_yaml(knobs: dict[str, str], tmp_path_factory) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    config = job(**knobs)
    path = tmp_path_factory.mktemp("accelerate") / "accelerate_config.yaml"
    path.write_text(render(config, "accelerate").text)
    loaded = load_config_from_file(str(path))  # raises on an unknown key
    assert loaded.num_processes == config.world_size
    assert loaded.mixed_precision == {"bf16": "bf16", "fp16": "fp16"}.get(config.precision, "no")
    args, *_ = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", str(path), "train.py"]))
    compiled = config.compile_mode != "off"
    assert args.dynamo_backend == ("INDUCTOR" if compiled else "no")
    if compiled:
        assert args.dynamo_mode == config.compile_mode
    sharded = config.knobs.strategy.startswith("fsdp")
    assert bool(args.use_fsdp) == sharded
    if sharded:
        assert args.fsdp_version == 2
        assert args.fsdp_reshard_after_forward == (config.knobs.strategy == "fsdp")


# --- torchtitan: its 0.2 ConfigManager where installed, its documented keys always ---------

DOCUMENTED = {  # torchtitan 0.2's JobConfig (torchtitan/config/job_config.py): section -> keys
    "training": {"local_batch_size", "global_batch_size", "mixed_precision_param",
                 "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components"},
    "optimizer": {"implementation"},
}
CHOICES = {("training", "mixed_precision_param"): {"bfloat16", "float32"},
           ("training", "mixed_precision_reduce"): {"float32"},
           ("parallelism", "fsdp_reshard_after_forward"): {"default", "always", "never"},
           ("activation_checkpoint", "mode"): {"selective", "full", "memory_budget", "none"},
           ("optimizer", "implementation"): {"for-loop", "foreach", "fused"}}


@settings(max_examples=60, deadline=None)
@given(knobs=KNOBS)
def test_torchtitan_toml_uses_its_documented_keys(knobs: dict[str, str]) -> None:
    config = job(**knobs)
    data = tomllib.loads(render(config, "torchtitan").text)
    for section, values in data.items():
        assert set(values) <= DOCUMENTED[section], section
        for key, value in values.items():
            if (section, key) in CHOICES:
                assert value in CHOICES[section, key], (section, key, value)
    training, parallel = data["training"], data["parallelism"]
    assert (training["local_batch_size"], training["global_batch_size"]) == (
        config.micro_batch, config.target_batch)
    degree = parallel["data_parallel_replicate_degree"] * parallel["data_parallel_shard_degree"]
    # torchtitan's accumulation: global / (local x data-parallel degree) = the tuned one.
    assert training["global_batch_size"] // (training["local_batch_size"] * degree) == (
        config.accumulate_steps)


def torchtitan_config_manager(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torchtitan 0.2's ConfigManager (the TOML reader), imported without the package's
    ``__init__``, which imports its models (triton: not on a CPU build of torch)."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("torchtitan is not installed (pip install tyro; pip install 'torchtitan<0.3' "
                    "--no-deps)")
    package = types.ModuleType("torchtitan")
    package.__path__ = list(spec.submodule_search_locations)
    monkeypatch.setitem(sys.modules, "torchtitan", package)
    for name in [n for n in sys.modules if n.startswith("torchtitan.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        manager = importlib.import_module("torchtitan.config.manager")
    except ImportError as exc:
        pytest.skip(f"torchtitan's config manager does not import here: {exc}")
    if not hasattr(manager.ConfigManager, "_maybe_load_toml"):
        pytest.skip("this torchtitan (0.3+) reads no TOML")
    return manager.ConfigManager


@pytest.mark.parametrize("knobs", [
    {},
    {"precision": "bf16", "compile_mode": "default", "checkpointing": "alternate",
     "optimizer_impl": "foreach", "strategy": "fsdp-no-reshard"},
    {"precision": "fp16", "checkpointing": "blocks", "strategy": "ddp"},
])
def test_torchtitan_reads_the_exported_toml(knobs: dict[str, str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    manager = torchtitan_config_manager(monkeypatch)
    config = job(**knobs)
    path = tmp_path / "torchtitan.toml"
    path.write_text(render(config, "torchtitan").text)
    read = manager().parse_args(["--job.config_file", str(path)])
    assert (read.training.local_batch_size, read.training.global_batch_size) == (
        config.micro_batch, config.target_batch)
    assert read.compile.enable == (config.compile_mode != "off")
    assert read.activation_checkpoint.mode == {"off": "none", "blocks": "full",
                                               "alternate": "selective"}[config.knobs.checkpointing]


# --- the command -----------------------------------------------------------------------------

def test_export_writes_each_file_and_refuses_to_overwrite(tmp_path: Path) -> None:
    """Issue 50: DeepSpeed/torchtitan/Accelerate users copied the numbers by hand. The
    command writes each tool's file (notes on stderr), atomically; an existing file is kept
    (exit 2) unless --force."""
    tuned = job("ddp", precision="bf16", memory_format="channels_last")
    source = write(tuned, tmp_path / "autotune.json")
    runner = CliRunner()
    for target, name in TARGETS.items():
        out = tmp_path / name
        done = runner.invoke(app, ["export", str(source), "--to", target, "-o", str(out)])
        assert done.exit_code == 0, done.output
        assert out.read_text() == render(tuned, target).text
        assert f"wrote {out}" in done.output and "note: memory_format=channels_last" in done.output
        out.write_text("mine")
        again = runner.invoke(app, ["export", str(source), "--to", target, "-o", str(out)])
        assert again.exit_code == 2 and out.read_text() == "mine"
        assert "--force" in again.output
        forced = runner.invoke(app, ["export", str(source), "--to", target, "-o", str(out),
                                     "--force"])
        assert forced.exit_code == 0 and out.read_text() != "mine"
    into_folder = runner.invoke(app, ["export", str(source), "--to", "accelerate", "-o",
                                      str(tmp_path / "sub")])
    assert into_folder.exit_code == 0  # a new path: the file itself


def test_export_errors_name_its_output_option(tmp_path: Path) -> None:
    """Issue 62: an export refused over an existing file, or under a file, named ``--out``,
    an option export does not have: it names ``-o/--output``."""
    source = write(job(), tmp_path / "autotune.json")
    (tmp_path / "ds_config.json").write_text("mine")
    runner = CliRunner()
    exists = runner.invoke(app, ["export", str(source), "--to", "deepspeed", "-o",
                                 str(tmp_path / "ds_config.json")])
    under_a_file = runner.invoke(app, ["export", str(source), "--to", "deepspeed", "-o",
                                       str(tmp_path / "ds_config.json" / "x.json")])
    for done in (exists, under_a_file):
        text = " ".join(done.output.split())
        assert done.exit_code == 2, done.output
        assert "choose another -o/--output path" in text and "--out " not in text, text


@pytest.mark.parametrize(("args", "words"), [
    (["--to", "megatron"], "--to 'megatron' is not a tool autotune exports to: use deepspeed, "
                           "torchtitan, accelerate"),
    (["--to", "deepspeed", "missing.json"], "does not exist"),
    (["--force"], "Missing option '--to'"),
])
def test_export_bad_input_exits_2_naming_the_value(args: list[str], words: str,
                                                   tmp_path: Path) -> None:
    source = write(job(), tmp_path / "autotune.json")
    argv = ["export", *(args if "missing.json" in args else [str(source), *args])]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 2
    assert words in " ".join(done.output.split()), done.output
    assert not list(tmp_path.glob("ds_config.json"))


def test_export_into_a_folder_uses_the_tools_file_name(tmp_path: Path) -> None:
    source = write(job(), tmp_path / "autotune.json")
    path, result = export_config(source, "torchtitan", tmp_path)
    assert path == tmp_path / "torchtitan.toml" and path.read_text() == result.text
    with pytest.raises(ConfigError, match="exists"):
        export_config(source, "torchtitan", tmp_path)


# --- text that reaches a file: never configuration (issue 61 item 1) -------------------------

EVIL = {  # each ends its line with "#": what the header says after the name is a comment
    "torchtitan": 'x\n[experimental]\ncustom_import = "evil_module"\n#',
    "accelerate": "x\nmain_process_ip: 6.6.6.6\nmain_process_port: 1234\n#"}


def parsed(config: TunedConfig, target: str) -> dict[str, Any]:
    """The exported file as its tool's own format reads it (a real TOML or YAML parser)."""
    yaml = pytest.importorskip("yaml")  # PyYAML: Accelerate reads its config with it
    text = render(config, target).text
    return tomllib.loads(text) if target == "torchtitan" else yaml.safe_load(text)


@pytest.mark.parametrize("target", ["torchtitan", "accelerate"])
def test_a_workload_name_with_line_breaks_stays_in_its_comment(target: str) -> None:
    """A name with line breaks, built in memory (the reader refuses such a file): its header
    comment wrote ``[experimental] custom_import`` (torchtitan imports that module) and
    ``main_process_ip`` into the file; the name is escaped there as the body's strings are."""
    clean = parsed(job("ddp", precision="bf16"), target)
    evil = parsed(job("ddp", precision="bf16", workload_name=EVIL[target]), target)
    assert "experimental" not in evil and "main_process_ip" not in evil
    assert evil == clean
    line = render(job(workload_name=EVIL[target]), target).text.splitlines()[0]
    assert line.startswith("# autotune export --to " + target + ": x\\u000A"
                           + EVIL[target][2:].replace('"', '\\"').replace("\n", "\\u000A"))


NAMES = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["\x85key: 1", "\u2028key: 1", "\r[a]\rb = 1", '"\\', "\x00\x1b[31m", "\ud800", "😀"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES, target=st.sampled_from(["torchtitan", "accelerate"]))
def test_any_text_in_the_header_parses_to_the_same_data(name: str, target: str) -> None:
    """Whatever text the header carries (control characters, YAML's NEL and line separators,
    quotes, lone surrogates), the TOML and YAML read back as with a plain name."""
    assert parsed(job(workload_name=name), target) == parsed(job(), target)
