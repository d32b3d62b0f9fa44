"""The typed episode record: what one played episode produced, read by every consumer.

:class:`Evaluation` is the environment's verdict, parsed from its ``/evaluate`` result by
:meth:`Evaluation.from_wire`, the one reader of that wire format (``valid`` and ``failure_tags``
required, the rest ``None`` when not reported). :class:`EpisodeResult` is one episode as the
episode loop finished it, built once and read by the trainers, the validation logs and ``seal eval``.
:meth:`EpisodeResult.to_fields` / :meth:`EpisodeResult.from_fields` cross verl's
``extra_fields`` / ``non_tensor_batch`` boundary; the field dict is JSON-safe, so it also travels in
the validation dump's ``seal_record`` column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal.diagnosis.stats import extract_error_messages


# The column of verl's ``reward_extra_info`` in which the episode runner hands each validation
# episode's fields (:meth:`EpisodeResult.to_fields`, as one JSON object) to the verl trainer.
RECORD_KEY = "seal_record"


class WireFormatError(ValueError):
    """An ``/evaluate`` result or an episode field dict lacks a required field or has a bad value."""


_REQUIRED_WIRE = ("valid", "failure_tags")
_OPTIONAL_INT = ("passed_turns", "scorable_turns", "irrelevance_turns", "passed_irrelevance_turns", "failed_turn")
_OPTIONAL_FLOAT = ("progress", "progress_with_irrelevance")


def _bool(value: Any, name: str) -> bool:
    if hasattr(value, "item") and not isinstance(value, bool):  # a numpy bool from a batch column
        value = value.item()
    if not isinstance(value, bool):
        raise WireFormatError(f"{name}: expected true or false, got {value!r}")
    return value


def _str_list(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not hasattr(value, "tolist"):
        raise WireFormatError(f"{name}: expected a list of strings, got {type(value).__name__}")
    return tuple(str(v) for v in (value.tolist() if hasattr(value, "tolist") else value))


def _optional(value: Any, kind: type, name: str) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"{name}: expected {kind.__name__} or null, got {value!r}") from exc


@dataclass(frozen=True)
class Evaluation:
    """The environment's verdict on one episode (see the module docstring).

    ``tags``: one failure tag per ground-truth turn. ``model_turns``: turn -> step -> call
    strings (BFCL's checker form; the export reads it). ``terminated_reason`` is the
    environment's own (the runner keeps its reason on :class:`EpisodeResult`). ``raw`` is the
    whole JSON result, kept for logs and for :meth:`to_wire`.
    """

    valid: bool
    tags: tuple[str, ...]
    error_type: str | None = None
    model_turns: list[Any] | None = None
    category: str | None = None
    terminated_reason: str | None = None
    per_turn_valid: tuple[bool | None, ...] | None = None
    passed_turns: int | None = None
    scorable_turns: int | None = None
    irrelevance_turns: int | None = None
    passed_irrelevance_turns: int | None = None
    failed_turn: int | None = None
    progress: float | None = None
    progress_with_irrelevance: float | None = None
    events: dict[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The wire keys the environment sent (a reported null differs from an unreported figure in logs).
    reported: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def from_wire(cls, result: Any) -> Evaluation:
        """Parse an ``/evaluate`` result (a JSON object). Raises :class:`WireFormatError` naming
        every missing required key, or the first key with a value of the wrong type."""
        if not isinstance(result, Mapping):
            raise WireFormatError(f"the evaluate result must be a JSON object (evaluate with sparse=false), "
                                  f"got {type(result).__name__}")
        missing = [k for k in _REQUIRED_WIRE if k not in result]
        if missing:
            raise WireFormatError(f"the evaluate result lacks {missing}; got keys {sorted(result)}")
        per_turn = result.get("per_turn_valid")
        events = result.get("events")
        return cls(
            valid=_bool(result["valid"], "valid"),
            tags=_str_list(result["failure_tags"], "failure_tags"),
            error_type=_optional(result.get("error_type"), str, "error_type"),
            model_turns=result.get("model_turns"),
            category=_optional(result.get("category"), str, "category"),
            terminated_reason=_optional(result.get("terminated_reason"), str, "terminated_reason"),
            per_turn_valid=None if per_turn is None else tuple(None if v is None else bool(v) for v in per_turn),
            **{k: _optional(result.get(k), int, k) for k in _OPTIONAL_INT},
            **{k: _optional(result.get(k), float, k) for k in _OPTIONAL_FLOAT},
            events=None if events is None else dict(events),
            raw=dict(result),
            reported=frozenset(result),
        )

    def to_wire(self) -> dict[str, Any]:
        """The JSON result this evaluation was parsed from (``from_wire(to_wire())`` is equal)."""
        return dict(self.raw)

    def log_extra(self) -> dict[str, Any]:
        """The turn-level figures a validation-log line carries in ``extra`` (those reported)."""
        out = {k: getattr(self, k) for k in ("passed_turns", "scorable_turns", "progress", "failed_turn", "events")
               if k in self.reported}
        if "terminated_reason" in self.reported:  # the environment's own reason, next to the runner's
            out["env_terminated_reason"] = self.terminated_reason
        return out


@dataclass(frozen=True)
class EpisodeResult:
    """One finished episode (see the module docstring).

    ``evaluation`` is ``None`` when the episode was not evaluated (an LLM or environment fault).
    ``excluded``: left out of training and of the capability state (faults, a prompt that did
    not fit, nothing written by the model). ``reward`` is the one reward of
    :func:`seal.rewards.episode_reward` (0 when excluded; the binary verdict for validation).
    ``num_response_tokens`` counts the model's own tokens over the whole episode;
    ``truncated_response_tokens`` those cut from the training tensors. ``error`` is the fault's
    reason as the runner saw it (``None`` unless a fault or a failure to run). ``call_turns``: the
    ground-truth turn (the environment's ``turn``) each accepted LLM call was made in, in order.
    """

    task_id: str
    category: str
    rollout_mode: str = "sample"
    evaluation: Evaluation | None = None
    reward: float = 0.0
    reward_meta: dict[str, Any] = field(default_factory=dict)
    num_llm_calls: int = 0
    num_prompt_tokens: int = 0
    num_response_tokens: int = 0
    truncated_response_tokens: int = 0
    clipped_observations: int = 0
    terminated_reason: str = ""
    messages: tuple[dict[str, Any], ...] = ()
    env_fault: bool = False
    llm_fault: bool = False
    excluded: bool = False
    error: str | None = None
    env_attempts: int = 1
    call_turns: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        # A faulted episode is never trained on, whoever built the record.
        if (self.env_fault or self.llm_fault) and not self.excluded:
            object.__setattr__(self, "excluded", True)
        object.__setattr__(self, "messages", tuple(dict(m) for m in self.messages))
        object.__setattr__(self, "call_turns", tuple(None if t is None else int(t) for t in self.call_turns))

    @property
    def faulted(self) -> bool:
        """The LLM or the environment failed: the episode says nothing about the model."""
        return self.env_fault or self.llm_fault

    @property
    def valid(self) -> bool:
        """The verifier passed the episode (never for an excluded one)."""
        return self.evaluation is not None and self.evaluation.valid and not self.excluded

    @property
    def tags(self) -> tuple[str, ...]:
        return self.evaluation.tags if self.evaluation is not None else ()

    @property
    def error_type(self) -> str | None:
        return self.evaluation.error_type if self.evaluation is not None else None

    @property
    def model_turns(self) -> list[Any] | None:
        return self.evaluation.model_turns if self.evaluation is not None else None

    @property
    def error_messages(self) -> list[str]:
        """The error strings of the episode's observations (the capability state's error counter)."""
        return extract_error_messages(self.messages)

    def fault_text(self) -> str | None:
        """``error`` as a log line states it: which side failed, then the reason."""
        if self.env_fault:
            return f"environment fault: {self.error or ''}"
        if self.llm_fault:
            return f"LLM fault: {self.error or ''}"
        return self.error

    def with_reward(self, reward: float, meta: Mapping[str, Any]) -> EpisodeResult:
        return dataclasses.replace(self, reward=float(reward), reward_meta=dict(meta))

    def to_fields(self) -> dict[str, Any]:
        """The flat, JSON-safe dict verl carries per episode (``extra_fields`` -> batch columns).
        ``check`` holds the evaluation's wire form (``None`` when not evaluated)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "evaluation"}
        out["check"] = self.evaluation.to_wire() if self.evaluation is not None else None
        out["messages"] = [dict(m) for m in self.messages]
        out["reward_meta"] = dict(self.reward_meta)
        out["call_turns"] = list(self.call_turns)
        return out

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> EpisodeResult:
        """The record back from :meth:`to_fields`' dict (or one batch row of its columns).
        Raises :class:`WireFormatError` naming every missing field."""
        missing = [n for n in FIELD_NAMES if n not in fields and n not in _OPTIONAL_FIELDS]
        if missing:
            raise WireFormatError(f"episode fields lack {missing} (not written by EpisodeResult.to_fields)")
        check = fields["check"]
        try:
            return cls(
                task_id=str(fields["task_id"]), category=str(fields["category"]),
                rollout_mode=str(fields["rollout_mode"]),
                evaluation=None if check is None else Evaluation.from_wire(check),
                reward=float(fields["reward"]), reward_meta=dict(fields["reward_meta"]),
                **{k: int(fields[k]) for k in _INT_FIELDS},
                terminated_reason=str(fields["terminated_reason"]),
                messages=tuple(fields["messages"]),
                **{k: _bool(fields[k], k) for k in ("env_fault", "llm_fault", "excluded")},
                error=None if fields["error"] is None else str(fields["error"]),
                call_turns=tuple(fields.get("call_turns") or ()),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, WireFormatError):
                raise
            raise WireFormatError(f"episode fields of {fields['task_id']!r}: {exc}") from exc


_INT_FIELDS = ("num_llm_calls", "num_prompt_tokens", "num_response_tokens", "truncated_response_tokens",
               "clipped_observations", "env_attempts")
# Fields a record written before they existed lacks (read as their default).
_OPTIONAL_FIELDS = ("call_turns",)
# The keys of EpisodeResult.to_fields(), in order.
FIELD_NAMES = tuple(f.name for f in dataclasses.fields(EpisodeResult) if f.name != "evaluation") + ("check",)

__all__ = ["FIELD_NAMES", "EpisodeResult", "Evaluation", "WireFormatError"]
