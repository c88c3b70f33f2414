"""The constrained field types of ``autotune.json`` (``autotune.schema``'s records use them): a
float that may be written as ``"inf"`` or ``"nan"``, counts and batch sizes with their ranges.
No torch import here."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from autotune.units import MAX_BATCH


def _non_finite(value: Any) -> Any:
    """``to_json_dict`` writes inf and nan as the strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


Float = Annotated[float, BeforeValidator(
    _non_finite, json_schema_input_type=float | Literal["inf", "-inf", "nan"])]
"""A float field of the file: a JSON number, or ``"inf"`` / ``"-inf"`` / ``"nan"``."""
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]
"""A count of samples, micro-batches or devices: at most ``MAX_BATCH`` (the sums on it stay
quick)."""
