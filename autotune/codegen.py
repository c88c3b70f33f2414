"""``train_autotuned.py``: a plain PyTorch training loop with the tuned values. No torch here.

The script is rendered as text from a ``TunedConfig``. Every value from the config enters it as
a Python literal (``_literal``), or escaped in the docstring and comments (``_text``): a value
never becomes code, whatever ``autotune.json`` holds. It does not import autotune: the
built-in model's source is carried in it (``TINY_GPT``, kept identical to
``autotune.builtin_workloads.TinyGPT`` by a test), a Hugging Face model is rebuilt from its
config with transformers, and a ``file.py:factory`` workload is imported by path. Its ``train_step``
does the arithmetic of ``autotune.trial.train_step`` (tests compare their gradients), and it
applies every knob as ``autotune.knobs`` does: the knob values are literals, and the code
applying them is kept only where the config runs it (``codegen_parts``: no compile code in an
eager script, no checkpointing where none was tuned; the DDP wrap and the out-of-memory
fallback always). It prints its peak memory as the search counts it (``codegen_memory``).
"""

from __future__ import annotations

import ast
import json
import math
import re
import string
import textwrap
from pathlib import Path

from autotune.artifacts import GRAPH_SETTINGS
from autotune.codegen_fallback import FALLBACK
from autotune.codegen_knobs import KNOB_FUNCTIONS
from autotune.codegen_memory import MEMORY
from autotune.codegen_parts import guard, parts, select
from autotune.codegen_shapes import SHAPES
from autotune.codegen_templates import SCRIPT
from autotune.codegen_workloads import FILE, HF, HF_AUTO, HF_COUNTS, TINY_GPT
from autotune.hf_configs import known_config
from autotune.knob_rules import describe
from autotune.knobs import KNOBS
from autotune.schema import TunedConfig
from autotune.units import format_bytes

SCRIPT_NAME = "train_autotuned.py"
_WIDTH = 96


def render_train_script(config: TunedConfig, *, script_dir: Path | None = None) -> str:
    """Render ``train_autotuned.py`` for a tuned config.

    Args:
        config: the content of ``autotune.json``.
        script_dir: where the script will live; a ``file.py:factory`` workload is then found
            relative to the script, else by its absolute path.

    Returns:
        The script's source: ruff-clean, runnable as ``python train_autotuned.py --steps N``
        or under ``torchrun``.
    """
    kept = parts(config)
    candidates, workload_code = _workload_section(config, script_dir)
    peak = config.memory.peak_bytes
    text = string.Template(select(SCRIPT, kept)).substitute(
        docstring=_docstring(config),
        imports=_IMPORTS,
        tuned_block=_tuned_block(config),
        target_batch=_literal(config.target_batch),
        micro_batch=_literal(config.micro_batch),
        **{knob.name: _literal(getattr(config.knobs, knob.name)) for knob in KNOBS},
        compile_dynamic=_literal(config.compile_dynamic),
        world_size=_literal(config.world_size),
        peak_bytes=_literal(peak),
        peak_comment=(f": {format_bytes(peak)} on {_text(config.device.device)}"
                      if peak is not None else ": none"),
        tuned_device=_literal(config.device.device),
        artifacts=_artifacts_block(config) if kept["artifacts"] else "",
        workload=workload_code,
        knob_functions=select(KNOB_FUNCTIONS, kept),
        memory=select(MEMORY, kept).rstrip("\n") + "\n",
        guard=guard(kept),
        fallback=select(FALLBACK, kept).strip("\n"),
        shapes_block=_shapes_block(config),
    )
    return text.replace(_IMPORTS, _imports(candidates, text.replace(_IMPORTS, "")))


_IMPORTS = "# imports: the ones the code below uses"
"""Where the imports go, chosen once the rest of the script is written (``_imports``)."""


def _imports(candidates: list[str], body: str) -> str:
    """The import lines of ``candidates`` (``import a.b``, ``import a as b``, ``from a import
    b, c``; standard library first, a blank line, then the rest, as ``_workload_section``
    orders them) whose names the script's code uses, so a part left out takes its imports."""
    used = {node.id for node in ast.walk(ast.parse(body)) if isinstance(node, ast.Name)}
    out = []
    for line in candidates:
        if not line:
            out.append(line)
            continue
        node = ast.parse(line).body[0]
        assert isinstance(node, (ast.Import, ast.ImportFrom))
        names = [alias.asname or alias.name.split(".")[0] for alias in node.names]
        keep = [alias.name + (f" as {alias.asname}" if alias.asname else "")
                for alias, name in zip(node.names, names, strict=True) if name in used]
        if not keep:
            continue
        if isinstance(node, ast.Import):
            out.append(line)
            continue
        one = f"from {node.module} import {', '.join(keep)}"
        out.append(one if len(one) <= _WIDTH else
                   f"from {node.module} import (\n" + "".join(f"    {k},\n" for k in keep) + ")")
    return "\n".join(out).strip("\n")


