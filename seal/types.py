"""Shared vocabulary: failure tags, the paper's labels, and the records that carry them.

This module is the only place where tag names are spelled. Everything else imports
``FailureTag`` (a ``StrEnum``, so a tag compares equal to its string and serialises as one).
It also holds one small helper, :func:`dataclass_from_mapping`, that the config dataclasses of
the core use to build themselves from plain (YAML-derived) dicts with a clear error on a typo.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar


class FailureTag(StrEnum):
    """One label per ground-truth turn, as the release's per-turn scorer emits them.

    The first matching rule wins, in the order the members are listed (``checker_error`` is
    checked twice: around the state check and around the response check).
    """

    GT_ERROR = "gt_error"
    SPURIOUS_TOOL_CALL = "spurious_tool_call"
    CORRECT_ABSTENTION = "correct_abstention"
    EMPTY_TURN_MODEL_RESPONSE = "empty_turn_model_response"
    INSTANCE_MISMATCH = "instance_mismatch"
    CHECKER_ERROR = "checker_error"
    STATE_MISMATCH = "state_mismatch"
    RESPONSE_MISMATCH = "response_mismatch"
    PASS = "pass"

    @property
    def description(self) -> str:
        return TAG_DESCRIPTIONS[self]

    @property
    def paper_label(self) -> PaperLabel:
        """The paper's label for this tag when no episode event refines it."""
        return TAG_TO_PAPER_LABEL[self]


TAG_DESCRIPTIONS: dict[FailureTag, str] = {
    FailureTag.GT_ERROR: "Executing the ground-truth calls of this turn raised; the turn cannot be judged.",
    FailureTag.SPURIOUS_TOOL_CALL: "The right move was to abstain (empty ground truth), but the model called a tool.",
    FailureTag.CORRECT_ABSTENTION: "The ground truth is empty and the model made no call: a correct abstention.",
    FailureTag.EMPTY_TURN_MODEL_RESPONSE: "The ground truth has calls, but the model made no accepted call in this turn.",
    FailureTag.INSTANCE_MISMATCH: "No model call of the turn executed cleanly, so the backend instances never matched.",
    FailureTag.CHECKER_ERROR: "The state or response checker itself raised while judging this turn.",
    FailureTag.STATE_MISMATCH: "After the turn, the backend state differs from the ground truth's.",
    FailureTag.RESPONSE_MISMATCH: "State matches, but a ground-truth result is missing from the model's results so far.",
    FailureTag.PASS: "Both the state check and the cumulative response check passed.",
}

# Tags that say nothing about the policy: excluded from A-Patch averaging and from prevalence.
EXCLUDED_TAGS: frozenset[FailureTag] = frozenset({FailureTag.CHECKER_ERROR, FailureTag.GT_ERROR})

# The pseudo-tag the capability state records for an episode that carries no tags at all.
UNKNOWN_TAG = "unknown"

# Tags that are not failures of the policy. Guideline evolution never writes a guideline for
# these (nor for the excluded tags or the pseudo-tag): there is nothing to correct.
NON_FAILURE_TAGS: frozenset[FailureTag] = frozenset({FailureTag.PASS, FailureTag.CORRECT_ABSTENTION})
GUIDELINE_EXCLUDED_TAGS: frozenset[str] = frozenset(EXCLUDED_TAGS | NON_FAILURE_TAGS | {UNKNOWN_TAG})

# A-Patch static base weights (the release's defaults).
DEFAULT_TAG_WEIGHTS: dict[FailureTag, float] = {
    FailureTag.GT_ERROR: 1.0,
    FailureTag.SPURIOUS_TOOL_CALL: 2.0,
    FailureTag.CORRECT_ABSTENTION: 1.8,
    FailureTag.EMPTY_TURN_MODEL_RESPONSE: 1.5,
    FailureTag.INSTANCE_MISMATCH: 0.6,
    FailureTag.CHECKER_ERROR: 1.0,
    FailureTag.STATE_MISMATCH: 1.0,
    FailureTag.RESPONSE_MISMATCH: 0.9,
    FailureTag.PASS: 1.0,
}


