"""Task metadata for statistics: split and category per task id, and recovering the task of a
release-format log line that lacks ``task_id`` (from its first user query)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class TaskInfo:
    task_id: str
    category: str
    split: str | None
    query: str | None  # first user message, used to recognise release-format log lines


def parquet_index(path: str | Path) -> dict[str, TaskInfo]:
    """``{task id: TaskInfo}`` from a SEAL parquet (``extra_info.index``/``split``/``dataset_type``)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"parquet {path} not found; pass --parquet data/bfcl_eval_400.parquet")
    df = pd.read_parquet(path, columns=["data_source", "prompt", "extra_info"])
    out: dict[str, TaskInfo] = {}
    for source, prompt, extra in zip(df["data_source"], df["prompt"], df["extra_info"]):
        tid = str(extra.get("index") or extra.get("original_id"))
        first_user = list(prompt)[1:2]
        query = (str(first_user[0].get("content") or "") or None) if first_user else None
        out[tid] = TaskInfo(tid, str(extra.get("dataset_type") or source), extra.get("split"), query)
    return out


def bfcl_jsonl_index(paths: Iterable[str | Path]) -> dict[str, TaskInfo]:
    """``{task id: TaskInfo}`` from BFCL question JSONL files (``BFCL_v4_multi_turn_*.json``)."""
    out: dict[str, TaskInfo] = {}
    for p in paths:
        with Path(p).open(encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                entry = json.loads(line)
                tid = str(entry["id"])
                turns = entry.get("question") or []
                query = (str(turns[0][0].get("content") or "") or None) if turns and turns[0] else None
                out[tid] = TaskInfo(tid, tid.rsplit("_", 1)[0], None, query)
    return out


def merge_indexes(*indexes: dict[str, TaskInfo]) -> dict[str, TaskInfo]:
    """Later indexes fill in what earlier ones lack (the parquet's split wins over None)."""
    out: dict[str, TaskInfo] = {}
    for idx in indexes:
        for tid, info in idx.items():
            old = out.get(tid)
            out[tid] = info if old is None else TaskInfo(tid, old.category, old.split or info.split,
                                                         old.query or info.query)
    return out


class RecordIdentifier:
    """Fills ``task_id``/``data_source``/``split`` of log records from a task index."""

    def __init__(self, index: dict[str, TaskInfo]) -> None:
        self.index = index
        self._by_query: dict[str, list[str]] = {}
        for tid, info in index.items():
            if info.query:
                self._by_query.setdefault(info.query.strip(), []).append(tid)

    def task_id(self, record: dict[str, Any]) -> str | None:
        """The record's task id, or the unique task whose first query ends its ``input``."""
        if record.get("task_id"):
            return str(record["task_id"])
        text = str(record.get("input") or "").strip()
        if not text:
            return None
        cat = record.get("data_source")
        hits = [tid for q, tids in self._by_query.items() if q and q in text for tid in tids
                if cat is None or self.index[tid].category == cat]
        return hits[0] if len(set(hits)) == 1 else None

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``record`` with task_id, data_source and split filled where they can be."""
        out = dict(record)
        tid = self.task_id(record)
        if tid and not out.get("task_id"):
            out["task_id"] = tid
        info = self.index.get(tid) if tid else None
        if not out.get("data_source") and info:
            out["data_source"] = info.category
        if not out.get("split") and info and info.split:
            out["split"] = info.split
        return out
