"""The release's episode budget on a real long-context task: its ground truth fits the whole-context
cap (max_model_len - response_length) but not a continuation capped at response_length, and the
training tensors are cut without changing the verdict. ``seal eval``'s runner applies the same
budget from the same keys."""

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
    from budget_replay import replay, replay_eval
    from transformers import AutoTokenizer

    from env_service.client import EnvClient

    cfg = compose_config("exp/SEAL.yaml", ["env_service.url=null"])
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    client = EnvClient.in_process()
    try:
        out = {mode: replay(cfg, tokenizer, client, [TASK], mode, progress=False)[TASK] for mode in ("validate", "sample")}
        older = OmegaConf.merge(cfg, {"seal": {"rollout": {"episode_budget": "response"}}})
        out["response"] = replay(older, tokenizer, client, [TASK], "validate", progress=False)[TASK]
        out["eval"] = replay_eval(cfg, tokenizer, client, [TASK], progress=False)[TASK]
        out["eval_response"] = replay_eval(older, tokenizer, client, [TASK], progress=False)[TASK]
        short = OmegaConf.merge(cfg, {"actor_rollout_ref": {"rollout": {"max_model_len": 4096 + 8000}}})
        out["train_short"] = replay(short, tokenizer, client, [TASK], "validate", progress=False)[TASK]
        out["eval_short"] = replay_eval(short, tokenizer, client, [TASK], progress=False)[TASK]
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


def test_seal_eval_fits_what_the_trainers_fit(replayed):
    passed, reason, context = replayed["eval"]
    assert passed and reason == "terminated" and context <= 16384 - 4096 + 4096


def test_seal_eval_stops_where_the_trainers_stop(replayed):
    # The continuation cap and a context cap of 8,000 tokens both end the replay early, in the
    # trainers' runner and in seal eval alike (before, seal eval ran every episode to its end).
    for train, evaluated in (("response", "eval_response"), ("train_short", "eval_short")):
        assert not replayed[train][0] and replayed[train][1] == "context_overflow"
        assert not replayed[evaluated][0] and replayed[evaluated][1] == "context_overflow"
    assert replayed["eval_short"][2] >= 8000
