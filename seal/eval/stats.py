"""Pure statistics over validation-log records: pass rates per category, splits, tags, repeats."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from seal.eval.logs import is_errored, is_pass

SHORT_NAMES: dict[str, str] = {"multi_turn_base": "Base", "multi_turn_miss_func": "MissFunc",
                               "multi_turn_miss_param": "MissParam", "multi_turn_long_context": "LongCtx"}
# The paper's column order; unknown categories are appended alphabetically.
CATEGORY_ORDER: tuple[str, ...] = tuple(SHORT_NAMES)
OVERALL = "overall"


@dataclass(frozen=True)
class PassCount:
    """Passes among the ``n`` scored episodes; ``errored`` episodes (see
    :func:`~seal.eval.logs.is_errored`) could not be run and are not part of ``n``."""

    n_pass: int
    n: int
    errored: int = 0

    @property
    def rate(self) -> float:
        return self.n_pass / self.n if self.n else float("nan")

    def cell(self) -> str:
        """The release's cell format: ``pass_rate (n_pass/n)`` with the rate in percent."""
        if not self.n:
            return f"- ({self.errored} errored)" if self.errored else "-"
        text = f"{100 * self.rate:.2f} ({self.n_pass}/{self.n})"
        return f"{text} +{self.errored} errored" if self.errored else text


def category_of(record: Mapping[str, Any]) -> str:
    """``data_source``, else the category encoded in a BFCL id (``multi_turn_base_12``)."""
    cat = record.get("data_source") or record.get("category")
    if cat:
        return str(cat)
    task_id = record.get("task_id")
    if task_id and "_" in str(task_id):
        return str(task_id).rsplit("_", 1)[0]
    raise KeyError("log record has no data_source and no BFCL task_id to infer the category from")


def order_categories(categories: Iterable[str]) -> list[str]:
    cats = set(categories)
    known = [c for c in CATEGORY_ORDER if c in cats]
    return known + sorted(cats - set(CATEGORY_ORDER))


def dedupe_latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (task_id, repeat): the last one written (a resumed run redoes errors).

    Records without a task_id (possible in the release's format) are all kept.
    """
    keyed: dict[tuple[str, int], dict[str, Any]] = {}
    anonymous: list[dict[str, Any]] = []
    for r in records:
        if r.get("task_id") is None:
            anonymous.append(r)
        else:
            keyed[(str(r["task_id"]), int(r.get("repeat", 0) or 0))] = r
    return list(keyed.values()) + anonymous


def pass_counts(records: Iterable[dict[str, Any]]) -> dict[str, PassCount]:
    """``{category: PassCount}`` plus ``overall`` (pooled over all records); errored episodes
    are counted apart, outside the rates."""
    npass: Counter[str] = Counter()
    total: Counter[str] = Counter()
    errored: Counter[str] = Counter()
    for r in records:
        cat = category_of(r)
        if is_errored(r):
            errored[cat] += 1
            continue
        total[cat] += 1
        npass[cat] += int(is_pass(r))
    out = {c: PassCount(npass[c], total[c], errored[c]) for c in order_categories(set(total) | set(errored))}
    out[OVERALL] = PassCount(sum(npass.values()), sum(total.values()), sum(errored.values()))
    return out


def category_mean(counts: Mapping[str, PassCount]) -> float:
    """Unweighted mean of the per-category rates: the paper's "Avg" column."""
    rates = [pc.rate for c, pc in counts.items() if c != OVERALL and pc.n]
    return sum(rates) / len(rates) if rates else float("nan")


def tag_distribution(records: Iterable[dict[str, Any]]) -> Counter[str]:
    """How often each per-turn failure tag occurs across the records' ``tags`` lists."""
    return Counter(str(t) for r in records for t in r.get("tags") or [])


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return float("nan"), float("nan")
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))

