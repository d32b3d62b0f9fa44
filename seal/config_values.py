"""The values the config pass (:mod:`seal.config_check`) allows for verl's keys, and the rules
between keys.

verl states no value rules in its YAML; a bad value used to surface inside verl's workers after
Ray started, or as an exception deep in torch. :data:`VERL_RULES` holds the values a run reads
(both backends), :data:`LOCAL_RULES` what the local trainer implements. The rules between keys
are verl's own batch-size arithmetic (``verl/utils/config.py`` ``validate_config``,
``ActorConfig.validate`` and the mini-batch split of its engine workers), what the SEAL hook
needs on the verl backend; the config pass also builds the settings classes, so the rules they
state fire there (:func:`seal.config_check.check_settings`).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from seal.config_base import ConfigError, Rule, rule_error, select, show

# verl's ppo_trainer keys a run reads, and the values it can run with (null stays allowed where
# verl's own default is null: total_training_steps, the micro-batch sizes, max_model_len).
VERL_RULES: dict[str, Rule] = {
    "trainer.experiment_name": Rule(pattern=r"[^/.][^/]*", means="a plain folder name (no '/', no leading '.')"),
    "trainer.total_epochs": Rule(ge=1),
    "trainer.total_training_steps": Rule(ge=1),
    "trainer.nnodes": Rule(ge=1),
    "trainer.n_gpus_per_node": Rule(ge=1),
    "trainer.resume_mode": Rule(choices=("auto", "disable", "resume_path")),
    "data.train_batch_size": Rule(ge=1),
    "data.max_prompt_length": Rule(ge=1),
    "data.max_response_length": Rule(ge=1),
    "actor_rollout_ref.rollout.n": Rule(ge=1),
    "actor_rollout_ref.rollout.prompt_length": Rule(ge=1),
    "actor_rollout_ref.rollout.response_length": Rule(ge=1),
    "actor_rollout_ref.rollout.max_model_len": Rule(ge=1),
    "actor_rollout_ref.rollout.temperature": Rule(ge=0),
    "actor_rollout_ref.rollout.top_p": Rule(gt=0, le=1),
    "actor_rollout_ref.rollout.val_kwargs.temperature": Rule(ge=0),
    "actor_rollout_ref.rollout.val_kwargs.top_p": Rule(gt=0, le=1),
    "actor_rollout_ref.rollout.val_kwargs.n": Rule(ge=1),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": Rule(ge=1),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": Rule(ge=1),
    "actor_rollout_ref.actor.optim.lr": Rule(gt=0),
    "actor_rollout_ref.actor.optim.weight_decay": Rule(ge=0),
    "actor_rollout_ref.actor.ppo_mini_batch_size": Rule(ge=1),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": Rule(ge=1),
    "actor_rollout_ref.actor.ppo_epochs": Rule(ge=1),
    "actor_rollout_ref.actor.grad_clip": Rule(gt=0),
    "actor_rollout_ref.actor.clip_ratio": Rule(ge=0),
    "actor_rollout_ref.actor.kl_loss_coef": Rule(ge=0),
    "actor_rollout_ref.actor.loss_agg_mode": Rule(choices=("token-mean", "token-sum", "seq-mean-token-sum",
                                                           "seq-mean-token-mean", "seq-mean-token-sum-norm")),
}
# What the local trainer implements of verl's actor (the paper's recipe): AdamW, no entropy
# term, verl's vanilla PPO clip.
LOCAL_RULES: dict[str, Rule] = {
    "actor_rollout_ref.actor.optim.optimizer": Rule(choices=("AdamW",)),
    "actor_rollout_ref.actor.entropy_coeff": Rule(choices=(0,)),
    "actor_rollout_ref.actor.policy_loss.loss_mode": Rule(choices=("vanilla",)),
}
_INTERPOLATION = "${"


def _at(tree: Any, key: str) -> tuple[bool, Any]:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def check_verl_values(written: dict[str, Any], reference: dict[str, Any], backend: str) -> None:
    """``written`` (the verl side, interpolations unresolved) against the rules: a value read
    through an interpolation is judged at the key it points to, the one the user set."""
    rules = {**VERL_RULES, **(LOCAL_RULES if backend == "local" else {})}
    for key, rule in rules.items():
        present, value = _at(written, key)
        if not present or (isinstance(value, str) and _INTERPOLATION in value):
            continue
        default = _at(reference, key)[1]
        if value is None and default is None:
            continue  # unset, as verl's own default
        if value is None or rule.breaks(value):
            raise rule_error(key, value, rule.allowed(_noun(value if default is None else default)))


def _noun(example: Any) -> str:
    return "an integer" if isinstance(example, int) and not isinstance(example, bool) else "a number"


def check_batch_sizes(plain: dict[str, Any], backend: str) -> None:
    """verl's batch-size arithmetic (``plain``: resolved). Each step's ``data.train_batch_size`` x
    ``rollout.n`` episodes are split into mini-batches of ``ppo_mini_batch_size`` x ``rollout.n``
    (both backends), and on the verl backend spread evenly over the GPUs."""
    actor = select(plain, "actor_rollout_ref.actor")
    batch, mini, n = (select(plain, "data.train_batch_size"), actor.get("ppo_mini_batch_size"),
                      select(plain, "actor_rollout_ref.rollout.n"))
    if batch % mini:
        raise ConfigError(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}: expected a divisor of "
                          f"data.train_batch_size={batch} (verl splits each step's batch into whole mini-batches)")
    if backend != "verl":
        return
    gpus = int(select(plain, "trainer.nnodes")) * int(select(plain, "trainer.n_gpus_per_node"))
    dynamic = bool(actor.get("use_dynamic_bsz"))
    if not dynamic and (batch * n) % gpus:
        raise ConfigError(f"data.train_batch_size={batch}: expected data.train_batch_size x "
                          f"actor_rollout_ref.rollout.n ({batch} x {n}) divisible by the {gpus} GPUs "
                          "(trainer.nnodes x trainer.n_gpus_per_node)")
    data_parallel = max(1, gpus // int(actor.get("ulysses_sequence_parallel_size") or 1))
    if (mini * n) % data_parallel:
        raise ConfigError(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}: expected ppo_mini_batch_size x "
                          f"actor_rollout_ref.rollout.n ({mini} x {n}) divisible by the {data_parallel} "
                          "data-parallel ranks")
    if not dynamic:
        _check_micro_batch(plain, "actor_rollout_ref.actor", "ppo_micro_batch_size")
        _check_micro_batch(plain, "actor_rollout_ref.rollout", "log_prob_micro_batch_size")
        if _uses_reference(plain):
            _check_micro_batch(plain, "actor_rollout_ref.ref", "log_prob_micro_batch_size")


def _check_micro_batch(plain: dict[str, Any], block: str, name: str) -> None:
    """verl takes exactly one of ``<name>_per_gpu`` and the deprecated ``<name>``."""
    per_gpu, deprecated = select(plain, f"{block}.{name}_per_gpu"), select(plain, f"{block}.{name}")
    if per_gpu is None and deprecated is None:
        raise ConfigError(f"{block}.{name}_per_gpu=null: expected an integer >= 1 (verl needs a micro-batch "
                          "size unless actor_rollout_ref.actor.use_dynamic_bsz=true)")
    if per_gpu is not None and deprecated is not None:
        raise ConfigError(f"{block}.{name}={show(deprecated)}: expected null next to {block}.{name}_per_gpu "
                          "(verl refuses both; the former is deprecated)")


def _uses_reference(cfg: Any) -> bool:
    """verl's ``need_reference_policy``: a KL term in the loss or in the reward."""
    return bool(select(cfg, "actor_rollout_ref.actor.use_kl_loss") or select(cfg, "algorithm.use_kl_in_reward"))