def _artifacts_block(config: TunedConfig) -> str:
    """The compiled artifacts' record as literals (``autotune.artifacts``), and the settings
    their graphs key covers (the script of a compiled config that saved them only)."""
    record = config.compile_artifacts
    assert record is not None  # a config without them: none of their code in the script
    lines = ["# What compile_artifacts' graphs_key covers, beside the model's parameters:",
             "graph_settings = (", *(f"    {_literal(name)}," for name in GRAPH_SETTINGS), ")"]
    fields = ("file", "size_bytes", "sha256", "torch_version", "device_name", "graphs_key")
    return "\n".join([
        *lines, "# The search's compiled artifacts, beside this script: loaded before the first",
        "# compile when they match (load_compile_artifacts below).",
        "compile_artifacts = {",
        *(f"    {_literal(name)}: {_literal(getattr(record, name))}," for name in fields),
        "}"])


def _literal(value: str | int | bool | None) -> str:
    """A config value as a Python literal: the only way one enters the script's code.

    A string becomes its JSON form, which is also a Python string literal with the same value
    (JSON's escapes are Python's; non-ASCII is escaped, so the source is plain ASCII).
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"no literal for {type(value).__name__}")


def _text(value: str) -> str:
    """Text for the docstring or a comment: quotes, backslashes, newlines and non-ASCII
    escaped, so it can neither end the docstring nor start a line of code."""
    return json.dumps(value)[1:-1]


# ----------------------------------------------------------------------------------------------
# The comment block: each tuned value with what was measured.


def _docstring(config: TunedConfig) -> str:
    # The workload's name stays off the first line: argparse formats that line (--help) with
    # "%", which a name such as "%(prog)d" would break.
    name = _text(config.workload_name or config.workload.label())
    ranks = config.world_size if config.world_size > 1 else "N"
    return (
        f'"""Train with the config autotune measured fastest on {_text(config.device.device)}.\n'
        "\n"
        f"Workload: {name}\n"
        "\n"
        "Run it:\n"
        "    python train_autotuned.py --steps 100\n"
        f"    torchrun --nproc_per_node={ranks} train_autotuned.py --steps 100   # the tuned "
        "strategy, or DDP\n"
        "\n"
        "The batches below are synthetic worst-case ones: replace get_batch() with your data.\n"
        'Generated by `autotune search` / `autotune codegen`; it is yours to edit.\n"""'
    )


def _tuned_block(config: TunedConfig) -> str:
    device = config.device
    lines = [
        f"Tuned by autotune {config.autotune_version} on {device.device} ({device.name}), "
        f"torch {device.torch_version or '?'}, {config.created_at[:10]}.",
        f"Workload {config.workload_name or config.workload.label()}; effective batch "
        f"{config.target_batch} samples per optimizer step over {config.world_size} "
        f"device{'s' if config.world_size > 1 else ''}.",
    ]
    if config.interrupted:
        lines.append(config.stopped_early())
    out = ["# " + "-" * (_WIDTH - 2)]
    out += _comment(" ".join(lines))
    out.append("#")
    for name, why in _reasons(config):
        out += _comment(f"{name}: {why}", indent="#     ")
    if config.reason:
        out += _comment(f"Why: {config.reason}", indent="#     ")
    out.append("# " + "-" * (_WIDTH - 2))
    return "\n".join(out)


def _comment(text: str, indent: str = "# ") -> list[str]:
    """``text`` escaped, as comment lines of at most ``_WIDTH`` characters, in time linear in
    its length: a word longer than a line (a long workload name, escaped) is cut into pieces
    that fit one first, as textwrap would cut it, but textwrap cuts by slicing the rest of the
    word again for every line (quadratic)."""
    room = _WIDTH - max(len("# "), len(indent))
    words = (word[i:i + room] for word in _text(text).split() for i in range(0, len(word), room))
    return textwrap.wrap(" ".join(words), width=_WIDTH, initial_indent="# ",
                         subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False)


