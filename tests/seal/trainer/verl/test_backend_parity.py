"""One algorithm, two backends: one update on the local backend and one on verl's actor worker,
from the same weights and the same episodes, agree.

The episodes are recorded ones, replayed token for token: one GRPO group of multi-turn episodes
(model turn, tool observation with mask 0, model turn) of different lengths, rewards and failure
tags, one of them an environment fault. Both backends take them through their own step:

* local: :meth:`LocalTrainer.train_step` with an episode runner that replays them (the step
  rules, GRPO, A-Patch, then ``policy_update``: PPO clip + low_var_kl, AdamW, grad clip);
* verl: the episodes in TransferQueue as verl's agent-loop post-processing puts them, then verl's
  own V1 ``_step_once`` without Ray: :meth:`SealPPOTrainer._balance_batch` (verl's balance, then
  the step rules), the old log-probs from verl's worker, the reference log-probs, verl's
  ``_compute_advantage`` with the SEAL estimator, :meth:`SealPPOTrainer._update_actor` (A-Patch,
  then verl's ``ActorRolloutRefWorker`` in this process: FSDP2 engine, ``ppo_loss``, AdamW). The
  worker is handed each ``KVBatchMeta`` as its Ray worker group hands it, through verl's
  TransferQueue bridge, which reads the rows from TransferQueue and writes the log-probs back.

Both are configured from one composed config (exp/SEAL.yaml with test sizes; the verl side as
the backend prepares it for a CPU: fp32, sdpa, no padding removal). The step is one mini-batch,
one optimizer step, one sequence per micro-batch on both sides. The policy starts off its
reference (a perturbed copy): at the reference the low_var_kl gradient is zero, so the KL
coefficient would not show. verl is given the reference log-probs the local trainer computes for
itself (the same function on the same weights), by a stand-in reference worker group. verl's
balance may reorder the rows: within one mini-batch it only changes the order of a sum.

Checked: the optimizer (AdamW's settings, the gradient clip); the advantages bit for bit;
``actor/pg_loss``, ``actor/kl_loss``, ``actor/loss`` and ``actor/grad_norm`` as each backend reports
them (verl's reduced as its ``_update_actor`` reduces them); the post-update log-probs of a held-out response
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
from verl_actor import (VOCAB, actor_worker, hf_response_logprobs, load_tiny_llama, model_overrides, put_group,
                        save_tiny_llama, verl_logprobs, worker_config)
from verl_testkit import agent_extra_fields, episode_fields, make_trainer, padded, put_outputs, read_rows, run_step

from seal.config import compose_config
from seal.episode import EpisodeResult
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


def put_episodes(episodes: Episodes) -> Any:
    """The recorded episodes in TransferQueue as verl's agent loop puts them (one GRPO group):
    the record in ``extra_fields``, the reward on each last response token, the sampler's
    log-probs (placeholders: verl reads them for its rollout-correction metrics only)."""
    import uuid

    uid = uuid.uuid4().hex
    outs = [(o.model_copy(update={
        "reward_score": EpisodeResult.from_fields(o.extra_fields).reward,
        "response_logprobs": [-0.5 if m else 0.0 for m in o.response_mask],
        "extra_fields": agent_extra_fields(o.extra_fields, 1)}),
        {"uid": uid, "task_id": TASK, "index": TASK, "data_source": TASK.rsplit("_", 1)[0], "rollout_mode": "sample"})
        for o in episodes.outputs]
    return put_outputs(outs, step=1)


class ReferenceWorkers:
    """The reference worker group: each episode's reference log-probs as the local trainer
    computes them for itself (the same function on the same weights), written where verl's worker
    writes them: ``log_probs`` over the whole sequence, each response token's at the position
    that predicts it."""

    def __init__(self, models: Path, episodes: Episodes) -> None:
        outs = episodes.outputs
        logprobs = hf_response_logprobs(load_tiny_llama(models / "reference"), [o.prompt_ids for o in outs],
                                        [o.response_ids for o in outs])
        self.by_response = {tuple(o.response_ids): lp for o, lp in zip(outs, logprobs)}

    def compute_ref_log_prob(self, batch: Any) -> Any:
        from verl_actor import put_fields

        rows = read_rows(batch.keys, "prompts", "responses", partition=batch.partition_id)
        values = []
        for prompt, response in zip(rows["prompts"], rows["responses"]):
            full = torch.zeros(len(prompt) + len(response))
            full[len(prompt) - 1: len(prompt) - 1 + len(response)] = self.by_response[tuple(response.tolist())]
            values.append(full)
        put_fields(batch, log_probs=values)
        return batch


def verl_step(cfg: DictConfig, models: Path, episodes: Episodes, root: Path) -> UpdateResult:
    """The verl backend's first training step on the same episodes, verl's worker in-process."""
    config = worker_config(cfg, root)
    trainer = make_trainer(config, root / "exp", step=1, rollout_n=None)
    trainer.actor_rollout_wg = worker = actor_worker(config)
    trainer.ref_policy_wg = ReferenceWorkers(models, episodes)
    engine = worker.actor.engine
    optimizer = optimizer_settings(engine.optimizer, engine.optimizer_config.clip_grad)
    batch = put_episodes(episodes)
    _, metrics = run_step(trainer, batch)  # verl's _step_once: the SEAL seams and verl's own code
    assert metrics["seal/excluded_episodes"] == 1.0

    # The trained rows' advantages after A-Patch (as the update read them), cut to the local width.
    rows = read_rows(batch.keys, "advantages", "response_mask")
    kept = [bool(m.any()) for m in rows["response_mask"]]
    assert not any(a.any() for a, k in zip(rows["advantages"], kept) if not k)
    width = max(len(o.response_ids) for o, k in zip(episodes.outputs, kept) if k)
    advantages = padded([a for a, k in zip(rows["advantages"], kept) if k], width)
    held = put_group(episodes.held_out_prompt, [episodes.held_out_response], [[1] * len(episodes.held_out_response)],
                     [episode_fields(TASK, 0.0, [])])
    [held_out] = verl_logprobs(trainer, held)
    return UpdateResult(advantages, metrics, held_out, optimizer)


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
def step(recipe: DictConfig, models: Path, episodes: Episodes, cpu_verl: None, transfer_queue: None, tokenizer: Any,
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
