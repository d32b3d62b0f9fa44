"""The paper's failure labels, derived from the per-turn tags plus episode events.

The paper names six failure kinds (invalid_tool_call, argument_mismatch, missing_tool_call,
recovery_failure, state_mismatch, response_mismatch); the release's checker emits the nine
``FailureTag`` values instead. This module gives the documented bridge, one label per turn:

1. ``pass``, ``correct_abstention``, ``gt_error``, ``checker_error`` -> ``none`` (not a
   policy failure; a registered tag marked ``excluded`` or not a ``failure`` likewise);
2. ``spurious_tool_call`` -> ``invalid_tool_call`` (a call where none was due);
3. any other failed turn in which the environment rejected a call (a parse error or an
   unavailable tool) -> ``invalid_tool_call``;
4. any other failed turn in which a tool returned an error -> ``recovery_failure`` (the model
   saw the error and still failed the turn);
5. ``state_mismatch`` when the model called every tool the ground truth called (as a
   multiset of names) -> ``argument_mismatch`` (right tools, wrong arguments);
6. otherwise the tag's default label (its registered ``paper_label``): ``empty_turn_model_response`` -> ``missing_tool_call``,
   ``instance_mismatch`` -> ``recovery_failure`` (no call of the turn executed cleanly),
   ``state_mismatch`` -> ``state_mismatch``, ``response_mismatch`` -> ``response_mismatch``.

The same table is in ``docs/paper_map.md``. The labels are for reporting; training (A-Patch,
the capability state, guidelines) uses the tags themselves, as the release does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seal.tags import get_tag
from seal.types import FailureTag, PaperLabel


@dataclass(frozen=True)
class TurnEvents:
    """What the environment saw during one ground-truth turn of an episode.

    ``model_calls`` / ``gt_calls``: the function names of the model's accepted calls and of the
    ground truth's calls in this turn, or ``None`` when unknown (rule 5 is then skipped).
    """

    parse_errors: int = 0
    unavailable_tools: int = 0
    tool_errors: int = 0
    model_calls: tuple[str, ...] | None = None
    gt_calls: tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TurnEvents:
        """From one entry of the environment's ``turn_events`` list (extra keys are ignored)."""
        calls = {k: (tuple(data[k]) if data.get(k) is not None else None) for k in ("model_calls", "gt_calls")}
        return cls(
            parse_errors=int(data.get("parse_errors", 0)),
            unavailable_tools=int(data.get("unavailable_tools", 0)),
            tool_errors=int(data.get("tool_errors", 0)),
            **calls,
        )


def paper_label(tag: str, events: TurnEvents | None = None) -> PaperLabel:
    """The paper's label for one turn (rules 1-6 of the module docstring)."""
    definition = get_tag(tag)
    if definition.excluded or not definition.failure:
        return PaperLabel.NONE
    if tag == FailureTag.SPURIOUS_TOOL_CALL:
        return PaperLabel.INVALID_TOOL_CALL
    ev = events or TurnEvents()
    if ev.parse_errors > 0 or ev.unavailable_tools > 0:
        return PaperLabel.INVALID_TOOL_CALL
    if ev.tool_errors > 0:
        return PaperLabel.RECOVERY_FAILURE
    if tag == FailureTag.STATE_MISMATCH and ev.model_calls is not None and ev.gt_calls:
        if not Counter(ev.gt_calls) - Counter(ev.model_calls):
            return PaperLabel.ARGUMENT_MISMATCH
    return PaperLabel(definition.paper_label)


def paper_labels(tags: Sequence[str], events: Sequence[TurnEvents | None] | None = None) -> list[PaperLabel]:
    """One paper label per turn. ``tags``: the per-turn ``FailureTag`` values; ``events``: the
    matching per-turn :class:`TurnEvents` (``None``, or shorter than ``tags``, means no events
    for the remaining turns). Raises ``ValueError`` on a string that is not a failure tag."""
    events = list(events or [])
    if len(events) > len(tags):
        raise ValueError(f"got events for {len(events)} turns but tags for only {len(tags)}")
    events += [None] * (len(tags) - len(events))
    return [paper_label(t, e) for t, e in zip(tags, events)]


def labels_from_result(result: Mapping[str, Any]) -> list[PaperLabel]:
    """Paper labels from the environment's full ``/evaluate`` result: its ``failure_tags`` and,
    when present, its per-turn ``turn_events``."""
    if "failure_tags" not in result:
        raise KeyError(f"the evaluate result has no 'failure_tags'; got keys {sorted(result)}")
    events = [TurnEvents.from_mapping(e) for e in result.get("turn_events") or []]
    return paper_labels(result["failure_tags"], events)
