"""``autotune env``, ``probe`` and ``search``: the device's facts, the largest micro-batch
that fits, and the search that writes the tuned ``autotune.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from autotune.cli.options import (
    KNOB_OPTIONS,
    BudgetOpt,
    DeviceOpt,
    HeadroomOpt,
    JsonOpt,
    KnobOptions,
    LengthsOpt,
    ModelOpt,
    ModesOpt,
    NprocOpt,
    ParallelOpt,
    PrecisionsOpt,
    PretrainedOpt,
    SeqLenOpt,
    TargetOpt,
    TrialTimeoutOpt,
    WorkloadOpt,
    WorldOpt,
    knob_options,
    parallel_option,
    seconds,
    split_knob_options,
    split_option,
)
from autotune.cli.output import err, exits, out, out_for_tables, progress_bar, say
from autotune.names import FLAGS


def env(device: DeviceOpt = None, json_out: JsonOpt = False) -> None:
    """Print the facts autotune uses: torch, CUDA, device name and memory, bf16 support."""
    with exits():
        from autotune import api, report

        info = api.env(device)
        if json_out:
            print(report.to_json(info))
        else:
            out.print(report.env_table(info))


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
    with exits():
        from autotune import api, report, report_progress

        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len,
                                 pretrained=pretrained, lengths=lengths, name=FLAGS)
        with err.status(Text("probing memory with real training steps...")) as status:
            def on_step(knobs, step):
                say(err, report_progress.probe_step_line(knobs.label(), step))
                status.update(Text(f"probing memory: {knobs.label()} done up to "
                                   f"micro-batch {step.micro_batch}..."))

            request = api.TuneRequest(
                workload=spec, target_batch=target_batch, world_size=world_size, device=device,
                memory_budget=memory_budget, headroom=headroom,
                precisions=split_option(precisions, "--precisions"),
                compile_modes=split_option(compile_modes, "--compile-modes"),
                knob_values=split_knob_options(knob_options),
                nproc_per_node=nproc_per_node)
            result = api.probe(request, timeout_s=seconds(trial_timeout, "--trial-timeout"),
                               on_step=on_step, name=FLAGS)
        if json_out:
            print(report.to_json(result))
            return
        console = out_for_tables()
        console.print(report.probe_table(result))
        for line in report.probe_footer(result):
            say(console, line)


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
    parallel: ParallelOpt = "1",
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
    join: Annotated[bool, typer.Option(
        "--join", help="Share the --storage study (PostgreSQL) with the searches of other "
                       "nodes: each claims a run before it starts, so together they run each "
                       "candidate once.")] = False,
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
    with exits() as done:
        from autotune import api, errors, report, report_progress
        from autotune.search import SearchSettings

        if micro_batches != "all" and not micro_batches.isdigit():
            raise errors.ConfigError(
                f"--micro-batches must be a number or 'all', got {micro_batches!r}")
        settings = SearchSettings(
            num_timed_steps=timed_steps, rank_precision=rank_precision or None,
            max_trials=max_trials, train_steps=train_steps,
            refine_within=refine_within, confirm_within=confirm_within,
            micro_batches_per_class=0 if micro_batches == "all" else int(micro_batches),
            time_budget_s=seconds(time_budget, "--time-budget") if time_budget else None,
            timeout_s=seconds(trial_timeout, "--trial-timeout"),
            storage=storage, study_name=study_name, join=join, cache=not no_cache,
            fresh=fresh)
        try:  # the device it runs on, named (a device not there: the search says so)
            info = api.env(device)
        except errors.ConfigError:
            info = None
        say(err, report_progress.start_line(workload or model or "the built-in GPT", info,
                                            target_batch))  # at once: the bar shows nowhere
        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len,
                                 pretrained=pretrained, lengths=lengths, name=FLAGS)
        request = api.TuneRequest(
            workload=spec, target_batch=target_batch, world_size=world_size, device=device,
            memory_budget=memory_budget, headroom=headroom,
            precisions=split_option(precisions, "--precisions"),
            compile_modes=split_option(compile_modes, "--compile-modes"),
            knob_values=split_knob_options(knob_options),
            nproc_per_node=nproc_per_node, allow_inexact=allow_inexact,
            parallel=parallel_option(parallel))
        for line in request.demo_defaults(info)[1] if info is not None else ():
            say(err, line)  # what the first search tries, before it starts
        with progress_bar() as progress:
            task = progress.add_task("probing memory", total=None)

            def on_step(knobs, step):  # a timed probe is a trial: on_trial says it
                if not step.timed:
                    say(err, report_progress.probe_step_line(knobs.label(), step))

            def on_trial(count, stage, candidate, record):
                if record is not None:
                    say(err, report_progress.trial_line(record, stage))
                progress.update(task, completed=count.done, total=count.total,
                                description=report_progress.run_line(
                                    count, stage, candidate.key(), starting=record is None))

            result = api.search(request, out=out, force=force, settings=settings,
                                on_step=on_step, on_trial=on_trial, name=FLAGS)
            done.written = result.path  # a signal from here on: the files are written
        if json_out:
            print(report.to_json(result.config))
        else:
            out_console = out_for_tables()
            out_console.print(report.search_table(result.config, width=out_console.width))
            for line in report.search_footer(result):
                say(out_console, line)
        if result.config.interrupted and result.stop_reason.by_signal:
            raise typer.Exit(result.stop_reason.exit_code)
