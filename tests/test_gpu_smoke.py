"""exp/gpu_smoke.yaml and scripts/gpu_smoke.sh on the CPU: the one-GPU configuration passes the
project's and verl's config validation, fits SmolLM2's context, runs on sdpa without flash-attn;
the script refuses what it cannot run with one line, and its whole logic (two steps, a resume,
every output checked) runs with ``--backend local``."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from seal.config import EXP_DIR, REPO_ROOT, compose_config

SCRIPT = REPO_ROOT / "scripts" / "gpu_smoke.sh"
MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def smoke_cfg():
    # compose_config runs seal.config_check (keys, types, task ids, data files, model folder).
    return compose_config(EXP_DIR / "gpu_smoke.yaml")


def test_the_smoke_config_is_one_gpu_two_steps_with_validation_and_checkpoints(smoke_cfg):
    cfg = smoke_cfg
    assert cfg.trainer.backend == "verl" and cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.nnodes == 1
    assert cfg.actor_rollout_ref.model.path == "models/SmolLM2-135M-Instruct"
    assert (len(cfg.seal.tasks.train_ids), cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (4, 4, 4)
    assert len(set(cfg.seal.tasks.val_ids)) == 8
    assert cfg.trainer.total_training_steps == 2 and cfg.trainer.total_epochs >= 3  # room for the resumed step
    assert cfg.trainer.val_before_train and cfg.trainer.test_freq > 0
    assert cfg.trainer.save_freq == 1 and cfg.trainer.keep_only_best_checkpoint is False
    assert cfg.trainer.default_local_dir == "experiments/gpu_smoke/checkpoints"
    assert cfg.trainer.validation_data_dir == "experiments/gpu_smoke/validation_log"
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.max_model_len == 8192  # SmolLM2's context
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= rollout.max_model_len
    assert rollout.prompt_length == cfg.data.max_prompt_length
    assert rollout.response_length == cfg.data.max_response_length
    assert 0 < rollout.gpu_memory_utilization <= 0.5


def test_the_smoke_config_passes_verls_validation(smoke_cfg):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from seal.trainer.verl.trainer import check_verl_config

    check_verl_config(smoke_cfg)
    validate_config(smoke_cfg, use_reference_policy=need_reference_policy(smoke_cfg), use_critic=need_critic(smoke_cfg))


def test_without_flash_attn_the_smoke_runs_on_sdpa(smoke_cfg, tmp_path):
    from seal.trainer.verl.main import prepare_config

    out = prepare_config(smoke_cfg, exp_dir=tmp_path / "gpu_smoke", base=REPO_ROOT, flash_attn=False)
    model = out.actor_rollout_ref.model
    assert model.override_config.attn_implementation == "sdpa"
    assert model.use_remove_padding is False and out.actor_rollout_ref.actor.use_remove_padding is False
    assert Path(out.actor_rollout_ref.model.path) == MODEL_DIR.resolve()  # the local folder, absolute for Ray


def test_every_smoke_task_fits_the_prompt_length(smoke_cfg):
    """The prompt-length filter (default data.max_prompt_length on the verl backend) drops none
    of the listed tasks, rendered as the episode runner renders them with SmolLM2's tokenizer."""
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    from transformers import AutoTokenizer

    from env_service.client import EnvClient
    from seal.rollout.prompt_length import prompt_token_counter

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    client = EnvClient.in_process()
    limit = smoke_cfg.data.max_prompt_length
    try:
        for ids, mode in ((smoke_cfg.seal.tasks.train_ids, "sample"), (smoke_cfg.seal.tasks.val_ids, "validate")):
            count = prompt_token_counter(smoke_cfg, tokenizer, client, rollout_mode=mode)
            lengths = {str(t): count(str(t)) for t in ids}
            assert all(3000 < n <= limit for n in lengths.values()), lengths
    finally:
        client.close()


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("SMOKE_BACKEND", None)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_script_refuses_a_bad_option_with_one_line(tmp_path):
    for args, expected in ((["--backend", "tpu"], "--backend tpu: choose verl or local"),
                           (["--frobnicate"], "unknown option '--frobnicate'"),
                           (["--port", "http"], "--port http: expected a number"),
                           (["--name"], "--name needs a value"),
                           (["--phase", "eval"], "--phase eval: choose all, train or resume"),
                           (["--phase", "resume"], "--phase resume needs the train phase's --name")):
        done = _run(args, tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and expected in done.stderr
    assert not (tmp_path / "experiments").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="the GPU stack is installed here")
