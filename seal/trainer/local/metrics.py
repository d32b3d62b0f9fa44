"""Step metrics to the console (one compact line), ``metrics.jsonl`` and TensorBoard."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# The keys shown on the compact console line, with their short names.
CONSOLE_KEYS = (
    ("step", "step"),
    ("train/reward_mean", "reward"),
    ("train/success_rate", "pass"),
    ("actor/loss", "loss"),
    ("actor/kl_loss", "kl"),
    ("actor/grad_norm", "gnorm"),
    ("seal/apatch/mean_scale", "apatch"),
    ("train/env_faults", "faults"),
    ("val/pass_rate", "val_pass"),
    ("timing/step_s", "s"),
)


def console_line(step: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}"]
    for key, short in CONSOLE_KEYS[1:]:
        if key in metrics:
            v = metrics[key]
            parts.append(f"{short}={v:.4g}" if isinstance(v, float) else f"{short}={v}")
    return " | ".join(parts)


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` and scalars to TensorBoard.

    A fresh run truncates ``metrics.jsonl``; a resumed run appends to it.
    """

    def __init__(self, exp_dir: Path, *, resume: bool, tensorboard: bool = True) -> None:
        self.path = Path(exp_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a" if resume else "w", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(exp_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._fh.write(json.dumps({"step": int(step), **clean}, sort_keys=True) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if math.isfinite(v):
                    self._tb.add_scalar(k, v, global_step=int(step))
            self._tb.flush()
        logger.info("%s", console_line(step, clean))

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
