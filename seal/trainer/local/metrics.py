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
    ("seal/reward_mean", "reward"),
    ("seal/success_rate", "pass"),
    ("actor/loss", "loss"),
    ("actor/kl_loss", "kl"),
    ("actor/grad_norm", "gnorm"),
    ("seal/apatch/mean_scale", "apatch"),
    ("seal/env_faults", "faults"),
    ("val/pass_rate", "val_pass"),
    ("timing/step_s", "s"),
)


def console_line(step: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}"]
    for key, short in CONSOLE_KEYS:
        if key in metrics:
            v = metrics[key]
            parts.append(f"{short}={v:.4g}" if isinstance(v, float) else f"{short}={v}")
    return " | ".join(parts)


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` and scalars to TensorBoard.

    A fresh run (``resume_step=None``) truncates ``metrics.jsonl``. A run resumed from the
    checkpoint of step ``resume_step`` keeps the lines up to that step and drops later ones (steps
    a killed run logged after its last checkpoint, which the resumed run redoes), then appends.
    """

    def __init__(self, exp_dir: Path, *, resume_step: int | None, tensorboard: bool = True) -> None:
        self.path = Path(exp_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[str] = []
        if resume_step is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if int(json.loads(line)["step"]) <= resume_step:
                        kept.append(line + "\n")
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from the interrupted run
        self._fh = self.path.open("w", encoding="utf-8")
        self._fh.writelines(kept)
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
