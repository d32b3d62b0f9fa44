"""One verl actor update moves each response's log-probability with its advantage's sign.

The update runs the way verl's V1 step runs it, minus Ray: the episodes in TransferQueue (put by
verl's agent-loop post-processing), :meth:`SealPPOTrainer._balance_batch` (verl's balance, then
the step rules), verl's ``_compute_old_log_prob``, then :meth:`SealPPOTrainer._update_actor`
(SEAL's step: observe, A-Patch on the advantages in TransferQueue), verl's V1 ``_update_actor``
(mini-batch settings in the batch's ``extra_info``), then verl's own actor worker
(``verl.workers.engine_workers.ActorRolloutRefWorker.update_actor`` -> ``TrainingWorker`` -> the
FSDP engine with ``verl.workers.utils.losses.ppo_loss``), in this process, handed the
``KVBatchMeta`` as verl's worker group hands it: through verl's TransferQueue bridge, which reads
the rows from TransferQueue. The config is the SEAL recipe as the verl backend hands it to the
workers on a CPU without flash-attn (:func:`verl_actor.worker_config`: sdpa, no padding removal,
FSDP2, fp32), with a few test sizes.

The batch is one GRPO group of two multi-turn responses (model turn, tool observation with mask
0, model turn) with advantage +1 on one and -1 on the other, set in TransferQueue on every
response token (where verl's ``_compute_advantage`` would write them) so the loss mask alone keeps
the observations out of training. The same update with the loss fed a flipped advantage sign or
an inverted mask must fail the direction check (:mod:`update_direction`); the sabotaged cases
assert that it does.

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
from verl_actor import (VOCAB, actor_worker, hf_response_logprobs, load_tiny_llama, model_overrides, put_fields,
                        put_group, save_tiny_llama, verl_logprobs, worker_config)
from verl_testkit import episode_fields, make_trainer, padded, read_rows

from seal.config import compose_config
from seal_shared.types import FailureTag

pytest.importorskip("verl")

PROMPT_LEN = 8
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


def multi_turn_group(seed: int = 1) -> tuple[list[int], list[list[int]]]:
    """One prompt and two equal-length multi-turn responses (one GRPO group)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (PROMPT_LEN,), generator=g).tolist()
    responses = torch.randint(3, VOCAB, (2, len(RESPONSE_MASK)), generator=g).tolist()
    return prompt, responses


def put_multi_turn_group(seed: int = 1, step: int = STEP) -> Any:
    """:func:`multi_turn_group` in TransferQueue with the episode runner's records (a pass and a failure)."""
    prompt, responses = multi_turn_group(seed)
    records = [episode_fields("multi_turn_base_3", 1.0, [FailureTag.PASS]),
               episode_fields("multi_turn_base_3", 0.0, [FailureTag.STATE_MISMATCH])]
    return put_group(prompt, responses, [RESPONSE_MASK] * 2, records, step=step)


@pytest.mark.usefixtures("transfer_queue")
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
    trainer = make_trainer(recipe, tmp_path, step=STEP, rollout_n=None)
    trainer.actor_rollout_wg = worker

    metrics: dict = {}
    batch = trainer._balance_batch(put_multi_turn_group(), metrics)  # verl's balance, then the step rules
    before = verl_logprobs(trainer, batch)
    # The worker's log-probs are the model's: the in-process CPU setup computes what it should.
    prompt, responses = multi_turn_group()
    order = [int(k.split("_")[1]) for k in batch.keys]  # the session (response) of each row
    expected = hf_response_logprobs(load_tiny_llama(Path(recipe.actor_rollout_ref.model.path)), [prompt] * 2,
                                    [responses[i] for i in order])
    torch.testing.assert_close(torch.stack(before), torch.stack(expected), atol=1e-5, rtol=1e-5)
    signs = [1.0 if i == 0 else -1.0 for i in order]  # +1 on the passing response, -1 on the other
    # The reference is the old policy; the advantages where verl's _compute_advantage writes them.
    put_fields(batch, ref_log_prob=before, advantages=[torch.full((len(RESPONSE_MASK),), s) for s in signs])

    trainer._update_actor(batch, metrics)
    after = verl_logprobs(trainer, batch)

    assert metrics["seal/apatch/scaled_count"] == 2.0 and "actor/kl_loss" in metrics
    trained = [float(a[0]) for a in read_rows(batch.keys, "advantages")["advantages"]]  # after A-Patch
    assert [a > 0 for a in trained] == [s > 0 for s in signs]
    mask = padded([torch.tensor(RESPONSE_MASK)] * 2, len(RESPONSE_MASK))
    changes = row_changes(torch.stack(before), torch.stack(after), mask, trained)
    assert direction_held(changes) is (sabotage is None), describe(changes)
