"""The GPU warm start feeds verl's own SFT trainer: its dataset class reads our export and trains on
the same tokens as the local fine-tune, and our overrides are keys of its config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from env_service.client import EnvClient
from seal.warm_start.settings import WarmStartSettings
from seal.warm_start.transcripts import build_transcripts
from seal.warm_start.cpu_sft import CPU_OVERRIDES
from seal.warm_start.verl_sft import (CPU_SFT_MODULE, SFT_MODULE, newest_hf_export, sft_command, sft_overrides,
                                     write_sft_parquet)

from .conftest import TASKS, notes_cfg


@pytest.fixture(scope="module")
def transcripts(tokenizer):
    client = EnvClient.in_process(env="notes")
    try:
        return build_transcripts(notes_cfg(), tokenizer, client, TASKS)
    finally:
        client.close()


def test_verls_multiturn_dataset_trains_the_tokens_the_local_fine_tune_trains(tokenizer, transcripts,
                                                                              tmp_path: Path) -> None:
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    path = write_sft_parquet(transcripts, tmp_path / "train.parquet")
    data = MultiTurnSFTDataset(str(path), tokenizer, {"pad_mode": "no_padding", "max_length": 8192,
                                                      "truncation": "error", "messages_key": "messages"})
    assert len(data) == len(transcripts)
    for i, t in enumerate(transcripts):
        row = data[i]
        ours = list(t.prompt_ids) + list(t.response_ids)
        theirs = row["input_ids"].tolist()
        # The same token sequence (verl's per-message tokenisation ends the last message with the
        # template's newline, which the runner's generation does not produce)...
        assert theirs[: len(ours)] == ours and len(theirs) - len(ours) <= 1
        # ...and verl trains on our trained tokens, plus at most the template's trailing newline
        # after each assistant message.
        our_mask = [0] * len(t.prompt_ids) + list(t.response_mask)
        mask = row["loss_mask"].tolist()
        assert all(mask[k] for k, m in enumerate(our_mask) if m)
        extra = [theirs[k] for k, m in enumerate(mask) if m and (k >= len(our_mask) or not our_mask[k])]
        assert set(tokenizer.decode([x]) for x in extra) <= {"\n"}


def test_overrides_are_keys_of_verls_sft_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import verl
    from hydra import compose, initialize_config_dir

    cfg = notes_cfg("trainer.n_gpus_per_node=2")
    settings = WarmStartSettings(epochs=3, lr=2e-5, batch_size=3, seed=7)
    overrides = sft_overrides(cfg, settings, data_file=tmp_path / "train.parquet", base_model="m",
                              work_dir=tmp_path / "ckpt", max_length=2048)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        # Hydra refuses a key its config does not have: every override must be one of verl's keys.
        composed = compose("sft_trainer_engine", overrides=overrides)
    assert composed.optim.lr == 2e-5 and composed.trainer.total_epochs == 3 and composed.trainer.seed == 7
    # 3 sequences a step on 2 GPUs: rounded up to 4, a whole number per rank.
    assert composed.data.train_batch_size == 4 and composed.model.path == "m"
    assert "hf_model" in composed.checkpoint.save_contents
    # No flash-attn on this machine: sdpa, as the RL side runs without it.
    assert composed.model.override_config.attn_implementation == "sdpa" and not composed.model.use_remove_padding
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    gpu = sft_command(compose_with(cfg, "trainer.device=cuda"), overrides)
    assert gpu[gpu.index("-m", 2) + 1] == SFT_MODULE and "--nproc_per_node=2" in gpu
    cpu = sft_command(compose_with(cfg, "trainer.device=cpu"), overrides)
    assert cpu[cpu.index("-m", 2) + 1] == CPU_SFT_MODULE and cpu[-len(CPU_OVERRIDES):] == list(CPU_OVERRIDES)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        on_cpu = compose("sft_trainer_engine", overrides=[*overrides, *CPU_OVERRIDES])
    assert on_cpu.engine.strategy == "fsdp2" and on_cpu.trainer.device == "cpu"


def compose_with(cfg, override: str):
    from omegaconf import OmegaConf, open_dict

    out = OmegaConf.create(OmegaConf.to_container(cfg))
    key, value = override.split("=")
    with open_dict(out):
        OmegaConf.update(out, key, value, merge=False)
    return out


@pytest.mark.slow
def test_verls_sft_trainer_runs_the_warm_start_on_the_cpu(tokenizer, transcripts, tmp_path: Path) -> None:
    """verl's own SFT trainer under torchrun on gloo (seal.warm_start.cpu_sft) fine-tunes a tiny
    model on the oracle transcripts and leaves a Hugging Face export whose weights moved."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from seal.warm_start.verl_sft import run_verl_sft

    base = tmp_path / "base"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=4096, tie_word_embeddings=True)).save_pretrained(base)
    tokenizer.save_pretrained(base)
    cfg = compose_with(notes_cfg("trainer.n_gpus_per_node=1"), "trainer.device=cpu")
    settings = WarmStartSettings(epochs=1, lr=1e-3, batch_size=2, seed=0)
    run_verl_sft(cfg, settings, transcripts[:2], base_model=str(base), output=tmp_path / "out")
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    moved = [name for name in before if not torch.equal(before[name], after[name])]
    assert moved and set(before) == set(after)


def test_the_newest_hugging_face_export_is_taken(tmp_path: Path) -> None:
    for step in (2, 10):
        (tmp_path / f"global_step_{step}" / "huggingface").mkdir(parents=True)
    assert newest_hf_export(tmp_path) == tmp_path / "global_step_10" / "huggingface"
    with pytest.raises(FileNotFoundError, match="no global_step"):
        newest_hf_export(tmp_path / "empty")
