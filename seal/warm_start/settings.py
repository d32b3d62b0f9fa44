"""``seal.warm_start``: the supervised warm start's settings (its tasks: ``seal.trainer.tasks.warm_start_task_ids``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from seal.config_base import REPO_ROOT, ConfigError, check_fields
from seal.schema import WarmStartKeys, block


@dataclass(frozen=True)
class WarmStartSettings(WarmStartKeys):
    """The block ``seal.warm_start``; its fields, defaults and docs are the schema's :class:`WarmStartKeys`."""

    def __post_init__(self) -> None:
        check_fields(self, "seal.warm_start")

    @classmethod
    def from_config(cls, cfg: Any) -> WarmStartSettings:
        settings = block(cls, cfg, "seal.warm_start")
        ids = settings.task_ids
        return settings if ids is None else replace(settings, task_ids=tuple(str(t) for t in ids))

    def hyperparameters(self) -> dict[str, Any]:
        """What changes the trained weights besides the data and the base model."""
        d = asdict(self)
        out = {k: d[k] for k in ("epochs", "lr", "batch_size", "grad_clip", "seed")}
        if self.closing_weight != 1.0:  # absent at its default: earlier warm starts keep their fingerprint
            out["closing_weight"] = self.closing_weight
        return out


def check_disjoint(warm_ids: list[str], val_ids: list[str]) -> None:
    """Validation must never see a task the warm start trained on."""
    shared = sorted(set(warm_ids) & set(val_ids))
    if shared:
        raise ConfigError(f"seal.warm_start: validation task(s) {', '.join(shared[:5])} are also warm-start tasks; "
                          "remove them from seal.warm_start.task_ids or seal.tasks.val_ids")


def fingerprint(base_model: str, transcripts_digest: str, settings: WarmStartSettings, trainer: str) -> str:
    """A short id of what determines the warm-started weights: base model folder (its config and
    weight files' sizes and times), the transcripts' tokens, the hyperparameters and ``trainer``
    (which trainer, and at what precision: bf16 autocast and fp32 give different weights)."""
    h = hashlib.sha256()
    base = Path(base_model)
    h.update(str(base.resolve() if base.exists() else base_model).encode())
    if base.is_dir():
        for f in sorted(base.iterdir()):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(transcripts_digest.encode())
    h.update(json.dumps(settings.hyperparameters(), sort_keys=True).encode())
    h.update(trainer.encode())
    return h.hexdigest()[:12]


def default_output(base_model: str, env_name: str, fp: str) -> Path:
    """``models/warm_start/<base model folder>-<environment>-<fingerprint>`` under the project."""
    return REPO_ROOT / "models" / "warm_start" / f"{Path(base_model).name}-{env_name}-{fp}"