def _reasons(config: TunedConfig) -> list[tuple[str, str]]:
    memory = config.memory
    largest = memory.max_micro_batch.get(config.memory_class())
    fit = (f"peak {format_bytes(memory.peak_bytes)} of {format_bytes(memory.usable_bytes)} "
           f"usable (budget {format_bytes(memory.budget_bytes)} minus "
           f"{memory.headroom:.0%} headroom)")
    if largest:
        fit += f"; the largest micro-batch that fit with {config.memory_class()} was {largest}"
    speed = f"{_rate(config.samples_per_s)} samples/s"
    if config.baseline_samples_per_s:
        speed += f" against {_rate(config.baseline_samples_per_s)} for the fp32 eager baseline"
        if config.speedup:
            speed += f" ({config.speedup:.2f}x)"
    other_precision = _best_other(config, "precision")
    if other_precision:
        speed += f"; best other precision: {other_precision}"
    compiled = ("eager (no torch.compile)" if not config.compiled else
                f"torch.compile with mode {config.compile_mode}, "
                + _DYNAMIC[config.compile_dynamic])
    other_mode = _best_other(config, "compile_mode")
    if other_mode:
        compiled += f"; best other mode: {other_mode}"
    compile_s = next((t.compile_s for t in config.trials if t.verdict == "winner"), None)
    if config.compiled and compile_s is not None:
        compiled += f"; compiling took {compile_s:.1f} s"
        if config.break_even_steps is not None and math.isfinite(config.break_even_steps):
            compiled += f", paid back after {config.break_even_steps:.0f} optimizer steps"
    return [
        (f"micro_batch = {config.micro_batch}", fit),
        (f"accumulate_steps = {config.accumulate_steps}",
         f"{config.target_batch} / ({config.micro_batch} per micro-batch x "
         f"{config.world_size} device{'s' if config.world_size > 1 else ''}): derived"),
        (f"precision = {config.precision}", speed),
        (f"compile_mode = {config.compile_mode}", compiled),
        *_knob_reasons(config),
    ]


def _knob_reasons(config: TunedConfig) -> list[tuple[str, str]]:
    """Each knob beyond precision and compile mode: what it does, what it let fit (a knob
    that frees memory, against the same knobs without it) and the best other value timed."""
    knobs, fits = config.knobs, config.memory.max_micro_batch
    out = []
    for knob, line in zip(KNOBS[2:], describe(knobs), strict=True):
        name, why = line.split(": ", 1)
        value = getattr(knobs, knob.name)
        if not knob.said_at_default and value == knob.default:
            continue
        without = knobs.with_(**{knob.name: knob.default}).label()
        if value in knob.frees_memory and fits.get(knobs.label()) and fits.get(without):
            why += (f"; the largest micro-batch that fit: {fits[knobs.label()]} with it, "
                    f"{fits[without]} without")
        other = _best_other(config, knob.name)
        if other:
            why += f"; best other {knob.name}: {other}"
        out.append((name, why))
    return out


_DYNAMIC = {
    None: "automatic dynamic shapes (compile_dynamic = None: static at the one shape measured; "
          "a dim that changes compiles once more, dynamic)",
    True: "dynamic shapes from the first compile (compile_dynamic = True)",
    False: "one static graph per shape (compile_dynamic = False)",
}


def _best_other(config: TunedConfig, knob: str) -> str:
    mine = getattr(config.knobs, knob)
    others = [t for t in config.trials if getattr(t.knobs, knob) != mine and t.samples_per_s
              and not t.is_baseline and t.verdict in ("ok", "slower")]
    if not others:
        return ""
    best = max(others, key=lambda t: t.samples_per_s or 0.0)
    return f"{best.label()} at {_rate(best.samples_per_s)} samples/s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


# ----------------------------------------------------------------------------------------------
# The workload: the built-in model's source, a Hugging Face config, or the user's factory.

_DEFAULT_SIZES = {
    "cpu": "dict(vocab_size=1024, seq_len=128, dim=128, num_layers=2, num_heads=4)",
    "cuda": "dict(vocab_size=50304, seq_len=1024, dim=768, num_layers=12, num_heads=12)",
}
"""The sizes of ``autotune.builtin_workloads.default_workload`` per device (a test keeps them
equal)."""


