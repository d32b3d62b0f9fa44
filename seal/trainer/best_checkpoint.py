"""Best-validation-step checkpoints, kept as the SEAL release keeps them, on both backends.

After every validation pass (the one before training included) a strictly better score than every
earlier one is checkpointed as ``global_step_<k>`` and named in ``best_checkpoint.json``,
``best_checkpoint_path.txt`` and the ``best`` link; ``keep_only_best_checkpoint`` deletes the other
step folders. Unlike the release, the resume point is kept too and the best score is read back on
resume. The rule and both differences: docs/paper_map.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seal.config_base import ConfigError
from seal.schema import setting
from seal.trainer.finished import tracker_step

logger = logging.getLogger(__name__)

MARKER = "best_checkpoint.json"
PATH_MARKER = "best_checkpoint_path.txt"
LINK = "best"
STEP_PREFIX = "global_step_"

# The release's automatic choice, in order: the first group with a usable value wins and the
# alphabetically first key of that group is compared. verl names per-category scores
# val-core/<category>/<var>/mean@N; the local trainer names them val/<category>/pass_rate.
_AUTO_GROUPS: tuple[Callable[[str], bool], ...] = (
    lambda k: k.startswith("val-core/") and "/acc/" in k and "/mean@" in k,
    lambda k: k.startswith("val-core/") and "/reward/" in k and "/mean@" in k,
    lambda k: k.startswith("val-core/") and "/acc/" in k,
    lambda k: k.startswith("val-core/") and "/reward/" in k,
    lambda k: k.startswith("val-core/"),
    lambda k: k.startswith("val/") and k.count("/") == 2 and k.endswith("/pass_rate"),
)


@dataclass
class BestCheckpointSettings:
    """Best-step keeping, from the ``trainer.*`` keys of the schema (:class:`seal.schema.TrainerKeys`,
    which holds their defaults and docs)."""

    enabled: bool
    keep_only_best: bool
    metric: str | None
    mode: str

    @classmethod
    def from_trainer_cfg(cls, t: Any) -> "BestCheckpointSettings":
        def get(key: str) -> Any:
            return setting({"trainer": t}, f"trainer.{key}")

        mode = str(get("best_checkpoint_mode"))  # max or min: the schema's rule, checked by the config pass
        enabled = bool(get("save_best_checkpoint"))
        # As the release: a validation-only run saves no best checkpoint unless asked to.
        if bool(t.get("val_only", False)) and not bool(get("save_best_checkpoint_in_val_only")):
            enabled = False
        if enabled and t.get("max_actor_ckpt_to_keep"):
            raise ConfigError(
                f"trainer.max_actor_ckpt_to_keep={t.max_actor_ckpt_to_keep}: expected null with "
                "trainer.save_best_checkpoint=true (its pruning does not know the best step and may delete it; "
                "trainer.keep_only_best_checkpoint=true keeps the best and the latest)")
        metric = get("best_checkpoint_metric")
        return cls(enabled=enabled, keep_only_best=bool(get("keep_only_best_checkpoint")),
                   metric=str(metric) if metric else None, mode=mode)


def select_metric(metrics: Mapping[str, Any], configured: str | None) -> tuple[str | None, float | None]:
    """``(name, value)`` of the score compared across validation steps (``(None, None)``: none).

    A configured name that the validation did not report is a config error naming the keys that
    were reported, rather than a run that silently never saves a best checkpoint.
    """
    if configured:
        value = _finite(metrics.get(configured))
        if value is None:
            known = ", ".join(sorted(k for k in metrics if _finite(metrics[k]) is not None)[:12])
            raise ConfigError(f"trainer.best_checkpoint_metric={configured}: validation reported no such numeric "
                              f"metric (reported: {known}); set it to one of them or to null")
        return configured, value
    for matches in _AUTO_GROUPS:
        names = sorted(k for k, v in metrics.items() if matches(k) and _finite(v) is not None)
        if names:
            return names[0], _finite(metrics[names[0]])
    return None, None


def _finite(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class BestCheckpointKeeper:
    """Tracks the best validation step of one run and keeps its checkpoint folder.

    Args:
        root: the folder holding ``global_step_<k>/`` (verl's ``trainer.default_local_dir``, the
            local trainer's ``experiments/<name>/checkpoints``).
        settings: the ``trainer.*`` keys.
    """

    def __init__(self, root: Path, settings: BestCheckpointSettings) -> None:
        self.root = Path(root)
        self.settings = settings
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.metric_name: str | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def restore(self) -> None:
        """Read the best step and score of a resumed run back from ``best_checkpoint.json``."""
        marker = self.root / MARKER
        if not self.enabled or not marker.is_file():
            return
        try:
            data = json.loads(marker.read_text(encoding="utf-8"))
            value, step, name = float(data["metric_value"]), int(data["global_step"]), str(data["metric_name"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{marker}: damaged best-checkpoint marker ({exc}); delete it to start the best-step "
                              "tracking afresh") from exc
        if self.settings.metric and name != self.settings.metric:
            logger.warning("%s compared %s; this run compares %s: the best step is tracked afresh",
                           marker, name, self.settings.metric)
            return
        self.best_value, self.best_step, self.metric_name = value, step, name
        logger.info("best checkpoint so far: step %d (%s=%.6f)", step, name, value)

    def is_better(self, value: float) -> bool:
        if self.best_value is None:
            return True
        return value > self.best_value if self.settings.mode == "max" else value < self.best_value

    def after_validation(self, step: int, metrics: Mapping[str, Any], save: Callable[[], None]) -> dict[str, float]:
        """Compare step ``step``'s validation ``metrics`` with the best so far; on a new best call
        ``save()`` (which must leave ``root/global_step_<step>/`` and point the tracker at the
        newest checkpoint), write the markers and prune. Returns ``best_checkpoint/*`` metrics."""
        if not self.enabled:
            return {}
        name, value = select_metric(metrics, self.settings.metric)
        if name is None or value is None:
            logger.warning("best checkpoint: validation reported no usable score at step %d; nothing saved", step)
            return {"best_checkpoint/saved": 0.0}
        if not self.is_better(value):
            return {"best_checkpoint/saved": 0.0, "best_checkpoint/current_metric": value,
                    "best_checkpoint/best_metric": float(self.best_value), "best_checkpoint/best_step": float(self.best_step)}
        logger.info("best checkpoint: %s=%.6f at step %d (previous best %s)", name, value, step, self.best_value)
        # Saved first: until its folder is complete the previous best stays the one kept.
        save()
        self.best_value, self.best_step, self.metric_name = value, int(step), name
        self._write_markers()
        removed = self.prune()
        return {"best_checkpoint/saved": 1.0, "best_checkpoint/current_metric": value,
                "best_checkpoint/best_metric": value, "best_checkpoint/best_step": float(step),
                "best_checkpoint/removed_non_best": float(removed)}

    def _write_markers(self) -> None:
        folder = self.root / f"{STEP_PREFIX}{self.best_step}"
        meta = {"global_step": self.best_step, "metric_name": self.metric_name, "metric_value": self.best_value,
                "checkpoint_dir": str(folder), "mode": self.settings.mode}
        _write_atomic(self.root / MARKER, json.dumps(meta, indent=2) + "\n")
        _write_atomic(self.root / PATH_MARKER, f"{folder}\n")
        link = self.root / LINK
        tmp = self.root / f".{LINK}.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(folder.name)  # relative: the run folder can be moved
        os.replace(tmp, link)

    def prune(self) -> int:
        """With ``keep_only_best``: delete every ``global_step_*`` folder other than the best and
        the one the resume tracker names. Returns how many were deleted."""
        if not (self.enabled and self.settings.keep_only_best) or self.best_step is None:
            return 0
        keep = {self.best_step, tracker_step(self.root)}
        removed = 0
        for path in sorted(self.root.glob(f"{STEP_PREFIX}*")):
            suffix = path.name[len(STEP_PREFIX):]
            if not suffix.isdigit() or int(suffix) in keep:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed += 1
            logger.info("best checkpoint: removed %s (neither the best nor the latest)", path)
        return removed


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
