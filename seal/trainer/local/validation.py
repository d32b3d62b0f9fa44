"""Validation records (contract 6) and pass-rate metrics from a validation pass."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seal.eval.logs import ValidationLogWriter, ValidationRecord
from seal.trainer.local.episodes import Episode

logger = logging.getLogger(__name__)

# Messages are kept whole up to this many characters each (the system prompt is the long one).
MAX_MESSAGE_CHARS = 4000


def to_record(ep: Episode, step: int, generation: Mapping[str, Any], split: str | None) -> ValidationRecord:
    check = ep.check or {}
    faulted = ep.env_fault or ep.llm_fault
    return ValidationRecord(
        task_id=ep.task_id,
        data_source=ep.category,
        split=split,
        step=int(step),
        score=1.0 if ep.success else 0.0,
        reward=float(ep.reward),
        valid=bool(ep.success),
        error_type=check.get("error_type"),
        tags=list(ep.tags or []),
        num_llm_calls=ep.num_llm_calls,
        num_prompt_tokens=len(ep.prompt_ids),
        num_response_tokens=int(sum(ep.response_mask)),
        terminated_reason=ep.terminated_reason,
        messages=list(ep.messages),
        generation=dict(generation),
        model_turns=check.get("model_turns"),
        error=(("environment fault: " if ep.env_fault else "LLM fault: ") + ep.fault_reason) if faulted else None,
    )


def write_validation_log(log_dir: Path, step: int, episodes: Sequence[Episode], generation: Mapping[str, Any],
                         *, split: str | None, tokenizer: Any = None) -> Path:
    """Write ``<log_dir>/<step>.jsonl``, replacing a file a previous (interrupted) run left for this step."""
    writer = ValidationLogWriter(log_dir, max_message_chars=MAX_MESSAGE_CHARS)
    path = writer.path_for(step)
    path.unlink(missing_ok=True)
    writer.write_many(to_record(ep, step, generation, split) for ep in episodes)
    return path


def validation_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``val/pass_rate`` overall and per category over the scored episodes; an episode whose LLM
    or environment failed (``seal.eval.logs.is_errored``) is not a model failure: it is left out
    of the rates and counted in ``val/faults``."""
    from seal.eval.logs import is_errored

    scored = [e for e in episodes if not is_errored({"env_fault": e.env_fault, "llm_fault": e.llm_fault})]
    by_cat: dict[str, list[bool]] = defaultdict(list)
    for ep in scored:
        by_cat[ep.category].append(bool(ep.success))
    out = {f"val/{cat}/pass_rate": sum(v) / len(v) for cat, v in sorted(by_cat.items())}
    out["val/pass_rate"] = sum(bool(e.success) for e in scored) / len(scored) if scored else float("nan")
    out["val/faults"] = float(len(episodes) - len(scored))
    out["val/num_llm_calls_mean"] = sum(e.num_llm_calls for e in episodes) / max(len(episodes), 1)
    return out
