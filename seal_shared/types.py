"""Shared vocabulary: failure tags, the paper's labels, and the records that carry them.

This module is the only place where the release's tag names are spelled. Everything else imports
``FailureTag`` (a ``StrEnum``, so a tag compares equal to its string and serialises as one); the
tags' definitions (weight, description, paper label, ...), and any research tag, are registered
in :mod:`seal_shared.tags`, which imports this module (never the reverse).
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
    """The release's nine labels, one per ground-truth turn.

    Their definitions (priority, evidence rule, A-Patch weight, guideline line, description,
    paper label) are registered in :mod:`seal_shared.tags`, which also holds any research tag added
    beside them.
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


# The pseudo-tag the capability state records for an episode that carries no tags at all.
UNKNOWN_TAG = "unknown"


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


@dataclass(frozen=True)
class TurnDiagnosis:
    """What the per-turn pass found for one ground-truth turn."""

    index: int
    tag: str  # a registered failure tag (a ``FailureTag`` for the release's nine)
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

