"""Type checks of the interface blocks of the episode params, against the interface's own field types.

``seal_shared.interface`` reads ``observation_lite``, ``tool_feedback_evolution`` and ``diagnostic_evolution``
into dataclasses and rejects unknown keys, but a known key with a value of the wrong type (a number
where a list of names belongs) used to fail deep inside the episode as an internal error. Here every
known key is validated (and coerced, in pydantic's lax mode: ``"true"`` for a bool is fine) against
the type annotation of the dataclass field it fills, so ``/create`` answers one line naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from pydantic import TypeAdapter, ValidationError


@functools.cache
def _field_adapters(key: str) -> dict[str, TypeAdapter]:
    from seal_shared.interface.episode import DiagnosticEvolutionParams, ObservationLiteParams, ToolFeedbackParams
    from seal_shared.interface.guidelines import GuidelineConfig

    classes = {"observation_lite": (ObservationLiteParams,), "tool_feedback_evolution": (ToolFeedbackParams,),
               "diagnostic_evolution": (DiagnosticEvolutionParams, GuidelineConfig)}[key]
    adapters: dict[str, TypeAdapter] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            adapters.setdefault(f.name, TypeAdapter(hints[f.name]))
    if key == "diagnostic_evolution":
        adapters["category_tags"] = TypeAdapter(bool)  # the release's name for per_category
    return adapters


def check_block(key: str, block: Any) -> dict[str, Any] | None:
    """``block`` with its known keys type-checked; raises ``ValueError`` naming ``params.<key>.<field>``."""
    if block is None:
        return None
    if not isinstance(block, dict):
        raise ValueError(f"params.{key} must be an object or null, got {type(block).__name__}")
    adapters = _field_adapters(key)
    out = dict(block)
    for name, value in block.items():
        adapter = adapters.get(name)
        if adapter is None:
            continue  # unknown keys are reported by the interface, with the list of known ones
        try:
            out[name] = adapter.validate_python(value)
        except ValidationError as err:
            first = err.errors()[0]
            where = "".join(f"[{p}]" for p in first.get("loc", ()))
            raise ValueError(f"params.{key}.{name}{where}: {first.get('msg', 'invalid value')} "
                             f"(got {type(value).__name__})") from None
    return out
