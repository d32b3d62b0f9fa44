"""Validation records (:mod:`seal.eval.logs`) and pass-rate metrics from a validation pass."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seal.eval.logs import ValidationLogWriter, ValidationRecord
from seal.trainer.local.episodes import Episode

# Messages are kept whole up to this many characters each (the system prompt is the long one).
MAX_MESSAGE_CHARS = 4000


def write_validation_log(log_dir: Path, step: int, episodes: Sequence[Episode], generation: Mapping[str, Any],
                         *, split: str | None) -> Path:
    """Write ``<log_dir>/<step>.jsonl``, replacing a file a previous (interrupted) run left for this step."""
    writer = ValidationLogWriter(log_dir, max_message_chars=MAX_MESSAGE_CHARS)
    path = writer.path_for(step)
    path.unlink(missing_ok=True)
    writer.write_many(ValidationRecord.from_episode(ep.result, step=step, split=split, generation=generation)
                      for ep in episodes)
    return path


def validation_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``val/pass_rate`` overall and per category over the scored episodes; an episode whose LLM
    or environment failed (``EpisodeResult.faulted``, what ``seal.eval.logs.is_errored`` reads
    from its log line) is not a model failure: it is left out of the rates and counted in
    ``val/faults``."""
    results = [e.result for e in episodes]
    scored = [r for r in results if not r.faulted]
    by_cat: dict[str, list[bool]] = defaultdict(list)
    for r in scored:
        by_cat[r.category].append(r.valid)
    out = {f"val/{cat}/pass_rate": sum(v) / len(v) for cat, v in sorted(by_cat.items())}
    out["val/pass_rate"] = sum(r.valid for r in scored) / len(scored) if scored else float("nan")
    out["val/faults"] = float(len(results) - len(scored))
    out["val/num_llm_calls_mean"] = sum(r.num_llm_calls for r in results) / max(len(results), 1)
    return out
