"""``autotune.search(...)``: the search from Python (a notebook, a script, an agent's loop).

The CLI's ``autotune search`` prints its progress; here progress is an optional callback
(nothing is printed), and the result is the tuned config itself (``Tuned``), ready to apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from autotune import report_progress
from autotune.api.request import TuneRequest, workload_spec
from autotune.api.settings import check_settings
from autotune.api.tune import search as run_pipeline
from autotune.config import Knobs, ProbeStep, WorkloadSpec
from autotune.errors import ConfigError
from autotune.names import KEYWORDS
from autotune.schema import TrialRecord
from autotune.search import Candidate, RunCount, SearchSettings
from autotune.usage import Tuned


@dataclass(frozen=True)
class Progress:
    """One step of a search, as ``autotune search`` prints it: ``str(progress)`` is the line.

    ``kind`` is ``probe`` (a memory probe ended: ``label`` is its knob class, ``micro_batch``
    the size tried), ``trial`` (a timed run ended: ``record`` holds its outcome) or
    ``start`` (a timed run begins, ``line`` says which). ``runs`` counts the child runs so
    far, ``count`` with them the forecast of all and the time left (an estimate that
    changes as evidence arrives; None for a probe)."""

    kind: Literal["probe", "start", "trial"]
    line: str
    label: str
    micro_batch: int
    runs: int | None = None
    stage: str | None = None
    record: TrialRecord | None = None
    count: RunCount | None = None

    def __str__(self) -> str:
        return self.line


OnProgress = Callable[[Progress], None]


def search(
    workload: str | WorkloadSpec | TuneRequest | None = None,
    *,
    target_batch: int = 64,
    model: str | None = None,
    seq_len: int | None = None,
    out: str | Path | None = None,
    force: bool = False,
    progress: OnProgress | None = None,
    time_budget_s: float | None = None,
    max_trials: int | None = None,
    settings: SearchSettings | None = None,
    **fields: Any,
) -> Tuned:
    """Search the fastest config for ``target_batch``, as ``autotune search`` does, and return
    it ready to use (what ``autotune.load`` returns for the file it writes).

    Every probe and trial runs your workload in a child process with a timeout, as on the
    command line; nothing is printed (pass ``progress`` to see each step).

    Example:
        >>> cfg = autotune.search("train.py:make_workload", target_batch=64,
        ...                       device="cpu", precisions=["fp32"], progress=print)
        >>> cfg.micro_batch, cfg.accumulate_steps
        (32, 2)

    Args:
        workload: ``"file.py:factory"`` (the factory returns an ``autotune.Workload``), a
            ``WorkloadSpec``, a whole ``TuneRequest`` (then give no request fields), or None
            for the built-in workload (or ``model``).
        target_batch: the effective batch, samples per optimizer step over all devices.
        model: a Hugging Face model id instead of ``workload`` (``--model``).
        seq_len: its sequence length (``--seq-len``).
        out: a folder to write ``autotune.json``, ``train_autotuned.py`` and
            ``autotune.html`` into (default None: write nothing).
        force: overwrite those files.
        progress: called with a ``Progress`` after each memory probe and before and after
            each timed run (``progress=print`` prints the CLI's lines).
        time_budget_s: stop after this many seconds, keeping the best so far
            (``--time-budget``).
        max_trials: most child runs, probes included (``--max-trials``).
        settings: every other search setting (``autotune.search.SearchSettings``).
        **fields: ``TuneRequest`` fields: ``device``, ``memory_budget``, ``headroom``,
            ``world_size``, ``precisions``, ``compile_modes``, ``knob_values``,
            ``nproc_per_node``, ``allow_inexact``, ``parallel`` (child runs at once, each
            on its own device or cores: a number, or ``"auto"``; ``--parallel``).

    Returns:
        ``Tuned``: ``micro_batch``, ``accumulate_steps``, ``knobs``, ``config`` (the whole
        ``autotune.json``) and the helpers that apply them.

    Raises:
        ConfigError: a bad setting (each named, with its value), an existing output
            without ``force``. WorkloadError: the workload is broken.
        NoFeasibleConfigError: nothing fits the memory budget.
        Interrupted: Ctrl-C or SIGTERM (the best so far written to ``out`` first).
    """
    limits = {k: v for k, v in (("time_budget_s", time_budget_s), ("max_trials", max_trials))
              if v is not None}  # None: the settings' own
    check_settings(  # before anything starts, every problem at once, named as passed here
        KEYWORDS, settings if isinstance(settings, SearchSettings) else None,
        request_fields={} if isinstance(workload, TuneRequest) else fields,
        **({} if workload is None or isinstance(workload, (str, TuneRequest)) else
           {"workload": workload}),
        target_batch=target_batch, model=model, seq_len=seq_len, out=out, force=force,
        progress=progress, settings=settings, **limits)
    settings = replace(settings or SearchSettings(), **limits)
    request = _request(workload, target_batch, model, seq_len, fields)
    result = run_pipeline(request, out=out, force=force, settings=settings, name=KEYWORDS,
                          **_callbacks(progress))
    return Tuned(result.config)


def _request(workload: str | WorkloadSpec | TuneRequest | None, target_batch: int,
             model: str | None, seq_len: int | None, fields: dict[str, Any]) -> TuneRequest:
    if isinstance(workload, TuneRequest):
        if fields or model or seq_len is not None:
            raise ConfigError("give a TuneRequest or its fields (model, seq_len, device, ...), "
                              f"not both (got {sorted(fields) + (['model'] if model else [])})")
        return workload
    spec = workload if isinstance(workload, WorkloadSpec) else workload_spec(
        workload=workload, model=model, seq_len=seq_len, name=KEYWORDS)
    return TuneRequest(workload=spec, target_batch=target_batch, **fields)


def _callbacks(progress: OnProgress | None) -> dict[str, Any]:
    """``on_step`` and ``on_trial`` for the pipeline, each handing ``progress`` one line."""
    if progress is None:
        return {}

    def on_step(knobs: Knobs, step: ProbeStep) -> None:
        if not step.timed:  # a timed probe is a trial: on_trial says it
            progress(Progress(kind="probe",
                              line=report_progress.probe_step_line(knobs.label(), step),
                              label=knobs.label(), micro_batch=step.micro_batch))

    def on_trial(count: RunCount, stage: str, candidate: Candidate,
                 record: TrialRecord | None) -> None:
        label, micro_batch = candidate.knobs.label(), candidate.micro_batch
        if record is None:
            line = report_progress.run_line(count, stage, candidate.key())
            progress(Progress(kind="start", line=line, label=label, micro_batch=micro_batch,
                              runs=count.done, stage=stage, count=count))
        else:
            progress(Progress(kind="trial", line=report_progress.trial_line(record, stage),
                              label=label, micro_batch=micro_batch, runs=count.done,
                              stage=stage, record=record, count=count))

    return {"on_step": on_step, "on_trial": on_trial}
