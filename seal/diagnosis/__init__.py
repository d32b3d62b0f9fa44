"""Diagnosis: the capability state and its statistics.

``tag_turn`` (the per-turn tagging rule the checker calls) lives in
:mod:`seal.diagnosis.tagging` and is re-exported lazily, so importing this package never
requires that module.
"""

from __future__ import annotations

import importlib
from typing import Any

from seal.diagnosis.state import (
    STATE_VERSION,
    CapabilityState,
    CapabilityStateError,
    CapabilityStats,
    dominant_tag,
    turn_position,
)
from seal.diagnosis.stats import DiagnosisConfig, DiagnosisStats, extract_error_messages

__all__ = [
    "STATE_VERSION",
    "CapabilityState",
    "CapabilityStateError",
    "CapabilityStats",
    "DiagnosisConfig",
    "DiagnosisStats",
    "dominant_tag",
    "extract_error_messages",
    "tag_turn",
    "turn_position",
]


def __getattr__(name: str) -> Any:
    if name == "tag_turn":
        return importlib.import_module("seal.diagnosis.tagging").tag_turn
    raise AttributeError(f"module 'seal.diagnosis' has no attribute {name!r}")
