"""Per-episode interface evolution, built from the SEAL-compatible ``/create`` params.

The environment builds one :class:`EpisodeInterface` per episode and asks it for the tool
schemas, the extra system-prompt blocks and the recovery hints. Each part has its own gate:
it is active iff its block has ``enable``, the episode is a training episode (or the block
sets ``apply_to_validation``), and the task's category passes the block's ``categories``
filter (empty or absent: all categories). Inactive parts change nothing, so a validation
episode sees exactly the untouched environment.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal_shared.interface.feedback import parse_error_feedback, tool_error_feedback
from seal_shared.interface.guidelines import EPISODE_KEYS, GuidelineConfig, render_guidelines
from seal_shared.interface.observation import OBSERVATION_INSTRUCTION, observation_hints
from seal_shared.types import dataclass_from_mapping

# ``sample``: a training episode (the interface parts may apply); ``validate``: the untouched interface.
ROLLOUT_MODES = ("sample", "validate")


@dataclass
class ObservationLiteParams:
    """``params.observation_lite``: schema hints plus one instruction line."""

    enable: bool = False
    apply_to_validation: bool = False
    categories: list[str] | None = None
    add_required_hint: bool = True
    add_type_hint: bool = False
    add_enum_hint: bool = True
    hide_optional: bool = False
    instruction: str | None = None  # None: the release's default line


@dataclass
class ToolFeedbackParams:
    """``params.tool_feedback_evolution``: recovery hints on parse and tool errors."""

    enable: bool = False
    apply_to_validation: bool = False
    categories: list[str] | None = None
    max_tool_names: int = 12


@dataclass
class DiagnosticEvolutionParams:
    """``params.diagnostic_evolution``: guideline lines chosen by the trainer for this episode.

    The block may also carry :class:`~seal_shared.interface.guidelines.GuidelineConfig` keys (the
    trainer's selection thresholds); they are checked and ignored here.
    """

    enable: bool = False
    apply_to_validation: bool = False
    categories: list[str] | None = None
    lines: list[str] = field(default_factory=list)


def _gate(block: Any, *, validation: bool, category: str) -> bool:
    if not block.enable:
        return False
    if validation and not block.apply_to_validation:
        return False
    return not block.categories or category in block.categories


@dataclass
class EpisodeInterface:
    """The training-time interface of one episode (see the module docstring for the gates)."""

    category: str
    rollout_mode: str = "validate"  # the evaluation interface unless the caller asks for "sample"
    observation_lite: ObservationLiteParams = field(default_factory=ObservationLiteParams)
    tool_feedback: ToolFeedbackParams = field(default_factory=ToolFeedbackParams)
    diagnostic: DiagnosticEvolutionParams = field(default_factory=DiagnosticEvolutionParams)

    def __post_init__(self) -> None:
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"params.rollout_mode must be one of {list(ROLLOUT_MODES)}, got {self.rollout_mode!r}")
        blocks = {"observation_lite": self.observation_lite, "tool_feedback_evolution": self.tool_feedback,
                  "diagnostic_evolution": self.diagnostic}
        self._active = {key: _gate(block, validation=self.is_validation, category=self.category)
                        for key, block in blocks.items()}

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None, *, category: str) -> EpisodeInterface:
        """Read the interface keys of a ``/create`` ``params`` dict (other keys are the
        environment's and are ignored here). Unknown keys inside a block raise ``ValueError``
        naming the key; an absent or ``None`` block means "off"."""
        params = params or {}
        return cls(category=category, rollout_mode=str(params.get("rollout_mode") or "validate"),
                   observation_lite=_block(ObservationLiteParams, params, "observation_lite"),
                   tool_feedback=_block(ToolFeedbackParams, params, "tool_feedback_evolution"),
                   diagnostic=_block(DiagnosticEvolutionParams, params, "diagnostic_evolution"))

    @property
    def active(self) -> dict[str, bool]:
        """Which parts apply to this episode, keyed by their ``params`` block name."""
        return dict(self._active)

    @property
    def is_validation(self) -> bool:
        return self.rollout_mode == "validate"

    def transform_tools(self, tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """A deep copy of ``tools``, with observation hints when that part is active."""
        if not self._active["observation_lite"]:
            return copy.deepcopy(list(tools))
        o = self.observation_lite
        return observation_hints(tools, add_required_hint=o.add_required_hint, add_type_hint=o.add_type_hint,
                                 add_enum_hint=o.add_enum_hint, hide_optional=o.hide_optional)

    def system_blocks(self) -> list[str]:
        """Blocks to append to the system prompt, each after a blank line (empty when inactive)."""
        blocks = []
        if self._active["observation_lite"]:
            text = OBSERVATION_INSTRUCTION if self.observation_lite.instruction is None else self.observation_lite.instruction
            if text:
                blocks.append(text)
        if self._active["diagnostic_evolution"] and self.diagnostic.lines:
            blocks.append(render_guidelines(self.diagnostic.lines))
        return blocks

    def parse_error_feedback(self, reason: str, *, parser_mode: str, tool_names: Sequence[str]) -> str:
        """Hint lines to append after a parse/unavailable-tool error, or ``""`` when inactive."""
        if not self._active["tool_feedback_evolution"]:
            return ""
        return parse_error_feedback(reason, parser_mode=parser_mode, tool_names=tool_names,
                                    max_tool_names=self.tool_feedback.max_tool_names)

    def tool_error_feedback(self, error_text: str, *, tool_names: Sequence[str]) -> str:
        """``"[ToolHint] ..."`` for a tool error, or ``""`` when inactive or no rule applies."""
        if not self._active["tool_feedback_evolution"]:
            return ""
        return tool_error_feedback(error_text, tool_names=tool_names)


def _block(cls: type, params: Mapping[str, Any], key: str) -> Any:
    raw = params.get(key)
    if raw is not None and not isinstance(raw, Mapping) and hasattr(raw, "model_dump"):
        raw = raw.model_dump()  # a pydantic block from the environment's typed params
    if cls is DiagnosticEvolutionParams and raw is not None:
        # The trainer's selection settings may travel in the same block (one config tree);
        # they are validated here and otherwise ignored: the environment only renders lines.
        GuidelineConfig.from_diagnostic_evolution(raw)
        raw = {k: v for k, v in raw.items() if k in EPISODE_KEYS}
    block = dataclass_from_mapping(cls, raw, section=f"params.{key}")
    if block.categories is not None:
        if isinstance(block.categories, str) or not isinstance(block.categories, Sequence):
            raise ValueError(f"params.{key}.categories must be a list of category names or null")
        block.categories = [str(c) for c in block.categories]
    if isinstance(block, DiagnosticEvolutionParams):
        if isinstance(block.lines, str) or not all(isinstance(x, str) for x in block.lines):
            raise ValueError("params.diagnostic_evolution.lines must be a list of strings")
        block.lines = list(block.lines)
    return block
