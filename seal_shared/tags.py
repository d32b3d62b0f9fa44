"""The failure-tag registry: each tag is one definition, registered once.

A :class:`TagDefinition` carries everything the project needs to know about a tag: its name,
its place in the priority order, its evidence rule (a predicate over the :class:`TurnEvidence`
the environment's checker gathers for one ground-truth turn), its default A-Patch base weight,
its guideline line, its description and its paper label. The checker tags a turn with the
first definition, by ascending ``priority``, whose rule holds (:func:`classify_turn`); A-Patch,
the config checks, guideline evolution and task selection read weights, names and lines from
here.

The release's nine tags (``seal_shared.types.FailureTag``) are registered below, in the release's
order. ``checker_error`` fires where the release fires it twice (around the state check and
around the response check) through one rule: the state checker raised, or the state passed and
the response checker raised. A research tag is added with :func:`register_tag`, e.g. from a
module listed under ``seal.plugins`` (see ``docs/extending.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from seal_shared.types import UNKNOWN_TAG, FailureTag, PaperLabel

__all__ = ["TagDefinition", "TurnEvidence", "classify_turn", "default_guidelines", "default_tag_weights",
           "excluded_tags", "get_tag", "guideline_excluded_tags", "known_tags", "register_tag", "tag_definitions",
           "turn_verdict", "unregister_tag"]


@dataclass(frozen=True)
class TurnEvidence:
    """What the checker observed on one ground-truth turn (the input of every tag rule).

    Attributes:
        gt_error: executing the turn's ground-truth calls failed at the executor level (a call
            string that does not parse, or names no method of the task's backends).
        gt_empty: the ground truth for this turn is ``[]`` (the right move is to abstain).
        model_called: the model made at least one accepted call in this turn.
        model_empty: BFCL's empty-turn rule holds for the model's turn (no steps, or a single
            empty step).
        instances_match: the model's backend instances cover the same classes as the ground
            truth's.
        state_valid: BFCL's state check; ``None`` when the checker raised or did not run.
        response_valid: BFCL's cumulative response check; ``None`` when it raised or did not run.
        model_executed: at least one of the model's calls of this turn reached a backend method
            (a call the executor refused before running it did not).
        model_calls: the model's accepted call strings of the turn, in order.
        gt_calls: the ground truth's call strings of the turn.
        model_results: the results (or error texts) the model's calls of the turn returned.
    """

    gt_error: bool
    gt_empty: bool
    model_called: bool
    model_empty: bool
    instances_match: bool
    state_valid: bool | None
    response_valid: bool | None
    model_executed: bool = True
    model_calls: tuple[str, ...] = ()
    gt_calls: tuple[str, ...] = ()
    model_results: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        """Every check of a scorable turn passed (BFCL's per-turn verdict)."""
        return (not self.gt_error and not self.gt_empty and not self.model_empty and self.model_executed
                and self.instances_match and self.state_valid is True and self.response_valid is True)


@dataclass(frozen=True)
class TagDefinition:
    """One failure tag.

    Attributes:
        name: the tag as it appears in results, logs and config keys.
        priority: lower is checked first; the first rule that holds names the turn's tag.
        applies: the evidence rule, a pure predicate over :class:`TurnEvidence`.
        weight: the default A-Patch base weight (``seal.advantage.apatch.tag_weights`` overrides it).
        guideline: the guideline line shown when the tag is prevalent and unsolved (``""``: none).
        description: one sentence for readers of logs and docs.
        paper_label: the paper's label for the tag when no episode event refines it.
        excluded: the tag judges the checker or the ground truth, not the policy; A-Patch and the
            dynamic weights leave it out, and no guideline is written for it.
        failure: the tag marks a policy failure (``pass`` and ``correct_abstention`` do not); only
            failures get guideline lines.
    """

    name: str
    priority: float
    applies: Callable[[TurnEvidence], bool]
    weight: float = 1.0
    guideline: str = ""
    description: str = ""
    paper_label: PaperLabel = PaperLabel.NONE
    excluded: bool = False
    failure: bool = True

    def __post_init__(self) -> None:
        if not self.name or not str(self.name).replace("_", "").isalnum():
            raise ValueError(f"failure tag name {self.name!r}: use letters, digits and underscores")
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"failure tag {self.name!r}: weight must be finite and >= 0, got {self.weight}")
        if not math.isfinite(self.priority):
            raise ValueError(f"failure tag {self.name!r}: priority must be a finite number")


_REGISTRY: dict[str, TagDefinition] = {}
_ORDER: list[TagDefinition] = []


def register_tag(definition: TagDefinition) -> TagDefinition:
    """Add ``definition``; a second tag with the same name or the same priority is an error."""
    if definition.name == UNKNOWN_TAG:
        raise ValueError(f"{UNKNOWN_TAG!r} is the pseudo-tag of an episode without tags; pick another name")
    if definition.name in _REGISTRY:
        raise ValueError(f"failure tag {str(definition.name)!r} is already registered; known: {sorted(map(str, _REGISTRY))}")
    clash = [str(d.name) for d in _ORDER if d.priority == definition.priority]
    if clash:
        in_use = ", ".join(f"{d.priority:g} {d.name}" for d in _ORDER)
        raise ValueError(f"failure tag {definition.name!r}: priority {definition.priority:g} is taken by "
                         f"{clash[0]!r}; priorities in use: {in_use}")
    _REGISTRY[str(definition.name)] = definition
    _ORDER.append(definition)
    _ORDER.sort(key=lambda d: d.priority)
    return definition


