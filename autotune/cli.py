"""The ``autotune`` command: thin typer adapters over ``autotune.api``.

Torch is imported only inside commands, so ``autotune --help`` stays fast.
Logs and progress go to stderr, results to stdout.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from autotune.config import MAX_BATCH
from autotune.errors import AutotuneError, ConfigError
from autotune.knobs import KNOB, KNOBS, Knob, Knobs
from autotune.names import FLAGS
from autotune.signals import command, ending, take_process_signals

app = typer.Typer(
    help="Find the fastest way to train your model at the effective batch size you want.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)


def plain_console(**options: object) -> Console:
    """A console that prints text exactly as given: the one kind autotune prints through.

    Markup, emoji codes and highlighting are off, so a workload's name, an exception message,
    a path or a rank's ``[/__w/pytorch/...] Connection closed`` prints as typed (never read as
    ``[tags]`` or ``:emoji:``); autotune's own styling comes only from ``rich.text.Text``
    objects it builds. ``options`` go to ``Console`` (``stderr``, ``width``, ``file``, ...).
    """
    return Console(**{"soft_wrap": True, **options,  # type: ignore[arg-type]
                      "markup": False, "emoji": False, "highlight": False})


out = plain_console()
err = plain_console(stderr=True)

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
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
TrialTimeoutOpt = Annotated[str, typer.Option(
    "--trial-timeout", help="Most wall time of one child run (probe or trial), e.g. 90s or "
                            "15m; --time-budget shortens it when less is left.")]
TimeoutOpt = Annotated[str, typer.Option(
    "--timeout", help="Most wall time of the child that builds and traces (or runs) the "
                      "workload, e.g. 90s or 10m.")]


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    """A warning as one line on stderr, printed as typed (not Python's two lines naming the
    source line that warned)."""
    err.print(Text.assemble(("warning:", "yellow"), " ", str(message)))


class _Done:
    """What a command wrote before a signal ended it (``_exits`` says so)."""

    written: Path | None = None


@contextlib.contextmanager
def _exits() -> Iterator[_Done]:
    """Turn what ends a command into its exit code (DESIGN.md section 10): a library error's
    own (2 bad input or broken workload, 1 does not fit), 130 for Ctrl-C and 143 for SIGTERM
    (saying what was written: the exception's ``written``, else the command's ``_Done``), 3
    for a bug of autotune's own (with its traceback). A warning prints as one line. In the
    ``autotune`` process the command's signals are ``signals.command``'s: once it ends, every
    later one is ignored while it says why and exits."""
    done = _Done()
    try:
        with warnings.catch_warnings(), command():
            warnings.showwarning = _show_warning
            yield done
    except AutotuneError as exc:
        # The message may quote a file's values or a workload's error: printed as typed.
        _last().print(Text.assemble(("error:", "bold red"), " ", str(exc)))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        written = getattr(exc, "written", None) or done.written
        name = "Ctrl-C" if getattr(exc, "signal_name", "SIGINT") == "SIGINT" else exc.signal_name
        _last().print(f"interrupted ({name}): " + (
            f"wrote {written}, its train_autotuned.py"
            + (" and autotune.html" if Path(written).with_suffix(".html").exists() else "")
            + " first" if written else
            "nothing written"), highlight=False, markup=False)
        raise typer.Exit(getattr(exc, "exit_code", 130)) from None
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except Exception as exc:
        last = _last()
        last.print("".join(traceback.format_exception(exc)), highlight=False, markup=False)
        last.print(f"internal error: {type(exc).__name__}: {exc}. This is a bug in autotune, not "
                   "in your input: please report it with the traceback above",
                   highlight=False, markup=False)
        raise typer.Exit(3) from None


def _last() -> Console:
    """A console for a command's last line, onto ``err``'s file: a new one, as a signal that
    raised inside one of ``err``'s prints (between the halves of rich's buffer bookkeeping)
    leaves ``err`` holding every later print back, and the line would never show."""
    return plain_console(file=err.file)


def _split(text: str | None, option: str) -> list[str] | None:
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
    (``_knob_values`` splits them inside the command's ``_exits``). A new knob is a new option
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


def _knob_values(given: KnobOptions) -> dict[str, list[str] | None]:
    """The knob options as ``TuneRequest.knob_values`` (checked there, all at once).

    Raises:
        ConfigError: an option given, but naming nothing.
    """
    return {name: _split(text, KNOB[name].option) for name, text in given.items()}


def _knob_help(knob: Knob) -> str:
    """A knob option's help, from its one description in ``knobs.KNOBS``."""
    return " ".join(filter(None, [
        f"Comma-separated subset of {','.join(knob.values)}: {knob.help}.", knob.default_help]))


