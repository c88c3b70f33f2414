"""The options several ``autotune`` commands share, and the knob options made from ``KNOBS``
(``knob_options``): a comma-separated option's values, a duration's seconds.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from autotune.errors import ConfigError
from autotune.knobs import KNOB, KNOBS, Knob
from autotune.units import MAX_BATCH

WorkloadOpt = Annotated[Optional[str], typer.Option(
    "--workload", help="Your workload: path/to/file.py:factory returning autotune.Workload.")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", help="A Hugging Face model id or local directory (random weights).")]
SeqLenOpt = Annotated[Optional[int], typer.Option(
    "--seq-len", help="Worst-case sequence length for --model.")]
PretrainedOpt = Annotated[bool, typer.Option(
    "--pretrained", help="Load real weights for --model (downloads them).")]
LengthsOpt = Annotated[Optional[Path], typer.Option(
    "--lengths", help="Real sequence lengths for --model (a file: one integer a line, or a JSON "
    "list): batches vary in length and --shapes is tuned on them (docs/shapes.md).")]
TargetOpt = Annotated[int, typer.Option(
    "--target-batch", min=1, max=MAX_BATCH,
    help="Effective batch size (samples per optimizer step, all devices).")]
WorldOpt = Annotated[int, typer.Option(
    "--world-size", min=1, max=MAX_BATCH, help="Data-parallel devices of the whole job, all "
    "nodes (with --nproc-per-node: default that many).")]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="cpu, cuda or cuda:N (default: cuda when available).")]
BudgetOpt = Annotated[Optional[str], typer.Option(
    "--memory-budget", help="Memory for training, e.g. 2GiB or 80% (default: what is free).")]
HeadroomOpt = Annotated[float, typer.Option(
    "--headroom", min=0.0, max=0.95, help="Share of the budget kept free (0.1 = 10%).")]
PrecisionsOpt = Annotated[Optional[str], typer.Option(
    "--precisions", help="Comma-separated subset of fp32,tf32,bf16,fp16.")]
ModesOpt = Annotated[Optional[str], typer.Option(
    "--compile-modes",
    help="Comma-separated subset of off,default,reduce-overhead,max-autotune-no-cudagraphs,"
         "max-autotune.")]


NprocOpt = Annotated[int, typer.Option(
    "--nproc-per-node", help="Ranks each probe and trial runs as one job on this machine "
    "(torch's elastic launcher, as torchrun; gloo on CPU, nccl on CUDA), each capped like a "
    "device: at most this machine's GPUs (CPU: cores). --world-size defaults to it.")]
ParallelOpt = Annotated[str, typer.Option(
    "--parallel", help="Child runs at once, each on its own device(s) (CPU: its own cores): "
    "a number, or auto for every visible device (CPU: cores // cores a run needs). A job of "
    "--nproc-per-node k ranks takes k devices. Finalists are re-measured alone.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
TrialTimeoutOpt = Annotated[str, typer.Option(
    "--trial-timeout", help="Most wall time of one child run (probe or trial), e.g. 90s or "
                            "15m; --time-budget shortens it when less is left.")]
TimeoutOpt = Annotated[str, typer.Option(
    "--timeout", help="Most wall time of the child that builds and traces (or runs) the "
                      "workload, e.g. 90s or 10m.")]


def split_option(text: str | None, option: str) -> list[str] | None:
    """A comma-separated option as a list; None when not given.

    Raises:
        ConfigError: given, but naming nothing (``--precisions ,``).
    """
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{option} {text!r} names nothing: give a comma-separated list of "
                          "its values (autotune search --help lists them), or leave the option "
                          "out for every supported value")
    return items


KnobOptions = dict[str, Optional[str]]
"""Each knob's option beyond precision and compile mode, by knob name: its text as given, or
None."""
KNOB_OPTIONS: KnobOptions = {}
"""The default of a command's ``knob_options`` parameter, which ``knob_options`` replaces."""


def knob_options(command: Callable[..., None]) -> Callable[..., None]:
    """A command with one option per knob beyond precision and compile mode, from ``KNOBS``.

    The command's parameter ``knob_options: KnobOptions = KNOB_OPTIONS`` stands where the
    options go: typer reads the returned function's ``__signature__``, which holds, in its
    place, each knob's option (``Knob.option``; help: its values, ``Knob.help`` and
    ``Knob.default_help``), and the command gets their texts as ``knob_options``
    (``split_knob_options`` splits them inside the command's ``exits``). A new knob is a new option
    of every command that takes them.
    """
    signature = inspect.signature(command, eval_str=True)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index("knob_options")
    options = [inspect.Parameter(
        knob.name, params[at].kind, default=None,
        annotation=Annotated[Optional[str], typer.Option(knob.option, help=_knob_help(knob))])
        for knob in KNOBS[2:]]

    @functools.wraps(command)
    def with_knobs(**given: Any) -> None:
        texts = {knob.name: given.pop(knob.name) for knob in KNOBS[2:]}
        command(**given, knob_options=texts)

    with_knobs.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*params[:at], *options, *params[at + 1:]])
    return with_knobs


def split_knob_options(given: KnobOptions) -> dict[str, list[str] | None]:
    """The knob options as ``TuneRequest.knob_values`` (checked there, all at once).

    Raises:
        ConfigError: an option given, but naming nothing.
    """
    return {name: split_option(text, KNOB[name].option) for name, text in given.items()}


def _knob_help(knob: Knob) -> str:
    """A knob option's help, from its one description in ``knobs.KNOBS``."""
    return " ".join(filter(None, [
        f"Comma-separated subset of {','.join(knob.values)}: {knob.help}.", knob.default_help]))


def parallel_option(text: str) -> int | str:
    """``--parallel``'s value: a whole number, or the text as given (``auto``; anything else
    is refused with the other settings, ``check_settings``)."""
    stripped = text.strip()
    return int(stripped) if re.fullmatch(r"[+-]?\d{1,9}", stripped) else stripped


def seconds(text: str, option: str) -> float:
    """A duration option's seconds (``90s``, ``15m``).

    Raises:
        ConfigError: not a duration, named with its option.
    """
    from autotune.units import parse_duration

    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None
