"""docs/integrations.md: every snippet runs (the search from Python, Lightning, the exports)."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from tests.tuned_configs import REPO, my_workload_spec, small, write

DOC = REPO / "docs" / "integrations.md"


def snippets(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_every_snippet_is_one_these_tests_run() -> None:
    assert len(snippets("python")) == 2 and len(snippets("bash")) == 1
    fences = re.findall(r"^```(\w*)$", DOC.read_text(), flags=re.MULTILINE)
    assert len(fences) == 2 * 3 and set(fences[::2]) == {"python", "bash"}  # no other block


@pytest.mark.subprocess
@pytest.mark.slow  # a real search (25 s): autotune.search from Python runs everyday in
# test_python_api.py; this checks the page's snippet is that call
def test_search_from_python_snippet(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)  # the snippet names examples/my_workload.py from the repository
    namespace: dict = {}
    exec(compile(snippets("python")[0], str(DOC), "exec"), namespace)
    cfg = namespace["cfg"]
    assert cfg.micro_batch * cfg.accumulate_steps == 8
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"{cfg.micro_batch} {cfg.accumulate_steps} {cfg.knobs.label()}"
    assert len(printed) > 2  # the progress lines before it


def test_lightning_snippet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning.pytorch", reason="pip install -e '.[lightning]'")
    write(small(workload=my_workload_spec()), tmp_path / "autotune.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    namespace: dict = {"__name__": "snippet"}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers).*")
        exec(compile(snippets("python")[1], str(DOC), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.global_step == 3
    assert trainer.accumulate_grad_batches == 2
    assert trainer.lightning_module.batch_size == 2  # the tuned micro-batch, set by the callback


def test_export_snippet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(small(workload=my_workload_spec()), tmp_path / "autotune.json")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for line in snippets("bash")[0].splitlines():
        argv = shlex.split(line.partition("#")[0])
        assert argv[0] == "autotune"
        done = runner.invoke(app, argv[1:])
        assert done.exit_code == 0, (line, done.output)
    assert {p.name for p in tmp_path.iterdir()} >= {
        "ds_config.json", "job.toml", "accelerate_config.yaml"}
