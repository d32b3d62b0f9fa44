"""exp/SEAL.yaml and the Table 3 ablations compose on the installed verl config, pass verl's own
config validation, and hold the paper's hyperparameters (Table 4 of the paper; §5 of the release)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seal.config import EXP_DIR, compose_config

# (config key, paper value, where the paper states it)
PAPER = [
    ("algorithm.adv_estimator", "grpo", "Table 4: GRPO"),
    ("actor_rollout_ref.rollout.n", 8, "Table 4: 8 rollouts per prompt"),
    ("actor_rollout_ref.actor.optim.lr", 1e-6, "Table 4: actor lr 1e-6"),
    ("data.train_batch_size", 32, "Table 4: train batch 32"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 8, "Table 4: PPO mini-batch 8"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 1, "Table 4: micro-batch 1/GPU"),
    ("actor_rollout_ref.rollout.temperature", 1.0, "Table 4: temperature 1.0 (train)"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", 0, "Table 4: temperature 0.0 (validation)"),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample", False, "greedy validation"),
    ("actor_rollout_ref.rollout.val_kwargs.n", 1, "one validation episode per task"),
    ("data.max_prompt_length", 8192, "Table 4: max_prompt 8192"),
    ("data.max_response_length", 4096, "Table 4: max_response 4096"),
    ("actor_rollout_ref.rollout.response_length", 4096, "Table 4: max_response 4096"),
    ("actor_rollout_ref.rollout.max_model_len", 16384, "Table 4: max_model_len 16384"),
    ("seal.rollout.max_llm_calls", 20, "Table 4: max 20 interaction steps"),
    ("env_service.bfcl.tool_prompt_mode", "bfcl_qwen_fc", "Table 4: prompt mode bfcl_qwen_fc"),
    ("algorithm.use_kl_in_reward", False, "Table 4: reward-KL off"),
    ("actor_rollout_ref.actor.use_kl_loss", True, "Table 4: actor KL-loss"),
    ("actor_rollout_ref.actor.kl_loss_coef", 0.001, "Table 4: KL-loss 0.001"),
    ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl", "Table 4: low_var_kl"),
    ("actor_rollout_ref.actor.entropy_coeff", 0, "Table 4: entropy 0"),
    ("trainer.n_gpus_per_node", 4, "Table 4: 4 GPUs"),
    ("trainer.nnodes", 1, "Table 4: 4 GPUs"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 1, "Table 4: TP=1"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.6, "Table 4: gpu_mem_util 0.6"),
    ("actor_rollout_ref.rollout.name", "vllm", "Table 4: vLLM rollout"),
    ("actor_rollout_ref.rollout.mode", "async", "Table 4: async vLLM rollout"),
    ("actor_rollout_ref.model.path", "Qwen/Qwen2.5-7B-Instruct", "Tables 1, 3: the 7B backbone"),
    ("trainer.total_epochs", 6, "release §5.1: 6 epochs (~72 steps, Figure 3)"),
    ("trainer.test_freq", 10, "release §5.1: validation every 10 steps"),
    ("trainer.val_before_train", True, "release §5.1"),
    ("data.val_batch_size", 400, "release §5.1: all 400 held-out tasks"),
    ("data.seed", 1, "release §5.1: sampler seed 1"),
    ("data.shuffle", True, "release §5.1"),
    ("algorithm.norm_adv_by_std_in_grpo", True, "release §5.1"),
    ("algorithm.gamma", 1.0, "release §5.1"),
    ("algorithm.lam", 1.0, "release §5.1"),
    ("actor_rollout_ref.rollout.top_p", 1.0, "release §5.1"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", -1, "release §5.1"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", 1.0, "release §5.1"),
    ("actor_rollout_ref.actor.clip_ratio", 0.2, "release §5.1: clip 0.2"),
    ("actor_rollout_ref.actor.clip_ratio_low", 0.2, "release §5.1"),
    ("actor_rollout_ref.actor.clip_ratio_high", 0.2, "release §5.1"),
    ("actor_rollout_ref.actor.clip_ratio_c", 10.0, "release §5.1: dual-clip 10"),
    ("actor_rollout_ref.actor.loss_agg_mode", "token-mean", "release §5.1"),
    ("actor_rollout_ref.actor.ppo_epochs", 1, "release §5.1"),
    ("actor_rollout_ref.actor.grad_clip", 1.0, "release §5.1"),
    ("actor_rollout_ref.actor.optim.weight_decay", 0.01, "release §5.1"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", -1, "release §5.1: constant lr, no warm-up"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384, "release §5.1"),
    ("actor_rollout_ref.ref.fsdp_config.param_offload", True, "release §5.1: ref offload"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 1, "release §5.1"),
    ("actor_rollout_ref.model.use_remove_padding", True, "release §5.1"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", True, "release §5.1"),
    ("actor_rollout_ref.rollout.multi_turn.enable", True, "release §5.1"),
    ("seal.rollout.max_env_tokens", 4096, "release §5.1: max_env_len 4096"),
    ("env_service.url", "http://127.0.0.1:8082", "release §5.1: env service"),
    ("env_service.bfcl.strict_tool_parser", True, "release §5.1"),
    ("env_service.bfcl.enforce_available_tools", True, "release §5.1"),
    ("env_service.bfcl.tool_result_mode", "bfcl_tool_response", "release §5.1"),
    ("env_service.bfcl.observation_lite.enable", True, "App. D: observation hints"),
    ("env_service.bfcl.observation_lite.apply_to_validation", False, "train-only interface"),
    ("env_service.bfcl.observation_lite.add_required_hint", True, "release §2.7"),
    ("env_service.bfcl.observation_lite.add_enum_hint", True, "release §2.7"),
    ("env_service.bfcl.observation_lite.add_type_hint", False, "release §2.7"),
    ("env_service.bfcl.tool_feedback_evolution.enable", False, "App. D: not active in the main run"),
    ("env_service.bfcl.diagnostic_evolution.enable", False, "App. D: not active in the main run"),
    ("seal.enable", True, "full SEAL"),
    ("seal.reward.mode", "binary", "binary verifier reward"),
    ("seal.advantage.reweighter", "apatch", "A-Patch"),
    ("seal.advantage.apatch.min_scale", 0.5, "App. C: clip [0.5, 2.0]"),
    ("seal.advantage.apatch.max_scale", 2.0, "App. C: clip [0.5, 2.0]"),
    ("seal.advantage.apatch.apply_to", "all", "release §3.4"),
    ("seal.advantage.apatch.warmup_steps", 0, "release §3.4"),
    ("seal.advantage.apatch.tag_weights.spurious_tool_call", 2.0, "Table 6"),
    ("seal.advantage.apatch.tag_weights.correct_abstention", 1.8, "Table 6"),
    ("seal.advantage.apatch.tag_weights.empty_turn_model_response", 1.5, "Table 6"),
    ("seal.advantage.apatch.tag_weights.state_mismatch", 1.0, "Table 6"),
    ("seal.advantage.apatch.tag_weights.response_mismatch", 0.9, "Table 6"),
    ("seal.advantage.apatch.tag_weights.instance_mismatch", 0.6, "Table 6"),
    ("seal.advantage.apatch.tag_weights.pass", 1.0, "Table 6"),
    ("seal.advantage.apatch.dynamic.enable", True, "closed-loop update"),
    ("seal.advantage.apatch.dynamic.ema_beta", 0.25, "release §3.4"),
    ("seal.advantage.apatch.dynamic.prevalence_alpha", 1.0, "release §3.4"),
    ("seal.advantage.apatch.dynamic.confidence_samples", 32, "release §3.4"),
    ("seal.advantage.apatch.budget.enable", False, "release §3.4: budget off"),
]

# Table 3 rows: file -> the keys it changes relative to exp/SEAL.yaml (besides the name).
ABLATIONS = {
    "vanilla_rl": {"seal.enable": False, "env_service.bfcl.observation_lite.enable": False},
    "wo_environment_adaptation": {"env_service.bfcl.observation_lite.enable": False},
    "wo_apatch": {"seal.advantage.reweighter": "identity"},
    "wo_closed_loop_update": {"seal.advantage.apatch.dynamic.enable": False},
}
ROWS = ["SEAL", *(f"ablations/{name}" for name in ABLATIONS)]


@pytest.fixture(scope="module")
def composed():
    return {row: compose_config(EXP_DIR / f"{row}.yaml") for row in ROWS}


@pytest.mark.parametrize(("key", "value", "source"), PAPER, ids=[k for k, _, _ in PAPER])
def test_seal_yaml_holds_the_papers_value(composed, key, value, source):
    got = OmegaConf.select(composed["SEAL"], key, throw_on_missing=True)
    assert got == value, f"{key}={got!r}, paper: {value!r} ({source})"
    assert type(got) is type(value) or isinstance(value, float), f"{key}: {type(got).__name__}"


def _leaves(cfg) -> dict[str, object]:
    out: dict[str, object] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_ablation_changes_only_its_switch_and_name(composed, name):
    base, row = _leaves(composed["SEAL"]), _leaves(composed[f"ablations/{name}"])
    assert base.keys() == row.keys()
    changed = {k: row[k] for k in base if base[k] != row[k]}
    assert changed == {**ABLATIONS[name], "trainer.experiment_name": f"SEAL_{name}"}


def test_every_ablation_file_is_covered_and_names_are_unique(composed):
    files = {p.stem for p in (EXP_DIR / "ablations").glob("*.yaml")}
    assert files == set(ABLATIONS)
    names = [composed[row].trainer.experiment_name for row in ROWS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("row", ROWS)
def test_row_passes_verls_config_validation(composed, row):
    pytest.importorskip("verl")
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = composed[row]
    # verl's V1 trainer in its sync mode: the loop SealPPOTrainer extends.
    assert cfg.trainer.backend == "verl" and cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "seal"
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert need_reference_policy(cfg) and not need_critic(cfg)


@pytest.mark.parametrize(("override", "fix"), [
    ("trainer.use_v1=false", "set trainer.use_v1=true"),
    ("trainer.v1.trainer_mode=colocate_async", "set trainer.v1.trainer_mode=sync"),
])
def test_the_verl_backend_refuses_the_legacy_and_async_trainers(override, fix):
    """verl's legacy trainer is gone from the backend, and its async V1 modes train on episodes of
    older policies: each is one ConfigError line, from the config pass and again where the
    trainer starts."""
    pytest.importorskip("verl")
    from seal.config import ConfigError
    from seal.trainer.verl.trainer import check_verl_config

    with pytest.raises(ConfigError, match=fix) as composed:
        compose_config("exp/SEAL.yaml", [override])  # the config pass
    with pytest.raises(ConfigError, match=fix) as started:
        check_verl_config(compose_config("exp/SEAL.yaml", [override], check=False))
    for error in (composed.value, started.value):
        assert "\n" not in str(error) and override in str(error)
    check_verl_config(compose_config("exp/SEAL.yaml", ["trainer.v1.trainer_mode=sync"]))  # the recipe's own


# Keys exp/SEAL.yaml states although verl's defaults agree: the trainer the SEAL backend requires
# (seal.config_values.check_verl_backend refuses any other), pinned against a change of verl's defaults.
REQUIRED_VERL_KEYS = {"trainer.use_v1", "trainer.v1.trainer_mode"}


def test_seal_yaml_writes_only_deltas_on_verls_defaults():
    """A key set in exp/SEAL.yaml to the value verl's ppo_trainer already has is noise (but for
    the required trainer, :data:`REQUIRED_VERL_KEYS`)."""
    pytest.importorskip("verl")
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        verl_default = compose(config_name="ppo_trainer")
    own = _leaves(OmegaConf.load(EXP_DIR / "SEAL.yaml"))
    same = [k for k, v in own.items() if k != "defaults" and not k.startswith(("seal.", "env_service."))
            and OmegaConf.select(verl_default, k, default="<absent>") == v]
    assert [k for k in same if k not in REQUIRED_VERL_KEYS] == []
