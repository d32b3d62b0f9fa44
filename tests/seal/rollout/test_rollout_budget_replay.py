"""The release's episode budget on a real long-context task: its ground truth fits the whole-context
cap (max_model_len - response_length) but not a continuation capped at response_length, and the
training tensors are cut without changing the verdict."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from seal.config import REPO_ROOT, compose_config

sys.path.insert(0, str(REPO_ROOT / "scripts"))

MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
# Its oracle replay is 11,544 tokens in all (prompt 5,900+): within 16,384 - 4,096 = 12,288, while
# its continuation passes 4,096 tokens.
TASK = "multi_turn_long_context_8"


@pytest.fixture(scope="module")
def replayed() -> dict[str, Any]:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from budget_replay import replay
    from transformers import AutoTokenizer

    from env_service.client import EnvClient

    cfg = compose_config("exp/SEAL.yaml", ["env_service.url=null"])
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    client = EnvClient.in_process()
    try:
        out = {mode: replay(cfg, tokenizer, client, [TASK], mode, progress=False)[TASK] for mode in ("validate", "sample")}
        older = OmegaConf.merge(cfg, {"seal": {"rollout": {"episode_budget": "response"}}})
        out["response"] = replay(older, tokenizer, client, [TASK], "validate", progress=False)[TASK]
    finally:
        client.close()
    return out


def test_the_release_budget_fits_the_whole_ground_truth(replayed):
    passed, reason, whole = replayed["validate"]
    assert passed and reason == "completed" and 4096 + 5000 < whole <= 16384 - 4096


def test_training_and_validation_use_the_same_budget(replayed):
    assert replayed["sample"][0] and replayed["sample"][1] == "completed"


def test_a_continuation_capped_at_response_length_cuts_it_short(replayed):
    passed, reason, _ = replayed["response"]
    assert not passed and reason == "context_overflow"
