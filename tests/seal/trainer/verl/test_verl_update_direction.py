"""One verl actor update moves each response's log-probability with its advantage's sign.

The update runs the way ``fit()`` runs it, minus Ray: :meth:`SealRayPPOTrainer._update_actor`
(SEAL's step: observe, A-Patch on the advantages), verl's ``RayPPOTrainer._update_actor``
(padding removal, mini-batch settings), then verl's own actor worker
(``verl.workers.engine_workers.ActorRolloutRefWorker.update_actor`` -> ``TrainingWorker`` -> the
FSDP engine with ``verl.workers.utils.losses.ppo_loss``), in this process, on a tiny random
Llama. verl 0.9.1 has no ``DataParallelPPOActor``: this worker is its actor update. The config
is the SEAL recipe as the verl backend hands it to the workers on a CPU without flash-attn
(:func:`verl_actor.worker_config`: sdpa, no padding removal, FSDP2, fp32), with a few test sizes.

The batch is one GRPO group of two multi-turn responses (model turn, tool observation with mask
0, model turn) with advantage +1 on one and -1 on the other, set on every response token so the
loss mask alone keeps the observations out of training. The same update with the loss fed a
flipped advantage sign or an inverted mask must fail the direction check
(:mod:`update_direction`); the sabotaged cases assert that it does.

verl's worker runs in this process on the project's CPU platform
(:func:`seal.trainer.verl.cpu.in_process`: the platform, a one-process gloo group, verl's FSDP
engine registered for ``cpu``). The reference policy's log-probs are the old policy's: before the
first update the policy is the reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from update_direction import SABOTAGES, describe, direction_held, row_changes, sabotaged
from verl_actor import (VOCAB, actor_worker, hf_response_logprobs, load_tiny_llama, model_overrides, object_column,
                        padded_batch, save_tiny_llama, worker_config)
from verl_testkit import episode_fields, make_trainer

from seal.config import compose_config
from seal.episode import FIELD_NAMES
from seal_shared.types import FailureTag

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402

PROMPT_LEN, PROMPT_PAD = 8, 2  # left padding, as verl's batches have
RESPONSE_MASK = [1] * 6 + [0] * 5 + [1] * 4  # model turn, tool observation, model turn
LR = 1e-2
STEP = 3  # a step where A-Patch rescales rows


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The SEAL recipe as the workers get it on this machine, on a tiny random Llama, with the
    test's sizes."""
    root = tmp_path_factory.mktemp("verl_direction")
    model_dir = save_tiny_llama(root / "model")
    cfg = compose_config("exp/SEAL.yaml", [
        *model_overrides(model_dir),
        f"actor_rollout_ref.actor.optim.lr={LR}",
        # One group of 2 responses = one mini-batch = one optimizer step (2 micro-batches of 1).
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "trainer.n_gpus_per_node=1",  # the one gloo process below
    ])
    return worker_config(cfg, root)


def multi_turn_group(seed: int = 1) -> DataProto:
    """Two responses to one prompt (one GRPO group) as ``fit()`` holds them before the old
    log-probs: left-padded prompts, equal-length responses, the episode runner's record columns.
    Advantages +1 / -1 on every response token."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (PROMPT_LEN + PROMPT_PAD,), generator=g)[PROMPT_PAD:].tolist()
    responses = torch.randint(3, VOCAB, (2, len(RESPONSE_MASK)), generator=g).tolist()
    tensors = padded_batch([prompt] * 2, responses, [RESPONSE_MASK] * 2, prompt_pad=PROMPT_PAD, response_pad=0)
    advantages = torch.tensor([[1.0], [-1.0]]).expand(2, len(RESPONSE_MASK)).clone()
    records = [episode_fields("multi_turn_base_3", 1.0, [FailureTag.PASS]),
               episode_fields("multi_turn_base_3", 0.0, [FailureTag.STATE_MISMATCH])]
    return DataProto.from_single_dict({
        **tensors, "advantages": advantages, "returns": advantages.clone(),
        "token_level_rewards": torch.zeros_like(advantages), "uid": object_column(["g0", "g0"]),
        **{name: object_column([r[name] for r in records]) for name in FIELD_NAMES},
    }, meta_info={"temperature": 1.0, "global_token_num": tensors["attention_mask"].sum(dim=1).tolist()})


def hf_logprobs_of(model_dir: str, batch: DataProto) -> torch.Tensor:
    """The responses' log-probs from a plain transformers forward of the saved model."""
    prompts = [p[PROMPT_PAD:].tolist() for p in batch.batch["prompts"]]
    responses = [r.tolist() for r in batch.batch["responses"]]
    return torch.stack(hf_response_logprobs(load_tiny_llama(Path(model_dir)), prompts, responses))


@pytest.mark.parametrize("sabotage", SABOTAGES)
def test_one_verl_update_follows_the_advantage_sign(sabotage: str | None, cpu_verl: None, recipe: Any,
                                                    tmp_path: Path) -> None:
    """+1 raises the model-written tokens' log-probs, -1 lowers them, the observations move
    less; with the loss's advantage sign or mask flipped (``sabotage``) that no longer holds."""
    def sabotaged_loss(ppo_loss: Any) -> Any:
        def loss(model_output: Any, data: Any, dp_group: Any = None) -> Any:
            data["advantages"], data["response_mask"] = sabotaged(data["advantages"], data["response_mask"], sabotage)
            return ppo_loss(model_output=model_output, data=data, dp_group=dp_group)
        return loss

    worker = actor_worker(recipe, sabotaged_loss)
    actor_config = worker.loss_fn.keywords["config"]  # verl's own loss and its config, under the wrapper
    assert actor_config.use_kl_loss and actor_config.kl_loss_type == "low_var_kl"
    trainer = make_trainer(recipe, tmp_path, step=STEP)
    trainer.actor_rollout_wg = worker

    batch = multi_turn_group()
    old, _ = trainer._compute_old_log_prob(batch)
    before = old.batch["old_log_probs"]
    # The worker's log-probs are the model's: the in-process CPU setup computes what it should.
    torch.testing.assert_close(before, hf_logprobs_of(recipe.actor_rollout_ref.model.path, batch),
                               atol=1e-5, rtol=1e-5)
    batch = batch.union(old)
    batch.batch["ref_log_prob"] = before.clone()  # the policy is the reference before its first update

    out = trainer._update_actor(batch)
    after = trainer._compute_old_log_prob(batch)[0].batch["old_log_probs"]

    metrics = out.meta_info["metrics"]
    assert metrics["seal/apatch/scaled_count"] == 2.0 and "actor/kl_loss" in metrics
    trained_advantages = batch.batch["advantages"][:, 0].tolist()  # after A-Patch
    assert trained_advantages[0] > 0 > trained_advantages[1]
    changes = row_changes(before, after, batch.batch["response_mask"], trained_advantages)
    assert direction_held(changes) is (sabotage is None), describe(changes)
