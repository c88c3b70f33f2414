"""A child for the tests of ``autotune.child``: writes what it sees of its own process as JSON
to the path in ``sys.argv[1]``, then does what ``sys.argv[2]`` says (no autotune import)."""

from __future__ import annotations

import json
import os
import sys


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmSize", "VmPeak"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def main() -> None:
    path, action = sys.argv[1], sys.argv[2]
    state = {"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
             "pgid": os.getpgid(0), "cwd": os.getcwd(), "path0": sys.path[0],
             "env": dict(os.environ), "stdin_is_null": os.path.samestat(
                 os.fstat(0), os.stat(os.devnull)), "torch_loaded": "torch" in sys.modules}
    if action == "threads":  # torch's intra-op threads start, as a trial's do before its baseline
        import torch

        torch.ones(64, 64) @ torch.ones(64, 64)
        status = _status()
        state["vm_peak_over_size"] = status["VmPeak"] - status["VmSize"]
    with open(path, "w") as f:
        json.dump(state, f)
    print("the child's own output")
    if action == "exit":
        sys.exit(3)
    if action == "raise":
        raise ValueError("raised on purpose")
    if action == "sleep":
        import time

        time.sleep(60)


if __name__ == "__main__":
    main()
