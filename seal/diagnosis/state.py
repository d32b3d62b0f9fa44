"""The capability state: what the policy can and cannot do yet, per category, tag and turn.

One :meth:`CapabilityState.observe` per *training* episode (never for validation) adds the
episode's reward and per-turn tags to buckets kept twice: ``window`` (since the last epoch
boundary) and ``total`` (since the start of the run). The state also keeps per-task records,
and persists to versioned JSON atomically. It holds only the diagnosis: a reweighter that adapts
to it (A-Patch's dynamic tag weights, from :meth:`CapabilityState.tag_source`) keeps its own
state, which the trainer saves beside this one (:mod:`seal.advantage.registry`).

The trainer saves *before* :meth:`reset_window` at an epoch end, so the saved window holds the
epoch that ended; :meth:`load` raises on a missing, corrupt or foreign-version file rather than
starting fresh or resuming an unrelated run: the trainer decides whether a state should exist
(on resume) and loads it explicitly. (docs/paper_map.md compares the release's persistence.)
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seal_shared.types import UNKNOWN_TAG, FailureTag

logger = logging.getLogger(__name__)

STATE_VERSION = 1
BUCKETS = ("categories", "tags", "category_tags", "turn_positions")


class CapabilityStateError(ValueError):
    """A capability-state file that cannot be used (corrupt, or another format version)."""


@dataclass
class CapabilityStats:
    """Counters for one bucket key. ``partial_count``: observations with 0 < reward < 1."""

    count: int = 0
    success: int = 0
    reward_sum: float = 0.0
    partial_count: int = 0

    def add(self, reward: float, success: bool) -> None:
        self.count += 1
        self.success += int(bool(success))
        self.reward_sum += float(reward)
        self.partial_count += int(0.0 < reward < 1.0)

    @property
    def success_rate(self) -> float:
        return self.success / self.count if self.count else 0.0

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.count if self.count else 0.0

    def summary(self) -> dict[str, float]:
        """The stored counters plus the derived ``success_rate`` and ``reward_mean``."""
        return {**asdict(self), "success_rate": self.success_rate, "reward_mean": self.reward_mean}


def dominant_tag(tags: Iterable[str]) -> str:
    """An episode's dominant tag: the most frequent tag other than ``pass`` (ties: first seen);
    else ``pass`` if present; else ``unknown``. (The release's rule, kept as is.)"""
    tags = [str(t) for t in tags]
    failures = Counter(t for t in tags if t != FailureTag.PASS)
    if failures:
        best = max(failures.values())
        return next(t for t in tags if failures.get(t) == best)
    return str(FailureTag.PASS) if tags else UNKNOWN_TAG


def turn_position(index: int, n_turns: int) -> str:
    """Position bucket of turn ``index`` (0-based) of ``n_turns``: only / early / middle / late."""
    if n_turns <= 1:
        return "only"
    frac = (index + 1) / n_turns
    if frac <= 1 / 3:
        return "early"
    return "middle" if frac <= 2 / 3 else "late"


def _empty_buckets() -> dict[str, dict[str, CapabilityStats]]:
    return {b: {} for b in BUCKETS}


def _bump(bucket: dict[str, CapabilityStats], key: str, reward: float, success: bool) -> None:
    bucket.setdefault(key, CapabilityStats()).add(reward, success)


class CapabilityState:
    """Window and total diagnosis counters and per-task records."""

    def __init__(self) -> None:
        self.window = _empty_buckets()
        self.total = _empty_buckets()
        self.tasks: dict[str, dict[str, Any]] = {}
        self.last_epoch: int | None = None
        self.last_step: int | None = None
        self.observe_count = 0

    def observe(self, category: str, task_id: str, reward: float, success: bool, tags: Iterable[str], epoch: int,
                step: int) -> None:
        """Add one training episode. ``tags``: its per-turn tags (empty -> ``["unknown"]``).

        Each tag *occurrence* adds the episode's reward to the tag's buckets, so an episode
        with three ``state_mismatch`` turns counts three times there (the release's rule).
        """
        tags = [str(t) for t in tags] or [UNKNOWN_TAG]
        reward = float(reward)
        for buckets in (self.window, self.total):
            _bump(buckets["categories"], category, reward, success)
            for i, tag in enumerate(tags):
                _bump(buckets["tags"], tag, reward, success)
                _bump(buckets["category_tags"], f"{category}::{tag}", reward, success)
                _bump(buckets["turn_positions"], f"{turn_position(i, len(tags))}::{tag}", reward, success)
        self._observe_task(category, task_id, reward, success, tags, step)
        self.last_epoch, self.last_step = int(epoch), int(step)
        self.observe_count += 1

    def _observe_task(self, category: str, task_id: str, reward: float, success: bool, tags: list[str],
                      step: int) -> None:
        rec = self.tasks.setdefault(task_id, {"task_id": task_id, "category": category, "count": 0, "success": 0,
                                              "reward_sum": 0.0, "tag_counts": {}})
        rec["category"] = category
        rec["count"] += 1
        rec["success"] += int(bool(success))
        rec["reward_sum"] += reward
        rec["last_reward"] = reward
        rec["last_success"] = bool(success)
        rec["last_tag"] = dominant_tag(tags)
        rec["last_step"] = int(step)
        for tag in tags:
            rec["tag_counts"][tag] = rec["tag_counts"].get(tag, 0) + 1

    def reset_window(self) -> None:
        """Start a new window (call at an epoch boundary, *after* saving and dumping)."""
        self.window = _empty_buckets()

    def tag_source(self, *, category: str | None = None) -> dict[str, CapabilityStats]:
        """The tag statistics that drive adaptation: the window's if non-empty, else the totals.

        With ``category``, the ``category::tag`` buckets of that category, keyed by tag.
        """
        for buckets in (self.window, self.total):
            if category is None:
                source = buckets["tags"]
            else:
                prefix = f"{category}::"
                source = {k[len(prefix):]: v for k, v in buckets["category_tags"].items() if k.startswith(prefix)}
            if source:
                return dict(source)
        return {}

    def snapshot(self, window: bool) -> dict[str, Any]:
        """A readable view: the window (or total) buckets with derived rates, and the tasks."""
        buckets = self.window if window else self.total
        return {
            "scope": "window" if window else "total",
            **{b: {k: s.summary() for k, s in buckets[b].items()} for b in BUCKETS},
            "tasks": {k: dict(v, tag_counts=dict(v["tag_counts"])) for k, v in self.tasks.items()},
            "observe_count": self.observe_count,
            "last_epoch": self.last_epoch,
            "last_step": self.last_step,
        }

    def to_dict(self) -> dict[str, Any]:
        """The persisted form: ``{"version": 1, "window_<bucket>": ..., "total_<bucket>": ..., ...}``."""
        out: dict[str, Any] = {"version": STATE_VERSION}
        for scope, buckets in (("window", self.window), ("total", self.total)):
            for b in BUCKETS:
                out[f"{scope}_{b}"] = {k: asdict(s) for k, s in buckets[b].items()}
        out["tasks"] = {k: dict(v, tag_counts=dict(v["tag_counts"])) for k, v in self.tasks.items()}
        out.update(last_epoch=self.last_epoch, last_step=self.last_step, observe_count=self.observe_count)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapabilityState:
        """Inverse of :meth:`to_dict`; raises :class:`CapabilityStateError` on another version or shape.
        Other keys are ignored (a state saved before A-Patch kept its weights apart carries them)."""
        if not isinstance(data, Mapping):
            raise CapabilityStateError(f"capability state must be a JSON object, got {type(data).__name__}")
        if data.get("version") != STATE_VERSION:
            raise CapabilityStateError(f"capability state version {data.get('version')!r} is not supported "
                                       f"(expected {STATE_VERSION}); start without it or convert the file")
        state = cls()
        try:
            for scope, buckets in (("window", state.window), ("total", state.total)):
                for b in BUCKETS:
                    buckets[b] = {k: CapabilityStats(**v) for k, v in data[f"{scope}_{b}"].items()}
            state.tasks = {k: dict(v, tag_counts=dict(v["tag_counts"])) for k, v in data["tasks"].items()}
            state.last_epoch, state.last_step = data["last_epoch"], data["last_step"]
            state.observe_count = int(data["observe_count"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CapabilityStateError(f"capability state is malformed: {exc!r}") from exc
        return state

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically: a temp file in the same directory, fsync, then ``os.replace``.

        A crash at any point leaves either the previous file or the new one, never a torn file.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.to_dict(), fh, indent=2, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            # Remove our own temp file; the previous state file is untouched.
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        logger.debug("saved capability state (%d episodes) to %s", self.observe_count, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CapabilityState:
        """Read a state saved by :meth:`save`. Missing file -> ``FileNotFoundError``; a corrupt
        or other-version file -> :class:`CapabilityStateError`. Never falls back silently."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CapabilityStateError(f"capability state file {path} is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable on POSIX; some platforms cannot open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
