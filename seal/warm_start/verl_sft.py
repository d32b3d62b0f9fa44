"""The warm start on GPUs: verl's own SFT trainer (``verl.trainer.sft_trainer``) on the oracle
conversations.

The transcripts are written as a parquet of chat conversations (column ``messages``, the format of
verl's ``MultiTurnSFTDataset``, which trains on every assistant message), then verl's trainer runs
under ``torchrun`` with the warm start's hyperparameters and writes its Hugging Face export
(``checkpoint.save_contents`` includes ``hf_model``) under ``<output>/verl_sft/``; the newest
``global_step_*/huggingface`` folder is moved to ``<output>``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seal.warm_start.settings import WarmStartSettings
from seal.warm_start.transcripts import Transcript

logger = logging.getLogger(__name__)

SFT_MODULE = "verl.trainer.sft_trainer"
CPU_SFT_MODULE = "seal.warm_start.cpu_sft"


def conversation(t: Transcript) -> list[dict[str, str]]:
    """``t``'s messages as plain ``{role, content}`` chat messages."""
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in t.messages]


def write_sft_parquet(transcripts: Sequence[Transcript], path: Path) -> Path:
    """One row per transcript: ``messages`` (the conversation) and ``task_id``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"messages": [conversation(t) for t in transcripts],
                      "task_id": [t.task_id for t in transcripts]})
    pq.write_table(table, path)
    return path


def sft_overrides(cfg: Any, settings: WarmStartSettings, *, data_file: Path, base_model: str, work_dir: Path,
                  max_length: int) -> list[str]:
    """Hydra overrides of verl's ``sft_trainer_engine`` config for this warm start."""
    # verl splits a batch evenly over its data-parallel ranks: round up to a multiple of the GPUs.
    n_gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    batch = n_gpus * max(1, -(-settings.batch_size // n_gpus))
    return [
        f"data.train_files={data_file}",
        "data.val_files=null",
        "data.messages_key=messages",
        f"data.train_batch_size={batch}",
        "data.micro_batch_size_per_gpu=1",
        f"data.max_length={max_length}",
        f"data.max_token_len_per_gpu={max(max_length, 8192)}",
        "data.truncation=error",
        f"model.path={base_model}",
        *_attention_overrides(),
        f"optim.lr={settings.lr}",
        "optim.weight_decay=0.0",
        f"optim.clip_grad={settings.grad_clip}",
        "optim.lr_warmup_steps_ratio=0.0",
        f"trainer.total_epochs={settings.epochs}",
        f"trainer.seed={settings.seed}",
        f"trainer.default_local_dir={work_dir}",
        f"trainer.n_gpus_per_node={int(cfg.trainer.n_gpus_per_node)}",
        f"trainer.nnodes={int(cfg.trainer.nnodes)}",
        "trainer.logger=[console]",
        "trainer.resume_mode=disable",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]


def _attention_overrides() -> list[str]:
    """verl's model config asks for flash-attn by default; without the package (an optional part of
    the GPU install) the fine-tune runs on PyTorch's sdpa with padding kept, as the RL side does
    (``seal.trainer.verl.main``)."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return ["model.use_remove_padding=true"]
    return ["model.use_remove_padding=false", "+model.override_config.attn_implementation=sdpa"]


def sft_command(cfg: Any, overrides: Sequence[str]) -> list[str]:
    """``torchrun`` on one node with one process per GPU (multi-node warm starts: run verl's
    trainer with these overrides under your cluster's launcher). Where the verl backend runs on
    the CPU platform (:func:`seal.trainer.verl.main.runs_on_cpu`), verl's trainer runs through
    :mod:`seal.warm_start.cpu_sft` on gloo."""
    from seal.trainer.verl.main import runs_on_cpu

    module, extra = SFT_MODULE, []
    if runs_on_cpu(cfg):
        from seal.warm_start.cpu_sft import CPU_OVERRIDES

        module, extra = CPU_SFT_MODULE, list(CPU_OVERRIDES)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc_per_node={int(cfg.trainer.n_gpus_per_node)}", "-m", module, *overrides, *extra]


def newest_hf_export(work_dir: Path) -> Path:
    """The ``huggingface`` folder of the newest ``global_step_*`` under ``work_dir``."""
    steps = sorted(work_dir.glob("global_step_*/huggingface"), key=lambda p: int(p.parent.name.split("_")[-1]))
    if not steps:
        raise FileNotFoundError(f"verl's SFT trainer wrote no global_step_*/huggingface under {work_dir}")
    return steps[-1]


def run_verl_sft(cfg: Any, settings: WarmStartSettings, transcripts: Sequence[Transcript], *, base_model: str,
                 output: Path) -> None:
    """Export, run verl's SFT trainer, and leave the Hugging Face checkpoint in ``output``."""
    work = output.parent / f"{output.name}.verl_sft"
    data_file = write_sft_parquet(transcripts, work / "train.parquet")
    longest = max(len(t.prompt_ids) + len(t.response_ids) for t in transcripts)
    overrides = sft_overrides(cfg, settings, data_file=data_file, base_model=base_model, work_dir=work / "ckpt",
                              max_length=longest + 64)
    cmd = sft_command(cfg, overrides)
    logger.info("warm start with verl's SFT trainer: %s", " ".join(cmd))
    subprocess.run(cmd, check=True)
    shutil.move(str(newest_hf_export(work / "ckpt")), str(output))
