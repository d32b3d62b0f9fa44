"""Validation logs (:mod:`seal.eval.logs`) from verl's validation dump.

verl's ``_validate`` hands ``_dump_generations`` the decoded inputs/outputs, the scores and the
``reward_extra_info`` columns of the validation batch. The episode runner puts one column there,
``seal_record``: each episode's :class:`seal.episode.EpisodeResult` in its field form (a JSON
object). :func:`validation_records` reads the records back and writes them as the project's log
lines, with the same constructor as the local backend, so the statistics script and the BFCL
export read the verl backend's logs like the local backend's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from seal.episode import RECORD_KEY, EpisodeResult
from seal.eval.logs import ValidationRecord


def validation_records(records_json: Sequence[str], scores: Sequence[float], *, step: int,
                       generation: Mapping[str, Any]) -> list[ValidationRecord]:
    """One :class:`ValidationRecord` per validation episode.

    Args:
        records_json: the ``seal_record`` column, one JSON object (a string) per episode.
        scores: verl's per-episode validation scores, same order (only their count is checked:
            each equals the record's own reward, which the episode runner handed verl).
        step: the global step the validation ran at.
        generation: the validation sampling settings (logged with every line).
    """
    if len(records_json) != len(scores):
        raise ValueError(f"{len(records_json)} {RECORD_KEY} entries for {len(scores)} scores")
    results = [EpisodeResult.from_fields(json.loads(raw) if isinstance(raw, str) else raw) for raw in records_json]
    # verl validates on data.val_files, the "val" split, as the local backend does.
    return [ValidationRecord.from_episode(r, step=step, split="val", generation=generation) for r in results]
