"""A child for the tests of ``runner.run_in_child``: does what its request says (no torch)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

from autotune.runner import child_main


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """``echo`` the value back, ``raise``, ``exit`` with a code, ``os_exit``, ``sleep``, or
    ``rmdir``: remove the folder the child's files are in (a $TMPDIR cleaner), then return."""
    action = request["do"]
    if action == "rmdir":
        shutil.rmtree(os.path.dirname(sys.argv[2]), ignore_errors=True)
    if action == "raise":
        raise ValueError("the handler failed on purpose")
    if action == "exit":
        sys.exit(request["code"])
    if action == "os_exit":
        os._exit(request["code"])
    if action == "sleep":
        time.sleep(request["seconds"])
    return {"echo": request.get("value"), "pid": os.getpid(),
            "malloc": os.environ.get("MALLOC_ARENA_MAX")}


if __name__ == "__main__":
    child_main(handle)
