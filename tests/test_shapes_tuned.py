"""A tuned compiled config holds on real data under each shape policy (issue 48).

``autotune.load`` applies the tuned policy: ``cfg.pad_to`` pads a batch to what the policy
says (the worst case, the next bucket length, or its own length), ``cfg.batch`` marks the
sequence dimension dynamic under ``dynamic``, ``cfg.compile`` compiles static graphs under
``buckets``. Fed 30 batches of random lengths, each frame compiles at most the policy's bound
of graphs (``max`` and ``dynamic``: one; ``buckets``: one per bucket, under the recompile
limit) and no frame falls back to eager.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import replace

import pytest
import torch

from autotune.builtin_workloads import load_workload
from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.knobs import Knobs
from autotune.lengths import MAX_BUCKETS, RECOMPILE_LIMIT
from autotune.usage import RecompileLimitWarning, Tuned
from tests import workloads
from tests.conftest import workload_target
from tests.test_compile_shapes import _Compiles, compiles  # noqa: F401 (the fixture)
from tests.tuned_configs import small


def _tuned(shapes: str, compile_mode: str = "default") -> Tuned:
    config = small(compile_mode=compile_mode, micro_batch=2, accumulate_steps=1, target_batch=2)
    return Tuned(replace(config, workload=WorkloadSpec(kind="file", target=workload_target(
        "varlen")), knobs=Knobs(compile_mode=compile_mode, shapes=shapes)))  # type: ignore[arg-type]


def test_pad_to_pads_as_the_policy_says() -> None:
    worst = workloads.VARLEN_WORST
    assert _tuned("max", "off").pad_to(7) == worst
    assert _tuned("dynamic", "off").pad_to(7) == 7
    assert _tuned("longest", "off").pad_to(7) == 7  # the baseline: what a collate does
    buckets = _tuned("buckets", "off").bucket_lengths()
    assert 1 < len(buckets) <= MAX_BUCKETS and buckets[-1] == max(workloads.VARLEN_LENGTHS)
    for n in range(1, worst + 1):
        padded = _tuned("buckets", "off").pad_to(n)
        assert padded >= n and padded in buckets
    with pytest.raises(ConfigError, match=r"pad_to\(65\): .* 1 to 64 tokens"):
        _tuned("max", "off").pad_to(65)
    fixed = Tuned(small())
    with pytest.raises(ConfigError, match="declares no lengths"):
        fixed.pad_to(5)


@pytest.mark.subprocess  # inductor's compiler
@pytest.mark.parametrize(("shapes", "bound"), [  # max and buckets with the slow tests (the
    # buckets bound of a compiled trial: test_shapes.py's test_a_compiled_trial_stays_...)
    pytest.param("max", 1, marks=pytest.mark.slow),
    pytest.param("buckets", MAX_BUCKETS, marks=pytest.mark.slow),
    # dynamic too (70 s of compiles): the default run keeps test_shapes.py's trial of each policy
    pytest.param("dynamic", 1, marks=pytest.mark.slow)])
def test_a_tuned_compiled_config_fed_30_random_lengths_stays_within_its_policys_bound(
        compiles: _Compiles, shapes: str, bound: int) -> None:  # noqa: F811
    cfg = _tuned(shapes)
    workload = load_workload(cfg.config.workload)
    model = cfg.apply(workload.build_model())
    optimizer = cfg.build_optimizer(workload.make_optimizer(model.parameters()))
    compiled = cfg.compile(model)
    rng = random.Random(48)
    longest = [rng.randint(2, workloads.VARLEN_WORST) for _ in range(30)]
    assert len(set(longest)) > 15
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecompileLimitWarning)
        for n in longest:
            batch = cfg.batch(workload.make_batch(cfg.micro_batch, cfg.pad_to(n)))
            loss = cfg.train_step(compiled, optimizer, [batch], workload)
            assert torch.isfinite(loss)
    from torch._dynamo.utils import counters

    assert compiles.per_frame and max(compiles.per_frame.values()) <= bound < RECOMPILE_LIMIT, (
        compiles.per_frame)
    hits = [k for k in counters["unimplemented"] if "recompile limit" in k.lower()]
    assert not hits  # no frame fell back to eager


# slow, every policy: the everyday run keeps a trial timing drawn lengths (test_shapes.py,
# buckets) and the tuned config's padding of each length in this process (above)
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(("shapes", "compile_mode"), [
    ("max", "off"), ("buckets", "off"), ("dynamic", "off"), ("buckets", "default")])
def test_the_generated_script_trains_on_drawn_lengths_under_each_policy(
        tmp_path, shapes: str, compile_mode: str) -> None:
    import subprocess
    import sys

    from autotune.codegen import render_train_script
    from tests.tuned_configs import subprocess_env

    script = tmp_path / "train_autotuned.py"
    script.write_text(render_train_script(_tuned(shapes, compile_mode).config))
    text = script.read_text()
    assert f'shapes = "{shapes}"' in text and "def pad_to(longest):" in text
    done = subprocess.run([sys.executable, str(script), "--steps", "3", "--device", "cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 3/3" in done.stdout


def test_the_scripts_bucket_lengths_are_the_librarys() -> None:
    from autotune.codegen import render_train_script
    from autotune.lengths import bucket_lengths

    text = render_train_script(_tuned("buckets", "off").config)
    start = text.index("def bucket_lengths_of(")
    scope: dict[str, object] = {}
    exec("import math\n" + text[start:text.index("\n\n\n", start)], scope)
    for sample in ([5], [1, 2, 3], list(range(1, 300, 7)), [64] * 10 + [3, 900, 17]):
        for micro_batch in (1, 2, 7, 64):
            assert scope["bucket_lengths_of"](sample, micro_batch) == list(
                bucket_lengths(sample, micro_batch=micro_batch))


@pytest.mark.parametrize(("shapes", "padded"), [
    ("max", workloads.VARLEN_WORST), ("dynamic", 7), ("longest", 7)])
def test_the_scripts_pad_to_pads_as_the_librarys(shapes: str, padded: int) -> None:
    from autotune.codegen import render_train_script

    text = render_train_script(_tuned(shapes, "off").config)
    start = text.index("def pad_to(")
    scope: dict[str, object] = {"shapes": shapes, "worst_length": workloads.VARLEN_WORST}
    exec(text[start:text.index("\n\n\n", start)], scope)
    assert scope["pad_to"](7) == padded == _tuned(shapes, "off").pad_to(7)


def test_hugging_face_adapters_map_the_policy_where_they_can_and_say_the_rest() -> None:
    from autotune.knob_adapters import accelerator_kwargs, training_arguments

    kwargs, notes = training_arguments(Knobs(shapes="buckets"), "cpu")
    assert kwargs["group_by_length"] is True
    assert any("cfg.pad_to" in n and "pad_to_multiple_of" in n for n in notes)
    kwargs, notes = training_arguments(Knobs(shapes="dynamic"), "cpu")
    assert "group_by_length" not in kwargs and any("cfg.batch(batch)" in n for n in notes)
    _, notes = accelerator_kwargs(Knobs(shapes="buckets"))
    assert any("cfg.pad_to" in n for n in notes)
    kwargs, notes = training_arguments(Knobs(), "cpu")  # max: as before
    assert "group_by_length" not in kwargs and not any("shapes" in n for n in notes)