class PaperLabel(StrEnum):
    """The failure vocabulary the paper's text uses (the release emits ``FailureTag`` instead)."""

    INVALID_TOOL_CALL = "invalid_tool_call"
    ARGUMENT_MISMATCH = "argument_mismatch"
    MISSING_TOOL_CALL = "missing_tool_call"
    RECOVERY_FAILURE = "recovery_failure"
    STATE_MISMATCH = "state_mismatch"
    RESPONSE_MISMATCH = "response_mismatch"
    NONE = "none"  # a passing turn, a correct abstention, or a turn that cannot be judged

    @property
    def description(self) -> str:
        return PAPER_LABEL_DESCRIPTIONS[self]


PAPER_LABEL_DESCRIPTIONS: dict[PaperLabel, str] = {
    PaperLabel.INVALID_TOOL_CALL: "A call that should not have been made, or that the environment rejected (bad format, unavailable tool).",
    PaperLabel.ARGUMENT_MISMATCH: "The right tools were called, but with arguments that led to the wrong state.",
    PaperLabel.MISSING_TOOL_CALL: "The turn needed tool calls and the model made none.",
    PaperLabel.RECOVERY_FAILURE: "A tool returned an error (or every call crashed) and the model did not recover within the turn.",
    PaperLabel.STATE_MISMATCH: "The calls left the environment in a different state than the ground truth's.",
    PaperLabel.RESPONSE_MISMATCH: "The state is right, but the information the turn asked for was never retrieved.",
    PaperLabel.NONE: "Not a failure: a pass, a correct abstention, or a turn the checker could not judge.",
}

# Per-turn tag -> paper label, when nothing else is known about the episode. Episode events
# (parse errors, unavailable tools, tool errors followed by failure, the called tool names)
# refine this; see ``seal.diagnosis.labels.paper_labels``.
TAG_TO_PAPER_LABEL: dict[FailureTag, PaperLabel] = {
    FailureTag.GT_ERROR: PaperLabel.NONE,
    FailureTag.SPURIOUS_TOOL_CALL: PaperLabel.INVALID_TOOL_CALL,
    FailureTag.CORRECT_ABSTENTION: PaperLabel.NONE,
    FailureTag.EMPTY_TURN_MODEL_RESPONSE: PaperLabel.MISSING_TOOL_CALL,
    FailureTag.INSTANCE_MISMATCH: PaperLabel.RECOVERY_FAILURE,
    FailureTag.CHECKER_ERROR: PaperLabel.NONE,
    FailureTag.STATE_MISMATCH: PaperLabel.STATE_MISMATCH,
    FailureTag.RESPONSE_MISMATCH: PaperLabel.RESPONSE_MISMATCH,
    FailureTag.PASS: PaperLabel.NONE,
}


@dataclass(frozen=True)
class TurnDiagnosis:
    """What the per-turn pass found for one ground-truth turn."""

    index: int
    tag: FailureTag
    valid: bool | None  # None: not scorable (ground truth empty)
    irrelevance: bool | None = None  # for empty-GT turns: True iff the model abstained
    errors: tuple[str, ...] = ()


def category_of(task_id: str) -> str:
    """The BFCL category of a task id: the id minus its trailing ``_<n>``.

    >>> category_of("multi_turn_miss_func_12")
    'multi_turn_miss_func'
    """
    head, sep, tail = task_id.rpartition("_")
    if not sep or not tail.isdigit():
        raise ValueError(f"task id {task_id!r} does not end in '_<n>'; cannot infer its category")
    return head


_T = TypeVar("_T")


def dataclass_from_mapping(cls: type[_T], data: Mapping[str, Any] | _T | None, *, section: str) -> _T:
    """Build config dataclass ``cls`` from a plain mapping, rejecting unknown keys by name.

    ``section`` names where the mapping came from (e.g. ``"seal.advantage.apatch"``), so the
    error tells the user which key to fix. An instance of ``cls`` is returned unchanged and
    ``None`` gives the defaults.
    """
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise TypeError(f"{section}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    return cls(**dict(data))
