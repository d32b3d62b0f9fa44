"""The warm-start stage: run once, reuse after.

:func:`prepare` is called by the launcher before training (and by ``python -m seal.warm_start``,
which ``install.sh`` runs for the CPU quickstart). With ``seal.warm_start.enable``, it builds the
oracle transcripts of the warm start's tasks, fingerprints them with the base model and the
hyperparameters, fine-tunes (local backend: :mod:`seal.warm_start.sft`; verl backend: verl's SFT
trainer) unless a checkpoint with that fingerprint already exists, and returns the config with
``actor_rollout_ref.model.path`` pointing at the warm-started checkpoint. The checkpoint folder
holds ``warm_start.json``: base model, tasks, hyperparameters, per-epoch loss, wall time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from seal.config_base import ConfigError
from seal.trainer.tasks import select_task_ids, warm_start_task_ids
from seal.warm_start.settings import WarmStartSettings, check_disjoint, default_output, fingerprint
from seal.warm_start.transcripts import Transcript, build_transcripts

logger = logging.getLogger(__name__)

RECORD = "warm_start.json"


def transcripts_digest(transcripts: list[Transcript]) -> str:
    h = hashlib.sha256()
    for t in transcripts:
        h.update(json.dumps([t.task_id, t.prompt_ids, t.response_ids, t.response_mask]).encode())
    return h.hexdigest()


def existing_fingerprint(output: Path) -> str | None:
    try:
        return str(json.loads((output / RECORD).read_text())["fingerprint"])
    except (OSError, ValueError, KeyError):
        return None


def sft_on_verl(cfg: DictConfig) -> bool:
    """Whether verl's SFT trainer fine-tunes: the verl backend on an accelerator. verl on the CPU
    platform (``trainer.device=cpu``) warm-starts with the project's own SFT, as the local
    backend does, so a CPU verl run reuses the quickstart's checkpoint when their inputs agree."""
    return str(cfg.trainer.backend) == "verl" and str(cfg.trainer.get("device") or "").lower() != "cpu"


def trainer_identity(cfg: DictConfig) -> str:
    """Which trainer fine-tunes, and at what precision (part of the fingerprint)."""
    if sft_on_verl(cfg):
        return "verl.trainer.sft_trainer"
    from seal.engine.precision import resolve_autocast
    from seal.trainer.local.policy import resolve_device

    device = resolve_device(str(cfg.seal.local.device))
    return f"seal.warm_start.sft/{device.type}/{resolve_autocast(str(cfg.seal.local.autocast), device).setting}"


def prepare(cfg: DictConfig, *, val_ids: list[str] | None = None) -> DictConfig:
    """``cfg`` itself when the warm start is off; otherwise ``cfg`` with the model path replaced by
    the warm-started checkpoint (trained now unless it exists)."""
    settings = WarmStartSettings.from_config(cfg)
    if not settings.enable:
        return cfg
    if sft_on_verl(cfg) and settings.closing_weight != 1.0:
        raise ConfigError(f"seal.warm_start.closing_weight={settings.closing_weight}: verl's SFT trainer weighs "
                          "every model-written token alike; use 1.0 on the verl backend")
    from transformers import AutoTokenizer

    from seal.environment import environment_name
    from seal.trainer.local.policy import model_path

    warm_ids = warm_start_task_ids(cfg)
    if val_ids is None:
        val_ids = select_task_ids(cfg, "val")
    check_disjoint(warm_ids, val_ids)
    base = model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(base)
    transcripts = _transcripts(cfg, tokenizer, warm_ids)
    fp = fingerprint(base, transcripts_digest(transcripts), settings, trainer_identity(cfg))
    output = Path(settings.output) if settings.output else default_output(base, environment_name(cfg), fp)
    found = existing_fingerprint(output)
    if found == fp:
        logger.info("warm start: reusing %s (%d tasks, fingerprint %s)", output, len(warm_ids), fp)
    elif output.exists():
        raise ConfigError(f"seal.warm_start.output={output}: holds a different warm start (fingerprint {found}, "
                          f"this config's is {fp}); delete the folder or choose another output")
    else:
        _train(cfg, settings, transcripts, base=base, output=output, fp=fp, tokenizer=tokenizer)
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = str(output)
    return cfg


def _transcripts(cfg: DictConfig, tokenizer: Any, task_ids: list[str]) -> list[Transcript]:
    from env_service.client import EnvClient
    from seal.environment import environment_name

    with EnvClient.in_process(env=environment_name(cfg)) as client:
        return build_transcripts(cfg, tokenizer, client, task_ids)


def _train(cfg: DictConfig, settings: WarmStartSettings, transcripts: list[Transcript], *, base: str,
           output: Path, fp: str, tokenizer: Any) -> None:
    """Fine-tune into a temporary folder and move it into place only when complete."""
    logger.info("warm start: fine-tuning %s on %d oracle transcripts (%d epochs, lr %g) -> %s", base,
                len(transcripts), settings.epochs, settings.lr, output)
    partial = output.parent / f"{output.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    if sft_on_verl(cfg):
        from seal.warm_start.verl_sft import run_verl_sft

        run_verl_sft(cfg, settings, transcripts, base_model=base, output=partial)
        report = {"trainer": "verl.trainer.sft_trainer"}
    else:
        report = _train_local(cfg, settings, transcripts, base, partial, tokenizer)
    record = {"fingerprint": fp, "base_model": base, "trainer_identity": trainer_identity(cfg), "task_ids": [t.task_id for t in transcripts],
              "settings": settings.hyperparameters(), **report}
    (partial / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    partial.rename(output)
    logger.info("warm start: checkpoint written to %s", output)


def _train_local(cfg: DictConfig, settings: WarmStartSettings, transcripts: list[Transcript], base: str,
                 out: Path, tokenizer: Any) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from seal.engine.precision import log_choice, resolve_autocast
    from seal.trainer.local.policy import resolve_device
    from seal.warm_start.sft import supervised_finetune

    device = resolve_device(str(cfg.seal.local.device))
    choice = resolve_autocast(str(cfg.seal.local.autocast), device)
    log_choice(str(cfg.seal.local.autocast), choice, "warm start")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    report = supervised_finetune(model, transcripts, settings, device=device, autocast=choice.setting,
                                 progress=bool(cfg.seal.local.progress_bars))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"trainer": "seal.warm_start.sft", "epoch_losses": list(report.epoch_losses), "steps": report.steps,
            "trained_tokens": report.trained_tokens, "seconds": round(report.seconds, 1)}
