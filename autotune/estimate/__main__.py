"""The estimator's child process (``python -m autotune.estimate``, started by ``api.fit``)."""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError, UntraceableStepError, WorkloadError
from autotune.estimate.fits import EstimateRequest, estimate_report


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """The estimator's child process: the workload is built and traced here, under the
    parent's timeout, so a workload that exits, crashes or hangs decides no exit code."""
    from autotune.builtin_workloads import load_workload
    from autotune.config import WorkloadSpec
    from autotune.serialize import from_json_dict, to_json_dict

    spec = from_json_dict(WorkloadSpec, request["workload"])
    asked = from_json_dict(EstimateRequest, request["request"])
    try:
        workload = load_workload(spec, "cuda" if asked.kernels == "cuda" else "cpu")
        return {"report": to_json_dict(estimate_report(workload, asked))}
    except UntraceableStepError as exc:
        return {"error": "untraceable", "message": str(exc)}
    except WorkloadError as exc:
        return {"error": "workload", "message": str(exc)}
    except ConfigError as exc:
        return {"error": "config", "message": str(exc)}


if __name__ == "__main__":
    from autotune.runner import child_main

    child_main(handle)