def unregister_tag(name: str) -> None:
    """Remove a registered tag (for tests and plug-in reloads); the release's tags cannot be removed."""
    if name in {str(t) for t in FailureTag}:
        raise ValueError(f"{name!r} is one of the release's tags and cannot be removed")
    _ORDER.remove(_REGISTRY.pop(name))


def get_tag(name: str) -> TagDefinition:
    """The definition of tag ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return _REGISTRY[str(name)]
    except KeyError:
        raise ValueError(f"unknown failure tag {name!r}; known: {sorted(map(str, _REGISTRY))}") from None


def tag_definitions() -> tuple[TagDefinition, ...]:
    """Every registered definition, in priority order."""
    return tuple(_ORDER)


def classify_turn(evidence: TurnEvidence) -> str:
    """The tag of one ground-truth turn: the first registered rule (by priority) that holds."""
    for definition in _ORDER:
        if definition.applies(evidence):
            return definition.name
    raise RuntimeError(f"no failure tag applies to {evidence}; the registry needs a catch-all (the built-in 'pass')")


def known_tags() -> frozenset[str]:
    """Every registered tag name plus the pseudo-tag ``unknown`` (valid keys of tag weights)."""
    return frozenset(_REGISTRY) | {UNKNOWN_TAG}


def excluded_tags() -> frozenset[str]:
    """Tags that say nothing about the policy: left out of A-Patch averaging and prevalence."""
    return frozenset(d.name for d in _ORDER if d.excluded)


def turn_verdict(tag: str) -> bool | None:
    """Whether a turn tagged ``tag`` was done right: ``True`` for a registered non-failure
    (``pass``, ``correct_abstention``), ``False`` for a failure, ``None`` when the tag says nothing
    about the policy (an excluded tag, or one not registered)."""
    definition = _REGISTRY.get(str(tag))
    if definition is None or definition.excluded:
        return None
    return not definition.failure


def guideline_excluded_tags() -> frozenset[str]:
    """Tags that never get a guideline: excluded tags, non-failures and ``unknown``."""
    return frozenset(d.name for d in _ORDER if d.excluded or not d.failure) | {UNKNOWN_TAG}


def default_tag_weights() -> dict[str, float]:
    """The A-Patch base weight of every registered tag (a fresh dict)."""
    return {d.name: d.weight for d in _ORDER}


def default_guidelines() -> dict[str, str]:
    """The guideline line of every registered tag that has one (a fresh dict)."""
    return {d.name: d.guideline for d in _ORDER if d.guideline}


T, P = FailureTag, PaperLabel

# The release's tags, in its priority order; weights are the release's A-Patch defaults.
for _definition in [
    TagDefinition(
        T.GT_ERROR, 10, lambda e: e.gt_error, weight=1.0, excluded=True, failure=False,
        description="Executing the ground-truth calls of this turn raised; the turn cannot be judged."),
    TagDefinition(
        T.SPURIOUS_TOOL_CALL, 20, lambda e: e.gt_empty and e.model_called, weight=2.0,
        paper_label=P.INVALID_TOOL_CALL,
        description="The right move was to abstain (empty ground truth), but the model called a tool.",
        guideline=("If the request cannot be served by the available tools or lacks needed details, "
                   "do not call a tool; say so in plain text.")),
    TagDefinition(
        T.CORRECT_ABSTENTION, 21, lambda e: e.gt_empty, weight=1.8, failure=False,
        description="The ground truth is empty and the model made no call: a correct abstention."),
    TagDefinition(
        T.EMPTY_TURN_MODEL_RESPONSE, 30, lambda e: e.model_empty, weight=1.5, paper_label=P.MISSING_TOOL_CALL,
        description="The ground truth has calls, but the model made no accepted call in this turn.",
        guideline=("When the user asks for an action the tools can perform, make the tool calls; "
                   "do not only describe what you would do.")),
    # The release's rule: the model's instances are those of the turn's last step that executed
    # ({} when none did), and the tag fires when their set differs from the ground truth's.
    TagDefinition(
        T.INSTANCE_MISMATCH, 40, lambda e: not e.model_executed or not e.instances_match, weight=0.6,
        paper_label=P.RECOVERY_FAILURE,
        description="No model call of the turn executed cleanly, so the backend instances never matched.",
        guideline=("When a call fails, read the error and retry with corrected arguments instead of "
                   "giving up or repeating the same call.")),
    TagDefinition(
        T.CHECKER_ERROR, 50, lambda e: e.state_valid is None or (e.state_valid and e.response_valid is None),
        weight=1.0, excluded=True, failure=False,
        description="The state or response checker itself raised while judging this turn."),
    TagDefinition(
        T.STATE_MISMATCH, 60, lambda e: not e.state_valid, weight=1.0, paper_label=P.STATE_MISMATCH,
        description="After the turn, the backend state differs from the ground truth's.",
        guideline=("Before each call, check every argument against the request and the current state; "
                   "complete all requested changes, not just the first.")),
    TagDefinition(
        T.RESPONSE_MISMATCH, 80, lambda e: not e.response_valid, weight=0.9, paper_label=P.RESPONSE_MISMATCH,
        description="State matches, but a ground-truth result is missing from the model's results so far.",
        guideline=("When the user asks for information, call the tool that retrieves it and report "
                   "the result it returned.")),
    TagDefinition(
        T.PASS, 1000, lambda e: True, weight=1.0, failure=False,
        description="Both the state check and the cumulative response check passed."),
]:
    register_tag(_definition)
del T, P, _definition
