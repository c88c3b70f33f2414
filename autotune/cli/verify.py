"""``autotune verify``: a tuned config's step run as your own loop runs it, its samples/s and
peak beside what the search reported (issue 62)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from autotune.cli.options import TimeoutOpt, seconds
from autotune.cli.output import err, exits, out
from autotune.names import FLAGS


def verify(
    path: Annotated[Path, typer.Argument(help="The autotune.json to verify.")] = Path(
        "autotune.json"),
    workload: Annotated[Optional[str], typer.Option(
        "--workload", help="Use this path/to/file.py:factory instead of the one in the file "
                           "(e.g. after moving it).")] = None,
    steps: Annotated[int, typer.Option(
        "--steps", min=1, max=10_000, help="Optimizer steps timed after 2 warm-up steps.")] = 10,
    timeout: TimeoutOpt = "10m",
) -> None:
    """Run the tuned config's step as your loop runs it (autotune.load, cfg.compile,
    cfg.build_optimizer, cfg.train_step) in a fresh child capped at its budget, compiled as a
    first launch compiles it; print its samples/s and peak beside the reported ones. Exit 0
    when the peak is within the reported one plus the config's headroom, 1 when it is over
    (or the loop ran out of memory under the cap), 2 on bad input or a broken workload."""
    with exits():
        from autotune import api

        spec = api.workload_spec(workload=workload, name=FLAGS) if workload is not None else None
        with err.status(Text("running the tuned config as your loop runs it...")):
            result = api.verify(path, workload=spec, num_timed_steps=steps,
                                timeout_s=seconds(timeout, "--timeout"))
        for line in result.lines:
            out.print(line, highlight=False, markup=False)
        if not result.as_reported:
            raise typer.Exit(1)
