"""Shared pieces of the warm-start tests: a tiny model (SmolLM2's vocabulary), its folder, notes configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from seal.config import REPO_ROOT, compose_config

# Two notes training tasks (2 turns, one call each) and one 3-turn one.
TASKS = ["notes_000", "notes_001", "notes_007"]


def tiny_model(tokenizer: Any, seed: int = 0) -> torch.nn.Module:
    """2 layers, hidden 32, SmolLM2's vocabulary; random weights from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


@pytest.fixture
def tiny_model_dir(tmp_path: Path, tokenizer: Any) -> Path:
    """A saved tiny model with SmolLM2's tokenizer: a base model the stage can load by path."""
    path = tmp_path / "tiny-base"
    tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def notes_cfg(*overrides: str) -> Any:
    """exp/examples/notes.yaml with enough LLM calls for 3-turn tasks, the warm start on ``TASKS``."""
    return compose_config(REPO_ROOT / "exp" / "examples" / "notes.yaml", [
        "seal.rollout.max_llm_calls=8", "seal.rollout.few_shot=false", "seal.local.device=cpu",
        "seal.local.autocast=none", "seal.local.progress_bars=false", "seal.warm_start.enable=true",
        f"seal.warm_start.task_ids=[{','.join(TASKS)}]", *overrides])
