"""The verl backend: the SEAL recipe on Ray + FSDP + async vLLM, as a thin layer over pinned verl.

* :func:`run_verl` — entry point for ``trainer.backend=verl`` (see ``main.py``);
* :class:`SealPPOTrainer` — verl's V1 sync trainer (``PPOTrainerSync``) with SEAL's step in its seams;
* :class:`TaskDataset` — task-id rows for verl's dataloader (no long prompts).

Attributes load on first access: importing verl's trainer takes several seconds.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_verl": "seal.trainer.verl.main",
    "prepare_config": "seal.trainer.verl.main",
    "SealTaskRunner": "seal.trainer.verl.main",
    "build_trainer": "seal.trainer.verl.main",
    "SealPPOTrainer": "seal.trainer.verl.trainer",
    "TaskDataset": "seal.trainer.verl.dataset",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seal.trainer.verl' has no attribute {name!r}")
