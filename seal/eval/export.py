"""Write validation logs as BFCL result files (FC format), for BFCL's own ``bfcl evaluate``.

A BFCL multi-turn result line is ``{"id": ..., "result": [turn, ...]}``, a turn is a list of
steps and, for an FC model name (e.g. ``gpt-4o-2024-11-20-FC``), a step is a list of
``{function_name: "<JSON of the keyword arguments>"}``. BFCL's FC decoder turns each into
``name(k=repr(v), ...)`` and drops steps that decode to nothing, so a text-only reply needs no
step. Positional arguments are mapped to keyword names with the backend method signatures;
the FC format has no positional form.

Files go to ``<root>/result/<model>/multi_turn/BFCL_v4_<category>_result.json``; run the
official scorer on them with ``scripts/bfcl_official_eval.sh``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from seal.environment import catalogue_of
from seal.eval.logs import read_log_file
from seal.eval.stats import category_of, dedupe_latest
from seal_shared.calls import parse_call as parse_call_string

logger = logging.getLogger(__name__)

DEFAULT_FC_MODEL = "gpt-4o-2024-11-20-FC"
BFCL_VERSION_PREFIX = "BFCL_v4"


def method_parameters() -> dict[str, list[str]]:
    """``{method name: [parameter names in order]}`` of BFCL's tools (its catalogue: the backend
    classes' signatures; method names do not collide across them)."""
    return dict(catalogue_of("bfcl").tool_parameters)


def parse_call(call: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``name``, positional and keyword literal arguments of a call string (never evaluated).

    The environment's own AST parser (literal arguments only); raises ``ValueError``.
    """
    try:
        parsed = parse_call_string(call.strip())
    except ValueError as exc:
        raise ValueError(f"cannot convert {call!r} (not a plain call, or a non-literal argument): {exc}") from None
    return parsed.name, list(parsed.args), dict(parsed.kwargs)


def call_to_keywords(call: str) -> tuple[str, dict[str, Any]]:
    """Name and keyword arguments, positional ones named after the backend signature."""
    name, args, kwargs = parse_call(call)
    if args:
        params = method_parameters().get(name)
        if params is None or len(args) > len(params):
            logger.warning("cannot name the positional arguments of %r; dropping them", call)
        else:
            named = dict(zip(params, args))
            clash = set(named) & set(kwargs)
            if clash:
                raise ValueError(f"{call!r} passes {sorted(clash)} both by position and keyword")
            kwargs = {**named, **kwargs}
    return name, kwargs


def call_to_fc(call: str) -> dict[str, str]:
    """One call string as a BFCL FC tool call ``{name: "<JSON args>"}``."""
    name, kwargs = call_to_keywords(call)
    try:
        return {name: json.dumps(kwargs)}
    except TypeError as exc:
        raise ValueError(f"arguments of {call!r} are not JSON-serialisable: {exc}") from None


def record_to_result_line(record: dict[str, Any]) -> dict[str, Any]:
    """One validation-log record as one BFCL result line: its turn -> step -> call strings as BFCL FC
    result turns (empty steps are dropped)."""
    turns = record.get("model_turns")
    if turns is None:
        raise ValueError(
            f"record for {record.get('task_id')!r} has no model_turns; only logs written by "
            "seal eval or the trainer's validation (this project's format) can be exported"
        )
    return {"id": record["task_id"], "result": [[[call_to_fc(c) for c in step] for step in turn if step]
                                                for turn in turns]}


def export_records(records: Iterable[dict[str, Any]], root: str | Path, *, model: str = DEFAULT_FC_MODEL) -> dict[str,
                   Path]:
    """Write BFCL result files under ``root``; returns ``{category: file}``.

    Records are de-duplicated (last per task wins), errored runner records are skipped (BFCL
    would count them as inference errors, which they are not) and lines are sorted by id.
    """
    if not model.endswith("-FC"):
        raise ValueError(f"model={model!r}: the export writes FC results; pick an FC model name")
    by_cat: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in dedupe_latest(list(records)):
        if r.get("error"):
            logger.warning("not exporting %s: the runner failed (%s)", r.get("task_id"), r["error"])
            continue
        by_cat[category_of(r)].append(record_to_result_line(r))
    out: dict[str, Path] = {}
    for cat, lines in by_cat.items():
        path = Path(root) / "result" / model / "multi_turn" / f"{BFCL_VERSION_PREFIX}_{cat}_result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines.sort(key=lambda line: _id_key(line["id"]))
        path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        out[cat] = path
    return out


def export_log(log_path: str | Path, root: str | Path, *, model: str = DEFAULT_FC_MODEL) -> dict[str, Path]:
    return export_records(read_log_file(log_path), root, model=model)


def _id_key(task_id: str) -> tuple[str, int]:
    prefix, _, num = task_id.rpartition("_")
    return (prefix, int(num)) if num.isdigit() else (task_id, -1)


def read_bfcl_scores(root: str | Path, ids: Iterable[str], *, model: str = DEFAULT_FC_MODEL) -> dict[str,
                     tuple[bool, str | None]]:
    """Per-entry verdicts ``{id: (valid, error_type)}`` from ``bfcl evaluate``'s score files.

    BFCL lists only the failing entries (after a summary line); every other id it scored passed.
    """
    failures: dict[str, str | None] = {}
    score_dir = Path(root) / "score" / model
    files = list(score_dir.rglob(f"{BFCL_VERSION_PREFIX}_multi_turn_*_score.json"))
    if not files:
        raise FileNotFoundError(f"no BFCL multi-turn score files under {score_dir}")
    for f in files:
        for line in read_log_file(f):
            if "id" in line and line.get("valid") is False:
                failures[line["id"]] = (line.get("error") or {}).get("error_type")
    return {i: (i not in failures, failures.get(i)) for i in ids}