def test_without_the_gpu_stack_the_verl_smoke_says_what_to_install(tmp_path):
    done = _run([], tmp_path)
    assert done.returncode == 1
    expected = f"gpu_smoke: error: vLLM/verl do not import in {sys.executable}: run bash install.sh --gpu first"
    assert done.stderr.strip() == expected
    assert not (tmp_path / "experiments").exists()  # nothing started, no folder left behind


def test_the_script_wants_a_fresh_experiment_folder(tmp_path):
    (tmp_path / "experiments" / "taken").mkdir(parents=True)
    done = _run(["--backend", "local", "--name", "taken"], tmp_path)
    assert done.returncode == 1
    assert "experiments/taken already exists: give a new --name" in done.stderr
    assert list((tmp_path / "experiments" / "taken").iterdir()) == []


def test_a_resume_phase_wants_the_train_phases_folder(tmp_path):
    done = _run(["--backend", "local", "--phase", "resume", "--name", "never_trained"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == ("gpu_smoke: error: experiments/never_trained does not exist: "
                                   "run --phase train --name never_trained first")
    assert not (tmp_path / "experiments").exists()


def test_a_config_the_smoke_cannot_check_stops_it_before_any_run(tmp_path):
    done = _run(["--backend", "local", "--name", "bad", "--", "trainer.total_training_steps=5"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == ("gpu_smoke: error: the smoke runs trainer.total_training_steps=2 "
                                   "with trainer.save_freq > 0")
    assert not (tmp_path / "experiments").exists()  # no folder: the same name can be used again


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_model(folder: Path) -> Path:
    """A 2-layer Llama with SmolLM2's tokenizer and random weights: the prefill of a 3.5k-token
    prompt costs SmolLM2-135M 10-30 s on 2 loaded cores, which the script's logic does not need."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def run_smoke(backend_args: list[str], tmp_path: Path, timeout: float,
              phases: tuple[str, ...] = ("all",)) -> tuple[subprocess.CompletedProcess, set[str], Path]:
    """The smoke script on a tiny model into ``tmp_path``, once per ``--phase`` of ``phases``: each
    call must exit 0, the last with every check PASS. Returns the last finished process, the names
    of the checks and the log folder."""
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    logs = tmp_path / "logs"
    model = _tiny_model(tmp_path / "tiny_model")
    for phase in phases:
        done = _run([*backend_args, "--phase", phase, "--name", "smoke", "--out", str(logs),
                     "--port", str(_free_port()), "--model", str(model)], tmp_path, timeout=timeout)
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    results = [line for line in done.stdout.splitlines() if line.startswith(("PASS  ", "FAIL  "))]
    assert results and all(line.startswith("PASS  ") for line in results), "\n".join(results)
    return done, {line[6:].split(":")[0] for line in results}, logs


@pytest.mark.slow
def test_the_smoke_script_runs_its_steps_resume_and_checks_on_cpu(tmp_path):
    """The script's whole path with the local backend (real launcher, HTTP environment service,
    trainer and checker; a tiny model), as two calls (``--phase train``, then ``--phase resume``):
    two steps, a resume for a third, every check PASS, logs and both runs' timings in the log folder."""
    done, names, logs = run_smoke(["--backend", "local"], tmp_path, timeout=600, phases=("train", "resume"))
    assert {"run files", "validation log step 0", "validation log step 2", "validation log step 3",
            "capability state", "epoch stats 0", "epoch stats 1", "epoch stats 2", "checkpoint step 1",
            "checkpoint step 2", "checkpoint step 3", "resume tracker", "diagnosis state per checkpoint",
            "diagnosis state carried across the resume"} == names
    exp = tmp_path / "experiments" / "smoke"
    assert (exp / "checkpoints" / "global_step_3" / "model.pt").is_file()
    assert "all checks passed" in done.stdout
    for name in ("smoke.log", "smoke_train.log", "smoke_resume.log", "smoke_check.log", "smoke_timings.txt"):
        assert (logs / name).is_file(), name
    timings = (logs / "smoke_timings.txt").read_text()
    assert "train: wall" in timings and "resume: wall" in timings and "step 3: step:" in timings
    assert "PASS  diagnosis state carried across the resume" in (logs / "smoke.log").read_text()
