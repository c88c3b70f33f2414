"""A real allocator error said by the out-of-memory fallback's clause, in the library and in
the generated script alike (``autotune.oom_text.oom_cause``; ``train_autotuned.py``'s copy).

Run: ``python benchmarks/oom_cause_check.py [--device cpu|cuda]``: asks the device's allocator
for far more than it has, and prints the error's first line and both clauses.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.codegen_fallback import FALLBACK
from autotune.codegen_memory import MEMORY
from autotune.oom_text import oom_cause
from autotune.trial import is_out_of_memory


def script_oom_cause() -> types.FunctionType:
    """The generated script's ``oom_cause``, with the helpers it calls, executed alone."""
    namespace: dict[str, object] = {}
    exec("import errno, re\nimport torch\nimport torch.distributed as dist\n" + MEMORY
         + FALLBACK, namespace)
    return namespace["oom_cause"]  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    try:
        torch.empty(2**50, dtype=torch.uint8, device=args.device)
    except Exception as exc:  # an out-of-memory error is what it asks for; any other, said
        if not is_out_of_memory(exc):
            print(f"{args.device}: not an out-of-memory error: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return 2
        caught = exc
    else:
        print(f"{args.device}: 1 PiB was allocated: no error to say", file=sys.stderr)
        return 1
    library, script = oom_cause(caught), script_oom_cause()(caught)
    print(f"{args.device} ({torch.__version__}): {type(caught).__name__}: "
          f"{str(caught).splitlines()[0][:160]}")
    print(f"  library: {library}\n  script:  {script}\n  equal: {library == script}")
    return 0 if library == script else 1


if __name__ == "__main__":
    raise SystemExit(main())
