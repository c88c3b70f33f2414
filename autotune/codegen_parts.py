"""Which parts of ``train_autotuned.py`` a tuned config uses, and the cutting of the rest. No
torch here.

The script's texts (``codegen_templates``, ``codegen_knobs``, ``codegen_fallback``) mark the code
that only some configs run with lines ``#[if PART]``, ``#[if not PART]``, ``#[else]`` and
``#[end]`` (nestable, at any indentation); ``select`` keeps what the config's parts say and drops
the marker lines, so a plain fp32 eager script carries no compile, checkpointing or optimizer
rebuild code. What a user may need whatever was tuned stays unmarked: the DDP wrap (torchrun runs
any script as DDP), the out-of-memory fallback (``--oom-fallbacks``), the peak-memory line.
The knob values stay at the top of the script; ``guard`` writes the check that stops the script
when one of them is changed to a value whose code was cut (it would otherwise do nothing).
"""

from __future__ import annotations

import json
import re

from autotune.schema import TunedConfig

_MARKER = re.compile(r"^[ \t]*#\[(if (not )?([a-z_]+)|else|end)\][ \t]*$")

CUDA_GRAPHS = ("reduce-overhead", "max-autotune")
"""The compile modes that run CUDA graphs (the step copies the first micro-batch's gradients)."""


def parts(config: TunedConfig) -> dict[str, bool]:
    """The parts of the script this config runs, by the name its markers use."""
    knobs = config.knobs
    compiled = knobs.compile_mode != "off"
    checkpoint = knobs.checkpointing in ("blocks", "alternate")
    fsdp = knobs.strategy.startswith("fsdp")
    blocks_scope = compiled and knobs.compile_scope == "blocks"
    return {
        "compiled": compiled,
        "artifacts": compiled and config.compile_artifacts is not None,
        "cuda_graphs": knobs.compile_mode in CUDA_GRAPHS,
        "blocks_scope": blocks_scope,
        "checkpoint": checkpoint,
        "recompute": knobs.checkpointing.startswith("budget-"),
        "rebuild_optimizer": knobs.optimizer_impl != "default",
        "fsdp": fsdp,
        "channels_last": knobs.memory_format == "channels_last",
        "expandable": knobs.allocator == "expandable_segments",
        "find_blocks": checkpoint or fsdp or blocks_scope,
    }


def select(text: str, kept: dict[str, bool]) -> str:
    """``text`` with the marked sections the parts do not use cut, and the markers gone.

    Raises:
        ValueError: a marker names no known part, or the markers do not pair up (a bug in the
            templates, found by the tests that render every variant).
    """
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this section kept, the enclosing one kept)
    for line in text.split("\n"):
        match = _MARKER.match(line)
        if match is None:
            if all(keep for keep, _ in stack):
                out.append(line)
            continue
        word, negated, name = match.groups()
        if word == "end" or word == "else":
            if not stack:
                raise ValueError(f"#[{word}] without #[if]")
            keep, outer = stack.pop()
            if word == "else":
                stack.append((not keep, outer))
            continue
        if name not in kept:
            raise ValueError(f"#[if {name}]: no such part of the script")
        stack.append((kept[name] != bool(negated), all(keep for keep, _ in stack)))
    if stack:
        raise ValueError("#[if] without #[end]")
    return "\n".join(out)


def guard(kept: dict[str, bool]) -> str:
    """Lines for ``main()``: stop with what to do when a knob above is set to a value whose
    code this script left out; nothing when no knob's code was cut."""
    checks = []
    if not kept["compiled"]:
        checks.append(("compile_mode", 'compile_mode == "off"'))
    elif not kept["cuda_graphs"]:
        checks.append(("compile_mode", "compile_mode not in (" + ", ".join(
            json.dumps(mode) for mode in CUDA_GRAPHS) + ")"))
    if kept["compiled"] and not kept["blocks_scope"]:
        checks.append(("compile_scope", 'compile_scope == "model"'))
    allowed = ['checkpointing == "off"']
    if kept["checkpoint"]:
        allowed.append('checkpointing in ("blocks", "alternate")')
    if kept["recompute"]:
        allowed.append('checkpointing.startswith("budget-")')
    if not (kept["checkpoint"] and kept["recompute"]):
        checks.append(("checkpointing", " or ".join(allowed)))
    for knob, part, condition in (
            ("optimizer_impl", "rebuild_optimizer", 'optimizer_impl == "default"'),
            ("memory_format", "channels_last", 'memory_format == "contiguous"'),
            ("allocator", "expandable", 'allocator == "default"'),
            ("strategy", "fsdp", 'not strategy.startswith("fsdp")')):
        if not kept[part]:
            checks.append((knob, condition))
    if not checks:
        return ""
    rows = "".join(f"\n        ({json.dumps(name)}, {condition})," for name, condition in checks)
    return _GUARD.replace("ROWS", rows)


_GUARD = """\
    # Generated for the values above: the code that other values need was left out, and a
    # value changed to one of those would do nothing. Say so instead.
    for name, supported in (ROWS
    ):
        if not supported:
            raise SystemExit(f"{name} = {globals()[name]!r}: this script was generated without "
                             "the code for that value; re-run `autotune codegen` on an "
                             "autotune.json with it")
"""
