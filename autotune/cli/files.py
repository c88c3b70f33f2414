"""``autotune codegen``, ``export``, ``report`` and ``schema``: the files made from a tuned
``autotune.json`` (the training script, other tools' configs, the HTML page) and its schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from autotune.cli.output import err, exits, out
from autotune.names import FLAGS


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
    with exits():
        from autotune import api

        spec = api.workload_spec(workload=workload, name=FLAGS) if workload is not None else None
        path = api.codegen(config_path, workload=spec, out=out_dir, force=force)
        err.print(f"wrote {path}", highlight=False, markup=False, emoji=False)
        out.print(f"python {path} --steps 100", highlight=False, markup=False, emoji=False)


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
    with exits():
        from autotune.export import export_config

        path, result = export_config(config_path, to, output, force=force)
        for note in result.notes:
            err.print(Text.assemble(("note:", "yellow"), " ", note))
        err.print(f"wrote {path}", highlight=False, markup=False, emoji=False)


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
    with exits():
        from autotune.report_html import write_html  # not via api, which imports torch
        from autotune.tuned_file import read_tuned

        config = read_tuned(config_path)
        path = write_html(config, out_path or config_path.with_suffix(".html"), force=force)
        err.print(f"wrote {path}", highlight=False, markup=False, emoji=False)
        out.print(f"xdg-open {path}", highlight=False, markup=False, emoji=False)


def schema_command() -> None:
    """Print the JSON Schema of autotune.json (the fields, their types and ranges)."""
    with exits():
        import json

        from autotune.tuned_file import json_schema  # not via api, which imports torch


        print(json.dumps(json_schema(), indent=2))