def _seconds(text: str, option: str) -> float:
    from autotune.config import parse_duration

    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None


@app.command()
def env(device: DeviceOpt = None, json_out: JsonOpt = False) -> None:
    """Print the facts autotune uses: torch, CUDA, device name and memory, bf16 support."""
    with _exits():
        from autotune import api, report

        info = api.env(device)
        if json_out:
            print(report.to_json(info))
        else:
            out.print(report.env_table(info))


@app.command()
@knob_options
def probe(
    target_batch: TargetOpt = 64,
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    seq_len: SeqLenOpt = None,
    pretrained: PretrainedOpt = False,
    lengths: LengthsOpt = None,
    world_size: WorldOpt = 1,
    device: DeviceOpt = None,
    memory_budget: BudgetOpt = None,
    headroom: HeadroomOpt = 0.1,
    precisions: PrecisionsOpt = None,
    compile_modes: ModesOpt = None,
    knob_options: KnobOptions = KNOB_OPTIONS,
    nproc_per_node: NprocOpt = 1,
    trial_timeout: TrialTimeoutOpt = "15m",
    json_out: JsonOpt = False,
) -> None:
    """Find the largest micro-batch that fits, for each precision and compile mode and each
    --strategy (the other knobs at their first value asked for, default their default)."""
    with _exits():
        from autotune import api, report

        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len,
                                 pretrained=pretrained, lengths=lengths, name=FLAGS)
        with err.status(Text("probing memory with real training steps...")) as status:
            def on_step(knobs, step):
                err.print(report.probe_step_line(knobs.label(), step), highlight=False)
                status.update(Text(f"probing memory: {knobs.label()} done up to "
                                   f"micro-batch {step.micro_batch}..."))

            request = api.TuneRequest(
                workload=spec, target_batch=target_batch, world_size=world_size, device=device,
                memory_budget=memory_budget, headroom=headroom,
                precisions=_split(precisions, "--precisions"),
                compile_modes=_split(compile_modes, "--compile-modes"),
                knob_values=_knob_values(knob_options),
                nproc_per_node=nproc_per_node)
            result = api.probe(request, timeout_s=_seconds(trial_timeout, "--trial-timeout"),
                               on_step=on_step, name=FLAGS)
        if json_out:
            print(report.to_json(result))
            return
        console = out_for_tables()
        console.print(report.probe_table(result))
        for line in report.probe_footer(result):
            console.print(line, highlight=False)


