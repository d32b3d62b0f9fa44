"""Is this experiment already complete? Read from the checkpoint tracker, before anything starts.

Rerunning the command of a finished experiment (same ``trainer.experiment_name``, every step
done, ``trainer.resume_mode=auto``) would resume at the last step and do nothing. The launcher
asks :func:`finished_message` first and, when the run is complete, prints where its results are
and how to start a fresh one instead. Only files are read: no model, Ray or service.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

TRACKER = "latest_checkpointed_iteration.txt"  # verl's file name; the local trainer writes it too


def finished_message(cfg: DictConfig, exp_dir: Path) -> str | None:
    """One line saying the run is complete (results, how to start afresh), or None."""
    if str(cfg.trainer.get("resume_mode")) != "auto":
        return None
    local = str(cfg.trainer.backend) == "local"
    root = Path(exp_dir) / "checkpoints" if local else Path(os.path.expanduser(str(cfg.trainer.default_local_dir)))
    done, total = _progress(cfg, root, local=local)
    if done is None or total is None or done < total:
        return None
    name = cfg.trainer.experiment_name
    return (f"experiment {name} is already complete ({done} of {total} training steps, checkpoints in {root}); "
            f"its results are in {exp_dir} (validation_log/, metrics); to start a fresh run give a new "
            f"trainer.experiment_name=... or set trainer.resume_mode=disable (which overwrites it)")


def tracker_step(root: Path) -> int | None:
    """The step named by ``root/latest_checkpointed_iteration.txt`` (None when absent or unreadable)."""
    marker = Path(root) / TRACKER
    if not marker.is_file():
        return None
    try:
        return int(marker.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None  # a damaged tracker is reported by the resume itself, with the file's name


def _progress(cfg: DictConfig, root: Path, *, local: bool) -> tuple[int | None, int | None]:
    """``(steps done, total steps)``; None where unknown. The local trainer's checkpoint records
    its task count. verl's step count is only known once its dataloader exists; an upper bound is
    cheap: the training tasks before the prompt-length filter (which only drops tasks), batched
    with ``drop_last`` as verl does. A run that reached the bound is certainly complete."""
    step = tracker_step(root)
    if step is None:
        return None, None
    total = cfg.trainer.get("total_training_steps")
    if local:
        state = _read_json(root / f"global_step_{step}" / "trainer_state.json")
        if state is None:
            return None, None
        step = int(state.get("global_step", step))
        num_tasks = (state.get("data") or {}).get("num_tasks")
    else:
        num_tasks = None if total else _train_task_count(cfg)
    if not total:
        if not num_tasks:
            return None, None
        total = int(cfg.trainer.total_epochs) * (int(num_tasks) // int(cfg.data.train_batch_size))
    return step, int(total)


def _train_task_count(cfg: DictConfig) -> int | None:
    from seal.config_base import ConfigError
    from seal.trainer.tasks import select_task_ids

    try:
        return len(select_task_ids(cfg, "train"))
    except ConfigError:
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
