"""Checkpoints of the local trainer: ``checkpoints/global_step_<k>/``.

A checkpoint holds everything needed to continue exactly: the model and optimizer state, the
RNG states (python, numpy, torch), the data position (epoch and index into the seeded
permutation) and the SEAL hooks' state (the capability state file, byte-for-byte). The folder
is written under a temporary name and renamed when complete, and ``latest_checkpointed_iteration.txt``
(verl's file name) is updated last, so a crash mid-save leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seal.config import ConfigError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_FILE = "trainer_state.json"


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"global_step_{int(step)}"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    trainer_state: dict[str, Any], hooks: Any, keep: int | None = None) -> Path:
    """Write ``root/global_step_<step>/`` atomically and mark it as the latest."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = root / f".tmp_global_step_{int(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(model.state_dict(), tmp / "model.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / TRAINER_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True), encoding="utf-8")
    hooks.save(tmp / "seal")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (root / LATEST_FILE).write_text(str(int(step)), encoding="utf-8")
    if keep:
        _prune(root, keep)
    logger.info("checkpoint saved: %s", final)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*") if p.name.rsplit("_", 1)[1].isdigit())
    for s in steps[:-keep]:
        shutil.rmtree(step_dir(root, s), ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint named by ``latest_checkpointed_iteration.txt`` (``None`` if there is none)."""
    marker = Path(root) / LATEST_FILE
    if not marker.is_file():
        return None
    path = step_dir(root, int(marker.read_text(encoding="utf-8").strip()))
    if not path.is_dir():
        raise ConfigError(f"{marker} names {path.name}, which is missing; set trainer.resume_mode=disable "
                          "to start over or trainer.resume_from_path to another checkpoint")
    return path


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, hooks: Any
                    ) -> dict[str, Any]:
    """Restore model, optimizer, RNG and hooks from ``path``; returns the trainer state."""
    path = Path(path)
    if not (path / TRAINER_FILE).is_file():
        raise ConfigError(f"trainer.resume_from_path={path}: not a checkpoint folder (no {TRAINER_FILE})")
    model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    hooks.load(path / "seal")
    return json.loads((path / TRAINER_FILE).read_text(encoding="utf-8"))
