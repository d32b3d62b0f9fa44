"""Validation logs (contract 6) from verl's validation dump.

verl's ``_validate`` hands ``_dump_generations`` the decoded inputs/outputs, the scores and the
``reward_extra_info`` columns of the validation batch. The episode runner puts one column there,
``seal_record``: a JSON object per episode with the fields of
:class:`seal.eval.logs.ValidationRecord` it knows (``task_id``, ``category``, ``valid``,
``error_type``, ``tags``, ``num_llm_calls``, ``num_prompt_tokens``, ``num_response_tokens``,
``terminated_reason``, ``messages``, ``model_turns``, ``env_fault``, ``llm_fault``, ``error``).
:func:`validation_records` joins them with verl's scores into the project's log lines, so the
statistics script and the BFCL export read the verl backend's logs like the local backend's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from seal.eval.logs import RECORD_KEY, ValidationRecord
from seal.types import category_of

logger = logging.getLogger(__name__)


def validation_records(
    records_json: Sequence[str], scores: Sequence[float], *, step: int, generation: Mapping[str, Any]
) -> list[ValidationRecord]:
    """One :class:`ValidationRecord` per validation episode.

    Args:
        records_json: the ``seal_record`` column, one JSON object (a string) per episode.
        scores: verl's per-episode validation scores (the summed token rewards), same order;
            logged as ``reward``, while ``score`` is the binary verdict.
        step: the global step the validation ran at.
        generation: the validation sampling settings (logged with every line).
    """
    if len(records_json) != len(scores):
        raise ValueError(f"{len(records_json)} {RECORD_KEY} entries for {len(scores)} scores")
    out = []
    for raw, score in zip(records_json, scores):
        rec: dict[str, Any] = json.loads(raw) if isinstance(raw, str) else dict(raw)
        task_id = str(rec["task_id"])
        fault = bool(rec.get("env_fault") or rec.get("llm_fault"))
        valid = bool(rec.get("valid", float(score) >= 1.0)) and not fault
        out.append(ValidationRecord(
            task_id=task_id,
            data_source=str(rec.get("category") or category_of(task_id)),
            split=rec.get("split"),
            step=int(step),
            score=1.0 if valid else 0.0,  # the binary pass the paper's tables count
            reward=float(score),
            valid=valid,
            error_type=rec.get("error_type"),
            tags=[str(t) for t in rec.get("tags") or []],
            num_llm_calls=int(rec.get("num_llm_calls") or 0),
            num_prompt_tokens=int(rec.get("num_prompt_tokens") or 0),
            num_response_tokens=int(rec.get("num_response_tokens") or 0),
            terminated_reason=str(rec.get("terminated_reason") or ""),
            messages=list(rec.get("messages") or []),
            generation=dict(generation),
            model_turns=rec.get("model_turns"),
            error=rec.get("error"),
        ))
    return out