@app.command()
@knob_options
def search(
    target_batch: TargetOpt = 64,
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    seq_len: SeqLenOpt = None,
    pretrained: PretrainedOpt = False,
    lengths: LengthsOpt = None,
    world_size: WorldOpt = 1,
    device: DeviceOpt = None,
    memory_budget: BudgetOpt = None,
    headroom: HeadroomOpt = 0.1,
    precisions: PrecisionsOpt = None,
    compile_modes: ModesOpt = None,
    knob_options: KnobOptions = KNOB_OPTIONS,
    nproc_per_node: NprocOpt = 1,
    out: Annotated[Path, typer.Option("--out", help="Folder for autotune.json.")] = Path("."),
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite autotune.json, train_autotuned.py and autotune.html.")
    ] = False,
    time_budget: Annotated[Optional[str], typer.Option(
        "--time-budget", help="Stop after this long and keep the best so far, e.g. 10m.")] = None,
    train_steps: Annotated[Optional[int], typer.Option(
        "--train-steps", min=1,
        help="Objective: time to train N optimizer steps, compile included.")] = None,
    storage: Annotated[Optional[str], typer.Option(
        "--storage", help="Optuna RDB storage to resume or share, e.g. sqlite:///autotune.db.")
    ] = None,
    study_name: Annotated[Optional[str], typer.Option("--study-name")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help=(
            "Keep no runs: without --storage a search records them in the local study store "
            "($AUTOTUNE_CACHE_DIR, else $XDG_CACHE_HOME/autotune) and a repeated one reuses "
            "them."))] = False,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="Ignore the runs the local study store holds for this search (they "
                        "are replaced by this one's).")] = False,
    timed_steps: Annotated[int, typer.Option(
        "--timed-steps", min=3, help=(
            "Most timed optimizer steps per trial; a re-measurement of the contenders times "
            "them all."))] = 10,
    rank_precision: Annotated[float, typer.Option(
        "--rank-precision", help=(
            "A first timing stops once its median step time is known within this share (95% "
            "interval, 3 steps at least): enough to rank it; 0 times every run in full."))
    ] = 0.05,
    micro_batches: Annotated[str, typer.Option(
        "--micro-batches", help=(
            "Most micro-batches timed per class: the largest that fits, then smaller ones while "
            "they get faster; or 'all' (every fitting one, none skipped)."))
    ] = "3",
    refine_within: Annotated[float, typer.Option(
        "--refine-within", min=0.0, max=1.0, help=(
            "Try smaller micro-batches of a class, and compile modes beyond off/default for a "
            "precision, only while its best is at least this share of the leader's; 0 tries "
            "everything."))] = 0.9,
    confirm_within: Annotated[float, typer.Option(
        "--confirm-within", min=0.0, max=1.0, help=(
            "Re-measure the leader with the candidates within this share of it (or within "
            "the spread their runs measured) before the pick; 1 re-measures the 2 closest "
            "always."))] = 0.05,
    max_trials: Annotated[int, typer.Option(
        "--max-trials", min=1, help="Most child runs, probes included.")] = 60,
    trial_timeout: TrialTimeoutOpt = "15m",
    allow_inexact: Annotated[bool, typer.Option(
        "--allow-inexact",
        help="If --world-size does not divide --target-batch, tune the nearest exact batch.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Probe memory, time compile modes x precisions, screen checkpointing, optimizer
    implementation, memory format and allocator on the leader, write the tuned autotune.json."""
    with _exits() as done:
        from autotune import api, errors, report
        from autotune.search import SearchSettings

        if micro_batches != "all" and not micro_batches.isdigit():
            raise errors.ConfigError(
                f"--micro-batches must be a number or 'all', got {micro_batches!r}")
        settings = SearchSettings(
            num_timed_steps=timed_steps, rank_precision=rank_precision or None,
            max_trials=max_trials, train_steps=train_steps,
            refine_within=refine_within, confirm_within=confirm_within,
            micro_batches_per_class=0 if micro_batches == "all" else int(micro_batches),
            time_budget_s=_seconds(time_budget, "--time-budget") if time_budget else None,
            timeout_s=_seconds(trial_timeout, "--trial-timeout"),
            storage=storage, study_name=study_name, cache=not no_cache, fresh=fresh)
        err.print(report.start_line(workload or model or "the built-in GPT", device, target_batch),
                  highlight=False)  # at once: the progress bar shows nowhere off a terminal
        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len,
                                 pretrained=pretrained, lengths=lengths, name=FLAGS)
        with _progress() as progress:
            task = progress.add_task("probing memory", total=None)

            def on_step(knobs, step):  # a timed probe is a trial: on_trial says it
                if not step.timed:
                    err.print(report.probe_step_line(knobs.label(), step), highlight=False)
                progress.update(task, description=f"probing {knobs.label()}")

            def on_trial(num_runs, stage, candidate, record):
                if record is not None:
                    err.print(report.trial_line(record, stage), highlight=False)
                progress.update(task, completed=num_runs, description=(
                    f"{stage}: run {num_runs + (record is None)} {candidate.key()}"))

            request = api.TuneRequest(
                workload=spec, target_batch=target_batch, world_size=world_size, device=device,
                memory_budget=memory_budget, headroom=headroom,
                precisions=_split(precisions, "--precisions"),
                compile_modes=_split(compile_modes, "--compile-modes"),
                knob_values=_knob_values(knob_options),
                nproc_per_node=nproc_per_node, allow_inexact=allow_inexact)
            result = api.search(request, out=out, force=force, settings=settings,
                                on_step=on_step, on_trial=on_trial, name=FLAGS)
            done.written = result.path  # a signal from here on: the files are written
        if json_out:
            print(report.to_json(result.config))
        else:
            out_console = out_for_tables()
            out_console.print(report.search_table(result.config, width=out_console.width))
            for line in report.search_footer(result):
                out_console.print(line, highlight=False)
        if result.config.interrupted and result.stop_reason.by_signal:
            raise typer.Exit(result.stop_reason.exit_code)


def out_for_tables() -> Console:
    """Stdout console, wide enough for the results table even when piped."""
    return plain_console(width=None if sys.stdout.isatty() else 160)


@contextlib.contextmanager
def _progress() -> Iterator[Progress]:
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                        BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                        transient=True)
    with progress:
        yield progress


# ----------------------------------------------------------------------------------------------
# estimate and check (issue 5).


class PrecisionChoice(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


class KernelsChoice(str, Enum):
    cuda = "cuda"
    cpu = "cpu"


@app.command()
def estimate(
    micro_batch: Annotated[int, typer.Option(
        "--micro-batch", min=1, max=MAX_BATCH, help="Micro-batch.")] = 8,
    device_memory: Annotated[str, typer.Option(
        "--device-memory", help="The device's memory, e.g. 24GiB or 80GB.")] = "24GiB",
    precision: Annotated[PrecisionChoice, typer.Option("--precision")] = PrecisionChoice.fp32,
    checkpointing: Annotated[str, typer.Option(
        "--checkpointing", help="off, blocks or alternate: trace the step checkpointed "
        "(budget-0.5, the compiler's recompute, is traced as off, and said so).")] = "off",
    strategy: Annotated[str, typer.Option(
        "--strategy", help="none, ddp, ddp-bucket-view, fsdp or fsdp-no-reshard: trace one rank "
        "of a --world-size job (a fake process group in one process).")] = "none",
    optimizer_impl: Annotated[str, typer.Option(
        "--optimizer-impl", help="default, for-loop, foreach or fused.")] = "default",
    memory_format: Annotated[str, typer.Option(
        "--memory-format", help="contiguous or channels_last.")] = "contiguous",
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = 0.1,
    target_batch: Annotated[Optional[int], typer.Option(
        "--target-batch", min=1, max=MAX_BATCH,
        help="List the (micro-batch, accumulation) pairs that fit.")
    ] = None,
    world_size: WorldOpt = 1,
    device: Annotated[Optional[str], typer.Option(
        "--device", help="The device the estimate is for (it need not be here): cpu, cuda or "
        "cuda:N; its kernels are modelled. Default: cuda when this machine has it, else cpu.")
    ] = None,
    kernels: Annotated[Optional[KernelsChoice], typer.Option(
        "--kernels", help="Whose kernels to model: cuda (fused attention) or cpu. Default: "
        "--device's.")] = None,
    timeout: TimeoutOpt = "10m",
    json_out: JsonOpt = False,
) -> None:
    """Estimate one training step's memory without a GPU or weights, and what fits: exit 0
    when --micro-batch fits, 1 when it does not, 2 on bad input or a broken workload."""
    with _exits():
        from autotune import api, report

        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len, name=FLAGS)
        with err.status(Text("tracing the training step under fake tensors...")):
            result = api.estimate(
                spec, micro_batch=micro_batch, device_memory=device_memory,
                knobs=Knobs.checked(precision=precision.value, checkpointing=checkpointing,
                                    optimizer_impl=optimizer_impl, memory_format=memory_format,
                                    strategy=strategy),
                headroom=headroom, target_batch=target_batch, world_size=world_size,
                kernels=kernels.value if kernels else None, device=device,
                any_micro_batch=True, timeout_s=_seconds(timeout, "--timeout"), name=FLAGS)
        if json_out:
            print(report.to_json(result))
        else:
            for line in report.estimate_lines(result):
                out.print(line, highlight=False)
        if not result.fits():
            raise typer.Exit(1)


@app.command()
def check(
    path: Annotated[Path, typer.Argument(help="The autotune.json to check.")] = Path(
        "autotune.json"),
    measure: Annotated[Optional[bool], typer.Option(
        "--measure/--estimate",
        help="Run a real short step on the GPU, or use the fake-tensor estimator "
             "(default: measure when a CUDA device is here, else estimate).")] = None,
    workload: Annotated[Optional[str], typer.Option(
        "--workload", help="Use this path/to/file.py:factory instead of the one in the file "
                           "(e.g. after moving it).")] = None,
    timeout: TimeoutOpt = "10m",
) -> None:
    """Exit 0 if the tuned config still fits its device memory, 1 if not, 2 on bad input or a
    broken workload."""
    with _exits():
        from autotune import api

        spec = api.workload_spec(workload=workload, name=FLAGS) if workload is not None else None
        with err.status(Text("checking the tuned config's memory...")):
            result = api.check(path, measure=measure, workload=spec,
                               timeout_s=_seconds(timeout, "--timeout"))
        out.print(result.message, highlight=False, markup=False)
        if not result.fits:
            raise typer.Exit(1)


@app.command()
def codegen(
    config_path: Annotated[Path, typer.Argument(
        help="The autotune.json written by `autotune search`.")] = Path("autotune.json"),
    workload: Annotated[Optional[str], typer.Option(
        "--workload", help="Use this path/to/file.py:factory instead of the one in the file "
                           "(e.g. after moving it).")] = None,
    out_dir: Annotated[Path, typer.Option(
        "--out", file_okay=False, help="Folder for train_autotuned.py.")] = Path("."),
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite an existing train_autotuned.py.")] = False,
) -> None:
    """Write train_autotuned.py: a plain PyTorch training loop with the tuned values."""
    with _exits():
        from autotune import api

        spec = api.workload_spec(workload=workload, name=FLAGS) if workload is not None else None
        path = api.codegen(config_path, workload=spec, out=out_dir, force=force)
        err.print(f"wrote {path}", highlight=False, markup=False, emoji=False)
        out.print(f"python {path} --steps 100", highlight=False, markup=False, emoji=False)


@app.command("export")
def export_command(
    to: Annotated[str, typer.Option(
        "--to", help="The tool: deepspeed (ds_config.json), torchtitan (torchtitan.toml) or "
                     "accelerate (accelerate_config.yaml).", show_default=False)],
    config_path: Annotated[Path, typer.Argument(
        help="The autotune.json written by `autotune search`.")] = Path("autotune.json"),
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="The file to write (or a folder for the default name).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write the tuned config as DeepSpeed's, torchtitan's or Accelerate's own config file."""
    with _exits():
        from autotune.export import export_config

        path, result = export_config(config_path, to, output, force=force)
        for note in result.notes:
            err.print(Text.assemble(("note:", "yellow"), " ", note))
        err.print(f"wrote {path}", highlight=False, markup=False, emoji=False)


@app.command("report")
def report_command(
    config_path: Annotated[Path, typer.Argument(
        help="An autotune.json written by `autotune search` (any schema it reads).")] = Path(
        "autotune.json"),
    out_path: Annotated[Optional[Path], typer.Option(
        "--out", dir_okay=False,
        help="Where to write the page (default: beside CONFIG_PATH, as .html).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite an existing file (a page written for this same "
                        "autotune.json is replaced without it).")] = False,
) -> None:
    """Write autotune.html: the search's plots (memory, throughput, timeline, compile
    break-even) in one page that opens offline."""
    with _exits():
        from autotune.report_html import write_html  # not via api, which imports torch
        from autotune.schema import read_tuned

        config = read_tuned(config_path)
        path = write_html(config, out_path or config_path.with_suffix(".html"), force=force)
        err.print(f"wrote {path}", highlight=False, markup=False, emoji=False)
        out.print(f"xdg-open {path}", highlight=False, markup=False, emoji=False)


@app.command("schema")
def schema_command() -> None:
    """Print the JSON Schema of autotune.json (the fields, their types and ranges)."""
    with _exits():
        import json

        from autotune.schema import json_schema  # not via api, which imports torch


        print(json.dumps(json_schema(), indent=2))


cache_app = typer.Typer(
    help="The local study store: a repeated search reuses the runs it holds.",
    no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("list")
def cache_list(json_out: JsonOpt = False) -> None:
    """Show the stored studies: what each search was for, its runs, its last run."""
    with _exits():
        import json

        from autotune import report
        from autotune.search import list_studies

        path, studies = list_studies()
        if json_out:
            print(json.dumps({"store": str(path), "studies": [
                {"name": s.name, "key": s.key, "num_runs": s.num_runs,
                 "last_run_at": s.last_run_at} for s in studies]}, indent=2))
            return
        if not studies:
            out.print(f"no stored studies ({path})", highlight=False, markup=False)
            return
        out_for_tables().print(report.cache_table(path, studies))
        out.print("open it in optuna-dashboard: optuna-dashboard sqlite:///" + str(path),
                  highlight=False, markup=False)


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove the local study store (every stored study; a search starts afresh)."""
    with _exits():
        from autotune.search import clear_studies

        removed = clear_studies()
        for path in removed:
            err.print(f"removed {path}", highlight=False, markup=False)
        if not removed:
            err.print("nothing to remove: the study store is empty", highlight=False,
                      markup=False)


def main() -> None:
    """The CLI, under the autotune process's signal policy (``signals.take_process_signals``;
    the ``autotune`` command's entry point, ``autotune.__main__``, takes it before this module
    is imported): SIGTERM (``timeout``, a CI cancel, ``docker stop``) ends autotune the way
    Ctrl-C does, the running child killed with its process group, the best so far kept."""
    take_process_signals()
    try:
        app(prog_name="autotune")
    finally:
        ending()


if __name__ == "__main__":
    sys.exit(main())
