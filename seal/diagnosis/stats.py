"""Diagnosis statistics: per-step metrics, the epoch dump, and error-message collection."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from seal.config_base import allows, check_fields
from seal.diagnosis.state import BUCKETS, CapabilityState
from seal_shared.types import dataclass_from_mapping

# Error strings as the environment and BFCL's backends write them.
_ERROR_PATTERNS = (
    re.compile(r"\[ERROR\][^\n]*"),  # the environment's own error lines
    re.compile(r'"error"\s*:\s*"((?:[^"\\]|\\.)*)"'),  # BFCL backend results {"error": "..."}
    re.compile(r"Error during execution:[^\n]*"),  # a backend method that raised
    re.compile(r"Error from environment:[^\n]*"),
)
# Roles whose text the environment wrote; the system prompt (tool docs) and the model's own
# text are not observations and would add false hits.
_OBSERVATION_ROLES = frozenset({"user", "tool"})


@dataclass
class DiagnosisConfig:
    """Settings of the epoch stats and the state's save cadence. ``save_every_n_steps`` is the
    config's ``seal.diagnosis.save_every_n_steps`` (the schema, :mod:`seal.schema`, holds its
    default and doc and reuses the rule beside it here; the trainer passes it); the other fields
    are not config keys."""

    save_every_n_steps: int = field(default=0, metadata=allows(ge=0))
    metric_prefix: str = field(default="seal/diagnosis", metadata=allows(
        pattern=r".*[^/]", means="a non-empty metric prefix without a trailing '/'"))
    top_errors: int = field(default=20, metadata=allows(ge=0))
    max_error_chars: int = field(default=200, metadata=allows(ge=0))

    def __post_init__(self) -> None:
        check_fields(self, "seal.diagnosis")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DiagnosisConfig:
        return dataclass_from_mapping(cls, data, section="seal.diagnosis")


def extract_error_messages(messages: Iterable[Mapping[str, Any] | str], *, max_chars: int = 200) -> list[str]:
    """Error strings found in an episode's observations, each truncated to ``max_chars``.

    ``messages``: chat messages (``{"role", "content"}``; only ``user``/``tool`` messages, the
    ones the environment writes, are scanned) or bare observation strings. Matches, in text
    order per pattern: ``[ERROR] ...`` lines, ``"error": "..."`` JSON values (the value only),
    ``Error during execution: ...`` and ``Error from environment: ...`` lines.
    """
    found: list[str] = []
    for msg in messages:
        if isinstance(msg, str):
            text = msg
        else:
            text = msg.get("content") if msg.get("role") in _OBSERVATION_ROLES else None
        if not isinstance(text, str):
            continue
        for pattern in _ERROR_PATTERNS:
            for m in pattern.finditer(text):
                value = (m.group(1) if pattern.groups else m.group(0)).strip()
                if value:
                    found.append(value[:max_chars])
    return found


class DiagnosisStats:
    """Read-only views of a :class:`CapabilityState` for logging and epoch dumps."""

    def __init__(self, state: CapabilityState, cfg: DiagnosisConfig | None = None) -> None:
        self.state = state
        self.cfg = cfg or DiagnosisConfig()

    def metrics(self, tag_weights: Mapping[str, float] | None = None) -> dict[str, float]:
        """Per-step scalars of the window's categories and the state's size, and the reweighter's
        adaptive ``tag_weights`` (A-Patch's dynamic weights) when given."""
        p, s = self.cfg.metric_prefix, self.state
        out: dict[str, float] = {}
        for cat, st in sorted(s.window["categories"].items()):
            out[f"{p}/window/{cat}/count"] = float(st.count)
            out[f"{p}/window/{cat}/success_rate"] = st.success_rate
            out[f"{p}/window/{cat}/reward_mean"] = st.reward_mean
            out[f"{p}/window/{cat}/partial_count"] = float(st.partial_count)
        out[f"{p}/state/observe_count"] = float(s.observe_count)
        out[f"{p}/state/num_tasks"] = float(len(s.tasks))
        out[f"{p}/state/num_tags"] = float(len(s.total["tags"]))
        out[f"{p}/state/num_category_tags"] = float(len(s.total["category_tags"]))
        for tag, w in sorted((tag_weights or {}).items()):
            out[f"{p}/dynamic_tag_weight/{tag}"] = float(w)
        return out

    def epoch_dump(self, epoch: int, step: int, error_counter: Counter | Mapping[str, int],
                   tag_weights: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The epoch-end record (``diagnostic_stats/epoch_<e>.json``); call it *before*
        ``reset_window``. Window buckets, all tasks (cumulative), the reweighter's adaptive tag
        weights (``dynamic_tag_weights``) and the ``cfg.top_errors`` most frequent error messages."""
        snap = self.state.snapshot(window=True)
        top = Counter(error_counter).most_common(self.cfg.top_errors)
        return {
            "epoch": int(epoch),
            "global_step": int(step),
            **{b: snap[b] for b in BUCKETS},
            "tasks": snap["tasks"],
            "dynamic_tag_weights": dict(tag_weights or {}),
            "observe_count": snap["observe_count"],
            "top_errors": [{"message": m, "count": n} for m, n in top],
        }