def check_verl_backend(cfg: DictConfig) -> None:
    """verl settings under which the SEAL hook would not run every step (verl backend)."""
    if int(cfg.trainer.critic_warmup) > 0:
        raise ConfigError(
            f"trainer.critic_warmup={cfg.trainer.critic_warmup}: verl skips the actor update (and with it "
            "SEAL's observe/A-Patch hook) during critic warm-up; set trainer.critic_warmup=0")
    if not cfg.trainer.get("use_v1", True):
        raise ConfigError("trainer.use_v1=false: the SEAL verl backend runs on verl's V1 trainer (verl has "
                          "deprecated its legacy trainer); set trainer.use_v1=true")
    mode = str(select(cfg, "trainer.v1.trainer_mode") or "sync")
    if mode != "sync":
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode}: SEAL runs verl's sync mode only (its diagnosis, step rules and "
            "interface evolution read each step's episodes as played by the policy being updated; the async "
            "modes train on episodes of older policies); set trainer.v1.trainer_mode=sync")
    if select(cfg, "actor_rollout_ref.rollout.agent.default_agent_loop") == "seal_bfcl":
        # The release's name of the episode runner; verl's agent-loop workers would fail to find it.
        raise ConfigError("actor_rollout_ref.rollout.agent.default_agent_loop=seal_bfcl: the SEAL episode runner is "
                          "registered as seal (fix: actor_rollout_ref.rollout.agent.default_agent_loop=seal)")
    if select(cfg, "actor_rollout_ref.actor.use_prefix_grouper"):
        raise ConfigError(
            "actor_rollout_ref.actor.use_prefix_grouper=true: verl 0.9.1's FSDP engine never applies the prefix "
            "grouper (only its batch balancing reads the flag), so no prompt would be shared; set it to false "
            "(the local backend's seal.local.shared_prefix_training is the working counterpart)")
