"""The ``autotune`` command: thin typer adapters over ``autotune.api``.

Torch is imported only inside commands, so ``autotune --help`` stays fast.
Logs and progress go to stderr, results to stdout.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from autotune.errors import AutotuneError

app = typer.Typer(
    help="Find the fastest way to train your model at the effective batch size you want.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True)

WorkloadOpt = Annotated[Optional[str], typer.Option(
    "--workload", help="Your workload: path/to/file.py:factory returning autotune.Workload.")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", help="A Hugging Face model id or local directory (random weights).")]
SeqLenOpt = Annotated[Optional[int], typer.Option(
    "--seq-len", help="Worst-case sequence length for --model.")]
PretrainedOpt = Annotated[bool, typer.Option(
    "--pretrained", help="Load real weights for --model (downloads them).")]
TargetOpt = Annotated[int, typer.Option(
    "--target-batch", min=1,
    help="Effective batch size (samples per optimizer step, all devices).")]
WorldOpt = Annotated[int, typer.Option("--world-size", min=1, help="Data-parallel devices.")]
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
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]


@contextlib.contextmanager
def _exits() -> Iterator[None]:
    """Turn library errors into a message on stderr and the error's exit code."""
    try:
        yield
    except AutotuneError as exc:
        err.print(f"[bold red]error:[/bold red] {exc}", highlight=False, markup=True)
        raise typer.Exit(exc.exit_code) from None


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


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
def probe(
    target_batch: TargetOpt = 64,
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    seq_len: SeqLenOpt = None,
    pretrained: PretrainedOpt = False,
    world_size: WorldOpt = 1,
    device: DeviceOpt = None,
    memory_budget: BudgetOpt = None,
    headroom: HeadroomOpt = 0.1,
    precisions: PrecisionsOpt = None,
    compile_modes: ModesOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Find the largest micro-batch that fits, for each precision and compile mode."""
    with _exits():
        from autotune import api, report

        spec = api.workload_spec(workload=workload, model=model, seq_len=seq_len,
                                 pretrained=pretrained)
        with err.status("probing memory with real training steps...") as status:
            def on_step(memory_class, step):
                err.print(report.probe_step_line(memory_class.label(), step), highlight=False)
                status.update(f"probing memory: {memory_class.label()} done up to micro-batch "
                              f"{step.micro_batch}...")

            result = api.probe(
                spec, target_batch=target_batch, world_size=world_size, device=device,
                memory_budget=memory_budget, headroom=headroom, precisions=_split(precisions),
                compile_modes=_split(compile_modes), on_step=on_step)
        if json_out:
            print(report.to_json(result))
            return
        out.print(report.probe_table(result))
        for line in report.probe_footer(result):
            out.print(line, highlight=False)


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

        path = api.codegen(config_path, workload=workload, out=out_dir, force=force)
        err.print(f"wrote {path}", highlight=False)
        out.print(f"python {path} --steps 100", highlight=False)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="autotune")


if __name__ == "__main__":
    sys.exit(main())
