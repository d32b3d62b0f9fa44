"""Training-time interface evolution, the episode's half: observation hints, recovery feedback, guidelines.

All pure: the environment applies them per episode through :class:`EpisodeInterface`, built from the
episode's ``params``; the trainer chooses guideline lines (``seal.interface.select_guidelines``) and
sends them in ``params.diagnostic_evolution.lines``.
"""

from seal_shared.interface.episode import (
    ROLLOUT_MODES, DiagnosticEvolutionParams, EpisodeInterface, ObservationLiteParams, ToolFeedbackParams,
)
from seal_shared.interface.feedback import FORMAT_EXAMPLES, parse_error_feedback, tool_error_feedback, tool_error_hint
from seal_shared.interface.guidelines import GUIDELINES_HEADER, GuidelineConfig, render_guidelines
from seal_shared.interface.observation import OBSERVATION_INSTRUCTION, observation_hints

__all__ = ["FORMAT_EXAMPLES", "GUIDELINES_HEADER", "OBSERVATION_INSTRUCTION", "ROLLOUT_MODES",
           "DiagnosticEvolutionParams", "EpisodeInterface", "GuidelineConfig", "ObservationLiteParams",
           "ToolFeedbackParams", "observation_hints", "parse_error_feedback", "render_guidelines",
           "tool_error_feedback", "tool_error_hint"]