def _workload_section(config: TunedConfig, script_dir: Path | None) -> tuple[list[str], str]:
    spec = config.workload
    std = ["import argparse", "import errno", "import functools", "import gc", "import hashlib",
           "import importlib", "import inspect", "import logging", "import mmap", "import os",
           "import platform", "import re", "import stat", "import threading", "import time"]
    third = ["import torch", "import torch.distributed as dist"]
    tail = ["from torch import nn",
            "from torch.distributed.checkpoint.state_dict import StateDictOptions, "
            "get_model_state_dict, get_optimizer_state_dict",
            "from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard",
            "from torch.nn.parallel import DistributedDataParallel as DDP",
            "from torch.utils.checkpoint import checkpoint"]
    std_from = ["from contextlib import nullcontext"]
    if spec.kind == "default":
        sizes = _DEFAULT_SIZES["cuda" if config.device.is_cuda else "cpu"]
        code = string.Template(TINY_GPT).substitute(sizes=sizes)
    elif spec.kind == "hf":
        task, seq_len = _hf_task(config)
        build = ("from_pretrained(model_name)" if spec.pretrained else
                 "from_config(hf_config())")
        labels = ("torch.randint(0, hf_config().num_labels, (micro_batch,))"
                  if task == "classifier" else "ids.clone()")
        code = string.Template(HF).substitute(
            name=_literal(spec.target), seq_len=_literal(seq_len), auto=HF_AUTO[task], build=build,
            labels=labels, count=HF_COUNTS[task], shipped=_shipped_config(spec.target))
        third.append("import transformers")
    else:
        path_text, _, factory = spec.target.rpartition(":")
        code = string.Template(FILE).substitute(
            path=_path_expr(Path(path_text), script_dir), factory=_literal(factory))
        std = sorted([*std, "import importlib.util", "import sys"])
        std_from.append("from pathlib import Path")
    if _shapes_block(config):
        std = sorted([*std, "import math", "import random"])
    return [*std, *std_from, "", *third, *tail], code.strip("\n")


def _shapes_block(config: TunedConfig) -> str:
    """The shape policy's lines (``codegen_shapes.SHAPES``) for a workload that declares
    lengths (``--lengths``; a file workload's own, read when the script runs); nothing for a
    fixed-shape workload: its script is as before."""
    from autotune.lengths import BUCKET_MULTIPLE, MAX_BUCKETS

    spec = config.workload
    if spec.kind == "default" or (spec.kind == "hf" and not spec.lengths):
        return ""
    if spec.kind == "hf":
        body = textwrap.wrap(", ".join(map(str, spec.lengths or ())), _WIDTH - 4)
        lengths, worst = "[\n" + "".join(f"    {line}\n" for line in body) + "]", "seq_len"
    else:
        lengths = ("workload.lengths() if callable(workload.lengths) else workload.lengths")
        worst = "workload.tokens_per_sample or (max(lengths) if lengths else None)"
    return string.Template(SHAPES.lstrip("\n")).substitute(
        shapes=_literal(config.knobs.shapes), lengths=lengths, worst=worst,
        count=MAX_BUCKETS, multiple=BUCKET_MULTIPLE) + "\n"


def _shipped_config(name: str) -> str:
    """``shipped_config = {...}``: the architecture autotune ships for a well-known model id
    (``autotune.hf_configs``), so the script builds it offline as the search did; None for
    any other model. Each value is autotune's own data (strings, numbers, lists of strings),
    written as JSON, which is also Python for these."""
    shipped = known_config(name)
    if shipped is None:
        return "shipped_config = None  # autotune ships no config of this model"
    assert all(isinstance(v, (str, int, float, list)) and not isinstance(v, bool)
               for v in shipped.values())
    lines = [f"    {json.dumps(key)}: {json.dumps(value)}," for key, value in shipped.items()]
    return "\n".join(["shipped_config = {  # its architecture, for use offline",
                      *lines, "}"])


def _hf_task(config: TunedConfig) -> tuple[str, int]:
    """Task and sequence length as measured: ``hf_workload`` names them ``id (task, seq N)``."""
    match = re.search(r"\((causal-lm|masked-lm|classifier), seq ([1-9][0-9]{0,8})\)$",
                      config.workload_name, flags=re.ASCII)
    if match:
        return match.group(1), int(match.group(2))
    return "causal-lm", int(config.workload.seq_len or 1024)


def _path_expr(path: Path, script_dir: Path | None) -> str:
    """Relative to the script when the file lies beside or below it, else absolute."""
    absolute = path.resolve()
    if script_dir is not None and absolute.is_relative_to(Path(script_dir).resolve()):
        relative = absolute.relative_to(Path(script_dir).resolve()).as_posix()
        return f"Path(__file__).resolve().parent / {_literal(relative)}"
    return f"Path({_literal(absolute.as_posix())})"
