"""A user's workload code: the file and factory ``--workload`` names, the traceback of what
it raised (its own frames, not ours), and the checks of what its model and loss return.

Everything here reads user code or what it returned, and says what was wrong in the user's
terms (``WorkloadError``, ``ConfigError``): ``builtin_workloads.load_workload`` imports the
file, the child's step checks the model and the loss.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.errors import ConfigError, WorkloadError
from autotune.files import not_a_file
from autotune.names import KEYWORDS, Names


def split_factory(target: str, name: Names = KEYWORDS) -> tuple[Path, str]:
    """Split ``path/to/file.py:factory`` and check the file exists.

    Args:
        target: the workload as given.
        name: how the user wrote the setting (``--workload`` or ``workload=``).

    Raises:
        ConfigError: no ``:factory`` part, or the file does not exist.
    """
    given = name.given("workload", target)
    path_text, sep, factory = target.rpartition(":")
    if not sep or not path_text or not factory.isidentifier():
        raise ConfigError(
            f"{given} must look like path/to/file.py:factory "
            "(a Python file and the function in it that returns autotune.Workload)"
        )
    path = Path(path_text)
    if path.is_dir():
        raise ConfigError(
            f"workload file {path_text!r} is a directory, not a Python file (from {given}): "
            f"name the .py file that defines {factory}, e.g. {path_text}/model.py")
    kind = not_a_file(path)
    if kind is not None:
        raise ConfigError(
            f"workload file {path_text!r} is {kind}, not a regular file (from {given}): name "
            f"the .py file that defines {factory}")
    if not path.is_file():
        raise ConfigError(f"workload file {path_text!r} does not exist (from {given})")
    return path, factory


def import_file(path: Path) -> Any:
    module_name = f"autotune_user_workload_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        raise exited(exc) from exc
    except Exception as exc:
        raise WorkloadError(with_traceback(
            f"importing workload file {path} raised {type(exc).__name__}: {exc}", exc)) from exc
    return module


def exited(exc: SystemExit) -> WorkloadError:
    error = WorkloadError.from_exit(exc)
    return WorkloadError(with_traceback(str(error), exc))


def with_traceback(message: str, exc: BaseException) -> str:
    frames = user_traceback(exc)
    return f"{message}\n{frames}" if frames else message


_MAX_USER_FRAMES = 6
_NOT_USER_CODE = tuple(
    os.path.realpath(p) + os.sep
    for p in (Path(__file__).parent, Path(torch.__file__).parent, sysconfig.get_paths()["stdlib"])
)


def user_traceback(exc: BaseException) -> str:
    """The workload's own frames of the traceback of ``exc`` (of its cause, when ``exc`` is a
    ``WorkloadError`` wrapping one), most recent last: at most 6 frames, 2 lines each.

    Frames in autotune's, torch's and the standard library's files are left out: the user needs
    the line of their code that failed, not ours. Empty when no frame is the workload's.
    """
    if isinstance(exc, WorkloadError) and exc.__cause__ is not None:
        exc = exc.__cause__
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if not frame.filename.startswith("<")
              and not os.path.realpath(frame.filename).startswith(_NOT_USER_CODE)]
    if not frames:
        return ""
    lines = ["Traceback (the workload's frames, most recent call last):"]
    if len(frames) > _MAX_USER_FRAMES:
        lines.append(f"  ... {len(frames) - _MAX_USER_FRAMES} earlier frames")
    for frame in frames[-_MAX_USER_FRAMES:]:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    return "\n".join(lines)


def check_model(model: Any, name: str) -> None:
    """Check that ``build_model()`` returned an ``nn.Module`` with something to train.

    Raises:
        WorkloadError: not a module, or no parameter that requires grad.
    """
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"workload {name!r}: build_model returned {type(model).__name__}; it must return a "
            "torch.nn.Module"
        )
    params = list(model.parameters())
    if not any(p.requires_grad for p in params):
        what = (f"all {len(params)} of its parameter tensors are frozen (requires_grad=False)"
                if params else "it has no parameters")
        raise WorkloadError(
            f"workload {name!r}: the model build_model returned has nothing to train: {what}; "
            "leave at least one parameter trainable"
        )


def check_loss(loss: Any, name: str) -> None:
    """Check that a workload's loss is a scalar floating-point tensor that requires grad.

    Reads only metadata (type, ``dim``, ``dtype``, ``requires_grad``): no device sync, and it
    works on fake tensors.

    Raises:
        WorkloadError: what the loss is instead, and how to fix it.
    """
    if not isinstance(loss, torch.Tensor):
        seen = type(loss).__name__
        if isinstance(loss, (int, float, bool)):
            seen += f" {loss!r}"
        raise WorkloadError(
            f"workload {name!r}: loss returned {seen}; it must return a scalar torch.Tensor "
            "that requires grad"
        )
    if loss.dim() != 0:
        raise WorkloadError(
            f"workload {name!r}: loss returned a tensor of shape {tuple(loss.shape)}; it must be "
            "a scalar: reduce it, e.g. .mean()"
        )
    if not loss.dtype.is_floating_point:
        raise WorkloadError(
            f"workload {name!r}: loss returned a tensor of dtype {loss.dtype}; it must be "
            "floating point (e.g. .float() before reducing)"
        )
    if not loss.requires_grad:
        raise WorkloadError(
            f"workload {name!r}: loss returned a tensor that does not require grad; it must be "
            "computed from the model's output (not under torch.no_grad(), not detached)"
        )
