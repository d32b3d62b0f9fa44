"""One algorithm, two backends: one update on the local backend and one on verl's actor worker,
from the same weights and the same episodes, agree.

The episodes are recorded ones, replayed token for token: one GRPO group of multi-turn episodes
(model turn, tool observation with mask 0, model turn) of different lengths, rewards and failure
tags, one of them an environment fault. Both backends take them through their own step:

* local: :meth:`LocalTrainer.train_step` with an episode runner that replays them (the step
  rules, GRPO, A-Patch, then ``policy_update``: PPO clip + low_var_kl, AdamW, grad clip);
* verl: ``fit()``'s order without Ray: :meth:`SealRayPPOTrainer._compute_old_log_prob` (the step
  rules, then the old log-probs from verl's worker), the reference log-probs, verl's
  ``compute_advantage`` with the SEAL estimator, :meth:`SealRayPPOTrainer._update_actor` (A-Patch,
  then verl's ``ActorRolloutRefWorker`` in this process: FSDP2 engine, ``ppo_loss``, AdamW).

Both are configured from one composed config (exp/SEAL.yaml with test sizes; the verl side as
the backend prepares it for a CPU: fp32, sdpa, no padding removal). The step is one mini-batch,
one optimizer step, one sequence per micro-batch on both sides. The policy starts off its
reference (a perturbed copy): at the reference the low_var_kl gradient is zero, so the KL
coefficient would not show. verl is given the reference log-probs the local trainer computes for
itself (the same function on the same weights). verl's ``balance_batch`` reordering is left out:
within one mini-batch it only changes the order of a sum.

Checked: the optimizer (AdamW's settings, the gradient clip); the advantages bit for bit;
``actor/pg_loss``, ``actor/kl_loss``, ``actor/loss`` and ``actor/grad_norm`` as each backend reports
them (verl's reduced as ``fit()`` reduces them); the post-update log-probs of a held-out response
(one not in the batch). They agree on the recipe and with its loss aggregation or KL coefficient
changed on both sides; the comparison must fail when only one side's is changed.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from verl_actor import (VOCAB, actor_worker, hf_response_logprobs, load_tiny_llama, model_overrides, object_column,
                        padded_batch, save_tiny_llama, worker_config)
from verl_testkit import episode_fields, make_trainer

from seal.config import compose_config
from seal.episode import FIELD_NAMES, EpisodeResult
from seal_shared.types import FailureTag

pytest.importorskip("verl")

logger = logging.getLogger(__name__)

TASK = "multi_turn_base_3"
# Per episode: reward, per-turn tags, model tokens of turn 1 and turn 2, fault. Lengths differ so
# token-mean and seq-mean-token-mean differ; tags differ so A-Patch scales rows differently.
EPISODES = [
    (1.0, [FailureTag.PASS, FailureTag.PASS], 3, 2, None),
    (0.0, [FailureTag.STATE_MISMATCH, FailureTag.SPURIOUS_TOOL_CALL], 9, 6, None),
    (1.0, [FailureTag.PASS, FailureTag.PASS], 5, 1, None),
    (0.0, [FailureTag.INSTANCE_MISMATCH, FailureTag.RESPONSE_MISMATCH], 2, 4, None),
    (0.0, [], 4, 0, "env_fault"),  # excluded by the step rules, kept out of the group's baseline
]
N = len(EPISODES)
PROMPT_LEN, OBSERVATION_LEN = 12, 5
# Large enough that one AdamW step moves the held-out log-probs far above float noise (by up to
# 0.13 here; the recipe's 1e-6 would move them by about one fp32 rounding).
LR = 1e-3
# Policy = reference + N(0, PERTURB^2) noise on every weight: a KL loss of ~0.05.
PERTURB = 0.05

# fp32 tolerances. The backends compute the same sums in different orders and shapes (verl: a
# padded batch through FSDP2, sdpa with an attention mask; local: one unpadded sequence at a time),
# so log-probs differ by an fp32 rounding or two (~5e-7 at |log p| ~ 5) and the losses by ~1e-7.
# Measured here, both sides alike: <= 5e-8 on the losses, <= 2.4e-7 on the gradient norm (~2),
# <= 1e-6 on the held-out log-probs: 10-140x inside the tolerances. The subtlest sabotage (the
# KL coefficient doubled) moves the total loss, the gradient norm and the held-out log-probs by
# 8-12x the tolerances.
SCALAR_RTOL, SCALAR_ATOL = 1e-5, 1e-6
LOGPROB_ATOL = 1e-5
SCALARS = ("actor/pg_loss", "actor/kl_loss", "actor/loss", "actor/grad_norm")

# (config key, changed value); the recipe has token-mean and 0.001.
CHANGES = {
    "loss_agg_mode": ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-mean"),
    "kl_loss_coef": ("actor_rollout_ref.actor.kl_loss_coef", 0.002),
}
SABOTAGES = [(side, change) for side in ("local", "verl") for change in CHANGES]


@dataclass
class UpdateResult:
    """One backend's step: the advantages its loss saw (the trained rows, ``(B_kept, T)``), its
    ``actor/*`` scalars, the held-out response's ``(R,)`` log-probs after the update, and the
    optimizer it stepped (AdamW's settings and the gradient clip)."""

    advantages: torch.Tensor
    metrics: dict[str, float]
    held_out: torch.Tensor
    optimizer: dict[str, Any]


def optimizer_settings(optimizer: torch.optim.Optimizer, clip: float) -> dict[str, Any]:
    group = optimizer.param_groups[0]
    return {"type": type(optimizer).__name__, "clip": float(clip),
            **{k: group[k] for k in ("lr", "betas", "weight_decay", "eps", "amsgrad")}}


@dataclass
class Episodes:
    """The recorded step: the runner's outputs (``AgentLoopOutput``) and a held-out response."""

    outputs: list[Any]
    held_out_prompt: list[int]
    held_out_response: list[int]


def record_episodes(seed: int = 3) -> Episodes:
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    g = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    prompt = tokens(PROMPT_LEN)
    outputs = []
    for reward, tags, turn1, turn2, fault in EPISODES:
        observation = tokens(OBSERVATION_LEN) if turn2 else []
        outputs.append(AgentLoopOutput(
            prompt_ids=prompt, response_ids=tokens(turn1) + observation + tokens(turn2),
            response_mask=[1] * turn1 + [0] * len(observation) + [1] * turn2, num_turns=4,
            metrics=AgentLoopMetrics(), extra_fields=episode_fields(TASK, reward, tags, fault)))
    return Episodes(outputs, prompt, tokens(6) + tokens(OBSERVATION_LEN) + tokens(4))


def mismatches(a: UpdateResult, b: UpdateResult) -> list[str]:
    """Where two backends' steps differ beyond the fp32 tolerances (empty: they agree)."""
    out = []
    if a.optimizer != b.optimizer:
        out.append(f"optimizers differ: {a.optimizer} vs {b.optimizer}")
    if a.advantages.shape != b.advantages.shape or not torch.equal(a.advantages, b.advantages):
        out.append("advantages differ")
    for key in SCALARS:
        if not math.isclose(a.metrics[key], b.metrics[key], rel_tol=SCALAR_RTOL, abs_tol=SCALAR_ATOL):
            out.append(f"{key}: {a.metrics[key]:.9g} vs {b.metrics[key]:.9g}")
    diff = float((a.held_out - b.held_out).abs().max())
    if diff > LOGPROB_ATOL:
        out.append(f"held-out log-probs differ by up to {diff:.3g}")
    return out


def differences(a: UpdateResult, b: UpdateResult) -> str:
    scalars = ", ".join(f"{k.split('/')[1]} {abs(a.metrics[k] - b.metrics[k]):.3g}" for k in SCALARS)
    return f"|diff|: {scalars}, held-out log-probs {float((a.held_out - b.held_out).abs().max()):.3g}"


# ---------------------------------------------------------------------------------- the two steps


class ReplayRunner:
    """An episode runner (verl's ``AgentLoopBase.run`` contract) that returns recorded outputs
    in order: the local trainer plays the step's n episodes of the one task in sample order."""

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = list(outputs)

    async def run(self, sampling_params: dict, *, task_id: str, **kwargs: Any) -> Any:
        assert task_id == TASK
        return self.outputs.pop(0)


class NoEnv:
    def close(self) -> None:  # pragma: no cover - the replayed episodes need no environment
        pass


def local_step(cfg: DictConfig, models: Path, episodes: Episodes, exp_dir: Path, tokenizer: Any) -> UpdateResult:
    """The local backend's first training step on the replayed episodes. ``tokenizer``: the
    trainer builds its prompt counter and generation server from one; a replayed step uses
    neither (the episodes are token ids below ``VOCAB``, valid for any tokenizer)."""
    from seal.trainer.local import LocalTrainer, loop
    from seal.trainer.local.policy import frozen_copy

    seen: dict[str, Any] = {}

    def recording_update(model: Any, ref: Any, optimizer: Any, batch: Any, advantages: torch.Tensor,
                         *args: Any, **kwargs: Any) -> dict[str, float]:
        seen.update(advantages=advantages.clone(), optimizer=optimizer_settings(optimizer, kwargs["grad_clip"]))
        return policy_update(model, ref, optimizer, batch, advantages, *args, **kwargs)

    policy_update = loop.policy_update
    trainer = LocalTrainer(cfg, exp_dir, runner_factory=lambda *_: ReplayRunner(episodes.outputs),
                           env_client=NoEnv(), model=load_tiny_llama(models / "policy"), tokenizer=tokenizer)
    trainer.ref_model = frozen_copy(load_tiny_llama(models / "reference"))  # the policy has left it
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "policy_update", recording_update)
        metrics = trainer.train_step()
    trainer.close()
    assert metrics["seal/excluded_episodes"] == 1.0 and metrics["actor/num_updates"] == 1.0
    [held_out] = hf_response_logprobs(trainer.model, [episodes.held_out_prompt], [episodes.held_out_response])
    return UpdateResult(seen["advantages"], metrics, held_out, seen["optimizer"])


def verl_step_batch(episodes: Episodes) -> Any:
    """The recorded episodes as ``fit()`` holds them after the rollout and the reward: padded
    token tensors, the record columns, the group id, the reward on each last response token."""
    from verl import DataProto

    outs = episodes.outputs
    tensors = padded_batch([o.prompt_ids for o in outs], [o.response_ids for o in outs],
                           [o.response_mask for o in outs])
    scores = torch.zeros(tensors["response_mask"].shape)
    for i, o in enumerate(outs):
        scores[i, len(o.response_ids) - 1] = EpisodeResult.from_fields(o.extra_fields).reward
    return DataProto.from_single_dict(
        {**tensors, "token_level_scores": scores, "uid": object_column(["g0"] * len(outs)),
         **{name: object_column([o.extra_fields[name] for o in outs]) for name in FIELD_NAMES}},
        meta_info={"temperature": 1.0, "global_token_num": tensors["attention_mask"].sum(dim=1).tolist()})


def reference_logprobs(models: Path, episodes: Episodes, width: int) -> torch.Tensor:
    """``(B, width)`` log-probs of the episodes' responses under the reference, zero-padded:
    the local trainer's function on the unpadded sequences, as its own update computes them."""
    outs = episodes.outputs
    out = torch.zeros(len(outs), width)
    logprobs = hf_response_logprobs(load_tiny_llama(models / "reference"), [o.prompt_ids for o in outs],
                                    [o.response_ids for o in outs])
    for i, lp in enumerate(logprobs):
        out[i, : len(lp)] = lp
    return out


def verl_logprobs(trainer: Any, prompt: list[int], response: list[int]) -> torch.Tensor:
    """``(R,)`` log-probs of one response from verl's worker: verl's own log-prob pass
    (``RayPPOTrainer._compute_old_log_prob``; SEAL's override only adds the step rules)."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    tensors = padded_batch([prompt], [response], [[1] * len(response)])
    batch = DataProto.from_single_dict(tensors, meta_info={
        "temperature": 1.0, "global_token_num": tensors["attention_mask"].sum(dim=1).tolist()})
    return RayPPOTrainer._compute_old_log_prob(trainer, batch)[0].batch["old_log_probs"][0, : len(response)]


def verl_step(cfg: DictConfig, models: Path, episodes: Episodes, root: Path) -> UpdateResult:
    """The verl backend's first training step on the same episodes, verl's worker in-process."""
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils.metric import reduce_metrics

    config = worker_config(cfg, root)
    trainer = make_trainer(config, root / "exp", step=1)
    trainer.actor_rollout_wg = worker = actor_worker(config)
    engine = worker.actor.engine
    optimizer = optimizer_settings(engine.optimizer, engine.optimizer_config.clip_grad)
    batch = verl_step_batch(episodes)
    old_log_probs, _ = trainer._compute_old_log_prob(batch)  # the step rules run first
    batch = batch.union(old_log_probs)
    batch.batch["ref_log_prob"] = reference_logprobs(models, episodes, batch.batch["responses"].shape[1])
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    algorithm = trainer.config.algorithm
    batch = compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
                              lam=algorithm.lam, num_repeat=trainer.config.actor_rollout_ref.rollout.n,
                              norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
    metrics = reduce_metrics(dict(trainer._update_actor(batch).meta_info["metrics"]))  # as fit() does
    assert metrics["seal/excluded_episodes"] == 1.0

    # The trained rows' advantages after A-Patch (applied in place), cut to the local width.
    kept = batch.batch["response_mask"].any(dim=1)
    width = max(len(o.response_ids) for o, k in zip(episodes.outputs, kept.tolist()) if k)
    advantages = batch.batch["advantages"]
    assert not advantages[kept, width:].any() and not advantages[~kept].any()
    held_out = verl_logprobs(trainer, episodes.held_out_prompt, episodes.held_out_response)
    return UpdateResult(advantages[kept, :width], metrics, held_out, optimizer)


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parity_models")
    save_tiny_llama(root / "reference")
    save_tiny_llama(root / "policy", perturb=PERTURB)
    return root


@pytest.fixture(scope="module")
def recipe(models: Path) -> DictConfig:
    """The one config both backends run: the paper's recipe with the test's sizes."""
    return compose_config("exp/SEAL.yaml", [
        *model_overrides(models / "policy"),
        f"actor_rollout_ref.actor.optim.lr={LR}",
        # A clip that binds (the gradient norm is ~2) and differs from actor.grad_clip (1.0),
        # which verl 0.9.1's engine does not read: both backends must clip at this one.
        "actor_rollout_ref.actor.optim.clip_grad=0.5",
        # One group of N episodes = one mini-batch = one optimizer step, one sequence per
        # micro-batch (the recipe's ppo_micro_batch_size_per_gpu=1; the local backend's only way).
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "data.train_batch_size=1", "trainer.n_gpus_per_node=1",  # one worker, in this process
        f"seal.tasks.train_ids=[{TASK}]", "seal.tasks.val_ids=[multi_turn_base_10]",
        "seal.tasks.max_prompt_tokens=null",
        # fp32 on the local side too (adapt_to_cpu gives verl's FSDP fp32 parameters and reductions).
        "seal.local.device=cpu", "seal.local.autocast=none",
        "seal.local.tensorboard=false", "seal.local.progress_bars=false",
    ])


@pytest.fixture(scope="module")
def episodes() -> Episodes:
    return record_episodes()


def changed(cfg: DictConfig, change: str | None) -> DictConfig:
    """``cfg`` with one of :data:`CHANGES` applied (``None``: as composed)."""
    if change is None:
        return cfg
    key, value = CHANGES[change]
    out = copy.deepcopy(cfg)
    OmegaConf.update(out, key, value, merge=False)
    return out


@pytest.fixture(scope="module")
def step(recipe: DictConfig, models: Path, episodes: Episodes, cpu_verl: None, tokenizer: Any,
         tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str | None], UpdateResult]:
    """``step(side, change)``: that backend's step on the recipe with ``change`` applied, run
    once per module (a change on both sides is another setting of the same algorithm; on one
    side, a sabotage)."""
    done: dict[tuple[str, str | None], UpdateResult] = {}

    def run(side: str, change: str | None) -> UpdateResult:
        if (side, change) not in done:
            cfg, where = changed(recipe, change), tmp_path_factory.mktemp(f"{side}_{change}")
            done[side, change] = (local_step(cfg, models, episodes, where, tokenizer) if side == "local"
                                  else verl_step(cfg, models, episodes, where))
        return done[side, change]

    return run


# ---------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("change", [None, *CHANGES])
def test_one_update_is_the_same_on_both_backends(change: str | None, step: Callable, models: Path,
                                                 episodes: Episodes) -> None:
    """The recipe, and the recipe with another loss aggregation or KL coefficient on both sides."""
    local, verl = step("local", change), step("verl", change)
    logger.info("both %s: %s", change or "as composed", differences(local, verl))
    assert mismatches(local, verl) == [], differences(local, verl)
    # Not a vacuous comparison: advantages of both signs, rescaled by A-Patch, the KL term in the
    # loss, and held-out log-probs moved by the update far beyond the tolerance.
    assert local.advantages.shape[0] == N - 1
    assert bool((local.advantages > 0).any()) and bool((local.advantages < 0).any())
    assert local.metrics["seal/apatch/scaled_count"] == verl.metrics["seal/apatch/scaled_count"] == N - 1
    assert local.metrics["actor/kl_loss"] > 0.01
    [before] = hf_response_logprobs(load_tiny_llama(models / "policy"), [episodes.held_out_prompt],
                                    [episodes.held_out_response])
    assert float((local.held_out - before).abs().max()) > 1000 * LOGPROB_ATOL


@pytest.mark.parametrize(("side", "change"), SABOTAGES)
def test_a_sabotaged_side_no_longer_matches(side: str, change: str, step: Callable) -> None:
    """One side's loss aggregation or KL coefficient changed: the comparison must fail."""
    sabotaged, other = step(side, change), step("verl" if side == "local" else "local", None)
    logger.info("%s %s sabotaged: %s", side, change, differences(sabotaged, other))
    assert mismatches(sabotaged, other), differences(sabotaged, other)
