"""Checkpoints of the local trainer: ``checkpoints/global_step_<k>/``.

A checkpoint holds everything needed to continue exactly: the model and optimizer state, the
RNG states (python, numpy, torch), the data position (epoch and index into the seeded
permutation) and the co-evolution state (the capability state file, byte-for-byte). The folder
is written under a temporary name and renamed when complete, and ``latest_checkpointed_iteration.txt``
(verl's file name) is updated last, so a crash mid-save leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seal.config_base import ConfigError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_FILE = "trainer_state.json"
START_FRESH = ("start fresh with a new trainer.experiment_name or trainer.resume_mode=disable, or resume an "
               "earlier checkpoint with trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_k>")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"global_step_{int(step)}"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    trainer_state: dict[str, Any], coevolution: Any, keep: int | None = None) -> Path:
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
    coevolution.save(tmp / "seal")
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
    text = marker.read_text(encoding="utf-8").strip()
    if not text.isdigit():
        raise ConfigError(f"{marker}: damaged checkpoint tracker ({text[:40]!r} is not a step number); "
                          f"{START_FRESH}")
    path = step_dir(root, int(text))
    if not path.is_dir():
        raise ConfigError(f"{marker} names {path.name}, which is missing; set trainer.resume_mode=disable "
                          "to start over or trainer.resume_from_path to another checkpoint")
    return path


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, coevolution: Any
                    ) -> dict[str, Any]:
    """Restore model, optimizer, RNG and the co-evolution state from ``path``; returns the trainer state."""
    path = Path(path)
    if not (path / TRAINER_FILE).is_file():
        raise ConfigError(f"trainer.resume_from_path={path}: not a checkpoint folder (no {TRAINER_FILE})")
    current = path / TRAINER_FILE
    try:
        state = json.loads(current.read_text(encoding="utf-8"))
        step = int(state["global_step"])
        current = path / "model.pt"
        model.load_state_dict(torch.load(current, map_location="cpu", weights_only=True))
        current = path / "optimizer.pt"
        optimizer.load_state_dict(torch.load(current, map_location="cpu", weights_only=True))
        current = path / "rng.pt"
        set_rng_state(torch.load(current, weights_only=False))
        current = path / "seal"
        coevolution.load(current, step=step)
        current = path / TRAINER_FILE
        state["data"]["epoch"], state["data"]["index"]
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        # torch.load and load_state_dict report a truncated or foreign file in many ways; all of
        # them mean the same to the user: this file is damaged, resume elsewhere or start over.
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{current}: damaged checkpoint, cannot resume ({reason}); {START_FRESH}") from exc
    return state
