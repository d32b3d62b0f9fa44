"""Observation hints: annotate tool schemas so required and enum arguments stand out
(docs/paper_map.md §3)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

# The release's one-line instruction appended to the training system prompt when the hints
# are on. It is model input, so the exact text is kept for reproducibility.
OBSERVATION_INSTRUCTION = (
    "Observation note: parameters marked [required] must be provided exactly when calling a tool; "
    "do not invent tools outside the current schema."
)
REQUIRED_HINT = "[required]"
ENUM_HINT = "Allowed values:"


def _schema_of(tool: dict[str, Any]) -> dict[str, Any]:
    # BFCL docs are ``{"name", "description", "parameters"}``; OpenAI-style tools wrap the same
    # dict under ``"function"``. Both are accepted.
    fn = tool.get("function")
    return fn if isinstance(fn, dict) else tool


def _annotate(prop: dict[str, Any], *, required: bool, add_required_hint: bool, add_type_hint: bool, add_enum_hint: bool) -> None:
    old = str(prop.get("description", ""))
    suffixes = []
    if add_required_hint and required and REQUIRED_HINT not in old:
        suffixes.append(REQUIRED_HINT)
    if add_type_hint and "type" in prop:
        suffixes.append(f"[type: {prop['type']}]")
    enum = prop.get("enum")
    if add_enum_hint and isinstance(enum, list) and enum and ENUM_HINT not in old:
        suffixes.append(f"{ENUM_HINT} {', '.join(str(v) for v in enum)}")
    if suffixes:
        prop["description"] = f"{old} {' '.join(suffixes)}".strip()


def observation_hints(tools: Sequence[dict[str, Any]], *, add_required_hint: bool = True, add_type_hint: bool = False,
                      add_enum_hint: bool = True, hide_optional: bool = False) -> list[dict[str, Any]]:
    """Annotated deep copy of ``tools``; the input is never modified.

    For each top-level parameter (nested properties are left alone, as in the release), the
    description gets, after one space: ``[required]`` (if required and not already there),
    ``[type: <type>]``, ``Allowed values: a, b`` (if an ``enum`` and the phrase is not there).
    ``hide_optional`` first drops the non-required properties (the ``required`` list is kept).
    """
    out = copy.deepcopy(list(tools))
    for tool in out:
        params = _schema_of(tool).get("parameters")
        if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
            continue
        required = set(params.get("required") or [])
        props = params["properties"]
        if hide_optional:
            for name in [n for n in props if n not in required]:
                del props[name]
        for name, prop in props.items():
            if isinstance(prop, dict):
                _annotate(prop, required=name in required, add_required_hint=add_required_hint,
                          add_type_hint=add_type_hint, add_enum_hint=add_enum_hint)
    return out
