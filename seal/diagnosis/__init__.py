"""Diagnosis: the capability state and its statistics (the per-turn tag rule is the registry's,
:func:`seal_shared.tags.classify_turn`)."""

from __future__ import annotations

from seal.diagnosis.state import (STATE_VERSION, CapabilityState, CapabilityStateError, CapabilityStats,
                                   dominant_tag, turn_position)
from seal.diagnosis.stats import DiagnosisConfig, DiagnosisStats, extract_error_messages

__all__ = ["STATE_VERSION", "CapabilityState", "CapabilityStateError", "CapabilityStats", "DiagnosisConfig",
           "DiagnosisStats", "dominant_tag", "extract_error_messages", "turn_position"]
